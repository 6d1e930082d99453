// Saving: sharded (each shard rank of the first replica writes its own file, no collective while
// writing) and full (units gathered one at a time, rank 0 streams them into one file). Both write to
// a temporary directory, and rank 0 publishes it (rename, then DONE) after a barrier.
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fault.hpp"
#include "paths.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/runtime/session.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

std::string rank_file_name(int shard_rank) { return fmt::format("rank_{:05}.h5", shard_rank); }

StateDictType parse_state_dict_type(std::string_view t) {
  if (t == "SHARDED_STATE_DICT" || t == "sharded" || t == "LOCAL_STATE_DICT") return StateDictType::Sharded;
  if (t == "FULL_STATE_DICT" || t == "full") return StateDictType::Full;
  throw ConfigError(fmt::format("state_dict_type: unknown type '{}' (expected SHARDED_STATE_DICT or FULL_STATE_DICT)", t));
}

const char* state_dict_type_name(StateDictType t) {
  return t == StateDictType::Full ? "FULL_STATE_DICT" : "SHARDED_STATE_DICT";
}

namespace {

hdf5::DatasetOptions checksummed(size_t n) {
  return {std::max<size_t>(1, std::min<size_t>(n, size_t{1} << 20)), hdf5::Checksum::Fletcher32};
}

// What ties a save's files together: the name of its temporary directory (step_N.tmp-<pid>-<random>, created
// exclusively), written into the index and every data file. A rank file copied in from another checkpoint of the same
// step (another run's, or an earlier save's) then shows; the step alone told them apart only across steps.
std::string save_id_of(const std::string& tmp) { return fs::path(tmp).filename().string(); }

nlohmann::json tensor_list(const model::ModelSpec& spec) {
  nlohmann::json t = nlohmann::json::array();
  for (const model::ParamInfo& p : spec.params()) t.push_back({{"name", p.name}, {"shape", p.shape}});
  return t;
}

// The index: everything but the tensors. Written by rank 0 into the temporary directory.
void write_index(const std::string& tmp, fsdp::FsdpEngine& engine, StateDictType type, const SaveMeta& meta,
                 const std::vector<std::string>& files, int64_t optimizer_steps) {
  const std::string path = (fs::path(tmp) / kIndexFile).string();
  hdf5::Handle f = hdf5::create_file(path);
  const DeviceMesh& mesh = engine.mesh();
  hdf5::set_attr(f, "format", kFormatName);
  hdf5::set_attr(f, "format_version", kFormatVersion);
  hdf5::set_attr(f, "type", state_dict_type_name(type));
  hdf5::set_attr(f, "step", meta.step);
  hdf5::set_attr(f, "save_id", save_id_of(tmp));
  hdf5::set_attr(f, "world_size", int64_t{mesh.world_size()});
  hdf5::set_attr(f, "replicate_size", int64_t{mesh.replicate_size()});
  hdf5::set_attr(f, "shard_size", int64_t{mesh.shard_size()});
  hdf5::set_attr(f, "strategy", sharding_strategy_name(mesh.strategy()));
  hdf5::set_attr(f, "wrap_policy", fsdp::wrap_policy_name(engine.config().wrap.policy));
  hdf5::set_attr(f, "files", nlohmann::json(files).dump());
  hdf5::set_attr(f, "tensors", tensor_list(engine.model_spec()).dump());
  hdf5::set_attr(f, "model_config", model_config_to_json(engine.model_spec().config()));
  hdf5::set_attr(f, "trainer_state", meta.trainer_state);
  hdf5::set_attr(f, "config", meta.config_toml);
  hdf5::set_attr(f, "tokenizer", meta.tokenizer);
  hdf5::set_attr(f, "optimizer_steps", optimizer_steps);
  hdf5::record_metadata_checksums(f);
  f.close();
  fsync_path(path);
}

// One unit's part of a rank file, copied out of the engine and the optimizer: its param, exp_avg and
// exp_avg_sq slices, and which element ranges of which parameters they hold.
struct UnitSnapshot {
  int unit = 0;
  std::string name, params;
  int64_t padded_numel = 0, shard_begin = 0, shard_numel = 0;
  std::vector<float> param, exp_avg, exp_avg_sq;
};

// Copies unit i into u, reusing u's buffers (an asynchronous save keeps them from one save to the next, so
// later snapshots copy into memory that is already mapped).
void snapshot_unit(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, size_t i, UnitSnapshot& u) {
  const model::ModelSpec& spec = engine.model_spec();
  const fsdp::ShardView& v = engine.shards()[i];
  u.unit = v.unit;
  u.name = engine.units()[static_cast<size_t>(v.unit)].name;
  u.padded_numel = engine.layout(v.unit).padded_numel;
  u.shard_begin = v.flat_begin;
  u.shard_numel = v.numel;
  const auto n = static_cast<size_t>(v.numel);
  u.param.resize(n);
  copy_async(u.param.data(), v.param, n * sizeof(float), {});
  stream_synchronize({});
  u.exp_avg.resize(n);  // host or device states alike, through host buffers
  adamw.read_state(i, optim::OptimState::ExpAvg, u.exp_avg);
  u.exp_avg_sq.resize(n);
  adamw.read_state(i, optim::OptimState::ExpAvgSq, u.exp_avg_sq);
  nlohmann::json params = nlohmann::json::array();
  for (const fsdp::ParamRange& r : v.ranges) {
    const model::ParamInfo& p = spec.param(r.param);
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"numel", p.numel},
                      {"begin", r.param_offset},
                      {"end", r.param_offset + (r.end - r.begin)},
                      {"file_offset", r.begin}});
  }
  u.params = params.dump();
}

// A rank file being written: the header on open, then units one at a time, then close and fsync.
class RankFileWriter {
 public:
  RankFileWriter(const std::string& path, int64_t step, int64_t shard_rank) : path_(path), file_(hdf5::create_file(path)) {
    hdf5::set_attr(file_, "format", kFormatName);
    hdf5::set_attr(file_, "format_version", kFormatVersion);
    hdf5::set_attr(file_, "step", step);
    hdf5::set_attr(file_, "save_id", save_id_of(fs::path(path).parent_path().string()));
    hdf5::set_attr(file_, "shard_rank", shard_rank);
    units_ = hdf5::create_group(file_, "units");
  }
  void write(const UnitSnapshot& u) {
    hdf5::Handle g = hdf5::create_group(units_, fmt::format("{:04}", u.unit));
    const auto n = static_cast<size_t>(u.shard_numel);
    hdf5::write_f32(g, "param", u.param, checksummed(n));
    hdf5::write_f32(g, "exp_avg", u.exp_avg, checksummed(n));
    hdf5::write_f32(g, "exp_avg_sq", u.exp_avg_sq, checksummed(n));
    hdf5::set_attr(g, "name", u.name);
    hdf5::set_attr(g, "padded_numel", u.padded_numel);
    hdf5::set_attr(g, "shard_begin", u.shard_begin);
    hdf5::set_attr(g, "shard_numel", u.shard_numel);
    hdf5::set_attr(g, "params", u.params);
  }
  void close() {
    units_.close();
    hdf5::record_metadata_checksums(file_);
    file_.close();
    fsync_path(path_);
  }

 private:
  std::string path_;
  hdf5::Handle file_, units_;
};

// A synchronous save streams: one unit's copies at a time.
void write_rank_file(const std::string& path, fsdp::FsdpEngine& engine, const optim::AdamW& adamw, int64_t step) {
  RankFileWriter w(path, step, engine.mesh().coord().shard);
  UnitSnapshot u;
  for (size_t i = 0; i < engine.shards().size(); ++i) {
    snapshot_unit(engine, adamw, i, u);
    w.write(u);
  }
  w.close();
}

std::string done_text(int64_t step, StateDictType type, const std::vector<std::string>& files, Health health) {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  return nlohmann::json{{"step", step},
                        {"type", state_dict_type_name(type)},
                        {"files", files},
                        {"time", now},
                        {"healthy", health == Health::Healthy}}
             .dump() +
         "\n";
}

// Agrees on whether to save at all: an existing complete checkpoint of this step is never touched. Said as a
// warning: this run's state at the step is then not saved (a run refuses to start beside checkpoints it did not
// resume from, so this is a checkpoint saved before a rollback went further back, or put there by hand).
bool already_saved(const std::string& final_dir, MPI_Comm world, int rank) {
  int complete = rank == 0 && is_complete(final_dir) ? 1 : 0;
  ST_CHECK_MPI(MPI_Bcast(&complete, 1, MPI_INT, 0, world));
  if (complete && rank == 0)
    log::warn("checkpoint: {} exists and is complete: it is left as it is, and this step's state is not saved", final_dir);
  return complete != 0;
}

// The file system's reason for a failed write, when HDF5's message lacks it: HDF5 names the call that failed, the
// kernel's errno says why (No space left on device, Disk quota exceeded, File too large), which exit code 8 promises.
std::string with_reason(std::string message, int err, const std::string& dir) {
  if (err == ENOSPC || err == EDQUOT || err == EFBIG || err == EROFS || err == EIO) {
    const std::string why = std::strerror(err);
    if (message.find(why) == std::string::npos) message += fmt::format(" ({})", why);
    return message;
  }
  try {
    if (available_bytes(dir) == 0 && message.find(std::strerror(ENOSPC)) == std::string::npos)
      message += fmt::format(" ({}: 0 bytes free in {})", std::strerror(ENOSPC), dir);
  } catch (const Error&) {
  }
  return message;
}

void barrier(MPI_Comm world) { ST_CHECK_MPI(MPI_Barrier(world)); }

// Rank 0 creates the temporary directory, under a name of this save's own (rank 0's pid and a random number: two
// runs, or two hosts, never pick the same one), and every rank learns it, or rank 0's error.
std::string make_temporary(const std::string& final_dir, MPI_Comm world, int rank) {
  std::string payload;
  if (rank == 0) {
    try {
      std::random_device random;
      payload = "D" + prepare_temporary(final_dir, fmt::format("{}-{:08x}", ::getpid(), random()));
    } catch (const Error& e) {
      payload = "E" + std::string(e.what());
    }
  }
  payload = broadcast_text(world, 0, std::move(payload));
  if (payload[0] == 'E')
    throw IoError(rank == 0 ? payload.substr(1)
                            : fmt::format("{}: rank 0 could not create the checkpoint directory", final_dir));
  return payload.substr(1);
}

}  // namespace

CheckpointFault checkpoint_fault_from_env() {
  CheckpointFault f;
  const char* v = std::getenv("SHARDTRAIN_CHECKPOINT_FAULT");
  if (!v || !*v) return f;  // unset or empty: no fault
  const std::string s(v);
  try {
    if (s == "fail_write") {
      f.fail_write = true;
    } else if (s.rfind("stall_before_publish:", 0) == 0 || s.rfind("slow_write:", 0) == 0) {
      const bool stall = s[1] == 't';
      const std::string arg = s.substr(stall ? 21 : 11);
      const size_t at = arg.find('@');
      (stall ? f.stall_before_publish : f.slow_write) = std::stod(arg.substr(0, at));
      if (at != std::string::npos) f.only_step = std::stoll(arg.substr(at + 1));
    } else {
      throw std::invalid_argument(s);
    }
  } catch (const std::exception&) {
    throw UsageError(  // as SHARDTRAIN_FAULT's: an environment variable of the command line's, not the config's
        fmt::format("SHARDTRAIN_CHECKPOINT_FAULT='{}': expected fail_write, stall_before_publish:SECONDS[@STEP] "
                    "or slow_write:SECONDS[@STEP]",
                    s));
  }
  return f;
}

namespace {

// What both kinds of save share: agreeing on whether to save, the temporary directory, and the
// publication by rank 0 after every writer is done.
struct SaveScope {
  MPI_Comm world = MPI_COMM_NULL;
  int rank = 0;
  std::string final_dir, tmp;
  bool skip = false;  // a complete checkpoint of this step exists
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

// Collective: whether any rank failed (`error` not empty there). If one did, every rank throws the same IoError,
// the lowest failing rank's message, after rank 0 removed the save's temporary directory (and a final one
// left without DONE), so the space goes back and no rank ends the job on its own with a message the others lack.
void agree(const SaveScope& s, const std::string& error) {
  int v[2] = {error.empty() ? 0 : -1, error.empty() ? INT_MAX : s.rank};
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, s.world));
  if (v[0] == 0) return;
  const int root = v[1];
  const std::string text = broadcast_text(s.world, root, s.rank == root ? error : std::string());
  if (s.rank == 0) {
    if (!s.tmp.empty()) discard(s.tmp);
    // Left without DONE by this save's publication; one holding anything else is not this save's to remove.
    if (fs::exists(s.final_dir) && !is_complete(s.final_dir) && holds_only_save_files(s.final_dir)) discard(s.final_dir);
  }
  barrier(s.world);  // every rank throws after the space went back
  throw IoError(root == 0 ? text : fmt::format("rank {}: {}", root, text));
}

// Every rank agrees on whether to save; rank 0 makes room if it must (make_room), and then every rank that
// writes checks that the whole checkpoint fits where it writes.
SaveScope begin_save(fsdp::FsdpEngine& engine, const std::string& dir, int64_t step, StateDictType type,
                     Retention retention) {
  SaveScope s;
  s.world = engine.mesh().world_comm();
  ST_CHECK_MPI(MPI_Comm_rank(s.world, &s.rank));
  s.final_dir = (fs::path(dir) / step_dir_name(step)).string();
  s.skip = already_saved(s.final_dir, s.world, s.rank);
  if (s.skip) return s;
  const CheckpointSize need = checkpoint_size(engine, type);
  std::string error;
  try {
    if (s.rank == 0 && !space_shortfall(dir, free_space(dir), need).empty()) make_room(dir, retention, need);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(s, error);  // also: rank 0 is done removing before anyone measures
  const bool writes = s.rank == 0 || (type == StateDictType::Sharded && engine.mesh().coord().replicate == 0);
  try {
    const FreeSpace free = writes ? free_space(dir) : FreeSpace{need.bytes, need.inodes, true};
    const std::string keep = retention.keep_last >= 2 ? "older checkpoints that keep_last lets go are removed first"
                                                      : "2 or more lets the save remove the oldest first";
    if (free.bytes < need.bytes)
      error = fmt::format(
          "{}: not enough space for the checkpoint of step {}: {} free, it takes {} ({}; checkpoint.keep_last {})", dir,
          step, format_bytes(free.bytes), format_bytes(need.bytes), state_dict_type_name(type), keep);
    else if (free.inodes < need.inodes)  // the save's mkdir or a file's creation would meet ENOSPC
      error = fmt::format(
          "{}: not enough inodes for the checkpoint of step {}: {} free, it takes {} (its {} file(s) and its directory; "
          "{}; checkpoint.keep_last {})",
          dir, step, free.inodes, need.inodes, need.inodes - 1, state_dict_type_name(type), keep);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(s, error);
  s.tmp = make_temporary(s.final_dir, s.world, s.rank);
  return s;
}

void finish_save(const SaveScope& s, fsdp::FsdpEngine& engine, StateDictType type, const SaveMeta& meta,
                 const std::vector<std::string>& files, int64_t optimizer_steps, const std::string& dir, Retention retention,
                 const std::string& write_error, const std::string& note = {}) {
  agree(s, write_error);  // every file is written, on every rank
  const CheckpointFault fault = checkpoint_fault_from_env();
  if (fault.stall_before_publish > 0 && fault.applies_to(meta.step))
    std::this_thread::sleep_for(std::chrono::duration<double>(fault.stall_before_publish));
  std::string error;
  if (s.rank == 0) {
    try {
      write_index(s.tmp, engine, type, meta, files, optimizer_steps);
      publish(s.tmp, s.final_dir, done_text(meta.step, type, files, meta.health));
      rotate(dir, retention, s.final_dir);
      remove_incomplete(dir);
      log::info("checkpoint: saved {} ({}, {} files) in {:.2f} s{}", s.final_dir, state_dict_type_name(type), files.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count(), note);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(s, error);
}

std::vector<std::string> sharded_files(const DeviceMesh& mesh) {
  std::vector<std::string> files;
  for (int s = 0; s < mesh.shard_size(); ++s) files.push_back(rank_file_name(s));
  return files;
}

}  // namespace

std::string save_sharded(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                         Retention retention) {
  const SaveScope scope = begin_save(engine, dir, meta.step, StateDictType::Sharded, retention);
  if (scope.skip) return scope.final_dir;
  const DeviceMesh& mesh = engine.mesh();
  const std::vector<std::string> files = sharded_files(mesh);
  std::string error;
  if (mesh.coord().replicate == 0) {  // replicas hold identical shards: the first one writes
    const std::string path = (fs::path(scope.tmp) / rank_file_name(mesh.coord().shard)).string();
    try {
      const CheckpointFault fault = checkpoint_fault_from_env();
      if (fault.fail_write) throw IoError(fmt::format("{}: write failed (injected by SHARDTRAIN_CHECKPOINT_FAULT)", path));
      if (fault.slow_write > 0 && fault.applies_to(meta.step))
        std::this_thread::sleep_for(std::chrono::duration<double>(fault.slow_write));
      errno = 0;
      write_rank_file(path, engine, adamw, meta.step);
    } catch (const Error& e) {  // HDF5 and file errors; a device error is not the file system's, and ends the job
      if (e.code() != ExitCode::Io) throw;
      error = with_reason(e.what(), errno, dir);
    }
  }
  finish_save(scope, engine, StateDictType::Sharded, meta, files, adamw.steps(), dir, retention, error);
  return scope.final_dir;
}

struct AsyncSave::State {
  fsdp::FsdpEngine* engine = nullptr;
  SaveScope scope;
  SaveMeta meta;
  std::vector<std::string> files;
  int64_t optimizer_steps = 0;
  std::string dir;
  Retention retention;
  bool pending = false;
  double snapshot_seconds = 0;
  std::thread writer;
  std::atomic<bool> written{true};  // this rank's file is written (or it writes none); release-stores `error` first
  std::string error;                // the writer's failure, "" when it succeeded
  std::shared_ptr<std::vector<UnitSnapshot>> units;  // the snapshot, its buffers kept for the next save
};

AsyncSave::AsyncSave() : state_(std::make_unique<State>()) {}

AsyncSave::~AsyncSave() {
  if (state_->writer.joinable()) state_->writer.join();  // an unpublished save stays a .tmp directory
}

bool AsyncSave::pending() const { return state_->pending; }

void AsyncSave::start(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                      Retention retention) {
  if (state_->pending) wait();
  State& st = *state_;
  const auto t0 = std::chrono::steady_clock::now();
  st.scope = begin_save(engine, dir, meta.step, StateDictType::Sharded, retention);
  if (st.scope.skip) return;
  st.engine = &engine;
  st.meta = meta;
  st.files = sharded_files(engine.mesh());
  st.optimizer_steps = adamw.steps();
  st.dir = dir;
  st.retention = retention;
  st.error.clear();
  if (engine.mesh().coord().replicate == 0) {
    // The snapshot: every unit's param and states copied now, so training may change them right after.
    if (!st.units) st.units = std::make_shared<std::vector<UnitSnapshot>>();
    auto units = st.units;  // the previous writer is done with it (joined above)
    units->resize(engine.shards().size());
    for (size_t i = 0; i < engine.shards().size(); ++i) snapshot_unit(engine, adamw, i, (*units)[i]);
    const std::string path = (fs::path(st.scope.tmp) / rank_file_name(engine.mesh().coord().shard)).string();
    const CheckpointFault fault = checkpoint_fault_from_env();  // read here: getenv is not for other threads
    const int64_t step = meta.step, shard = engine.mesh().coord().shard;
    st.written.store(false, std::memory_order_relaxed);
    st.writer = std::thread([&st, units, path, fault, step, shard] {
      // The lowest priority: the writer takes what cores training leaves idle (on a GPU node nearly all of
      // them), instead of slowing the step down on a host whose cores do the math.
      setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
      try {
        if (fault.fail_write) throw IoError(fmt::format("{}: write failed (injected by SHARDTRAIN_CHECKPOINT_FAULT)", path));
        if (fault.slow_write > 0 && fault.applies_to(step))
          std::this_thread::sleep_for(std::chrono::duration<double>(fault.slow_write));
        errno = 0;
        RankFileWriter w(path, step, shard);
        for (const UnitSnapshot& u : *units) w.write(u);
        w.close();
      } catch (const std::exception& e) {
        st.error = with_reason(e.what(), errno, fs::path(path).parent_path().parent_path().string());
      }
      st.written.store(true, std::memory_order_release);
    });
  }
  st.pending = true;
  st.snapshot_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string AsyncSave::poll() {
  State& st = *state_;
  if (!st.pending) return "";
  int written = st.written.load(std::memory_order_acquire) ? 1 : 0;  // every rank's file written (or failed)?
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &written, 1, MPI_INT, MPI_MIN, st.scope.world));
  if (!written) return "";
  if (st.writer.joinable()) st.writer.join();
  st.pending = false;
  finish_save(st.scope, *st.engine, StateDictType::Sharded, st.meta, st.files, st.optimizer_steps, st.dir, st.retention,
              st.error, fmt::format(", asynchronously (training waited {:.3f} s for the snapshot)", st.snapshot_seconds));
  return st.scope.final_dir;
}

std::string AsyncSave::wait() {
  State& st = *state_;
  if (!st.pending) return "";
  if (st.writer.joinable()) st.writer.join();  // then every rank's poll sees its own file written
  return poll();
}

std::string save_full(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                      Retention retention) {
  const SaveScope scope = begin_save(engine, dir, meta.step, StateDictType::Full, retention);
  if (scope.skip) return scope.final_dir;
  const DeviceMesh& mesh = engine.mesh();
  const model::ModelSpec& spec = engine.model_spec();
  const std::string path = (fs::path(scope.tmp) / kFullFile).string();
  std::string error;  // rank 0's: it stops writing but goes on taking part in the gathers
  auto writing = [&](auto&& write) {
    if (scope.rank != 0 || !error.empty()) return;
    try {
      write();
    } catch (const Error& e) {
      if (e.code() != ExitCode::Io) throw;
      error = e.what();
    }
  };
  hdf5::Handle f;
  std::map<std::string, hdf5::Handle> moments;  // kFullOptimizerGroup/exp_avg and /exp_avg_sq
  writing([&] {
    f = hdf5::create_file(path);
    hdf5::set_attr(f, "save_id", save_id_of(scope.tmp));
    const hdf5::Handle optimizer = hdf5::create_group(f, kFullOptimizerGroup);
    for (const char* kind : {"exp_avg", "exp_avg_sq"}) moments[kind] = hdf5::create_group(optimizer, kind);
  });
  // The AdamW shard of each unit (a unit without parameters has none).
  std::map<int, size_t> shard_of;
  for (size_t i = 0; i < engine.shards().size(); ++i) shard_of[engine.shards()[i].unit] = i;
  // Unit by unit: the first replica's shard group gathers one unit (every member takes part, nobody
  // idles in a long wait), rank 0 writes its parameters and AdamW's moments of them (the seed's full state dict holds
  // the optimizer's too: a resume from it continues the run), and the buffers are dropped before the next unit's.
  if (mesh.coord().replicate == 0) {
    for (size_t u = 0; u < engine.units().size(); ++u) {
      const int unit = static_cast<int>(u);
      const auto write_unit = [&](const hdf5::Handle& where, const std::vector<float>& full, bool with_shape) {
        writing([&] {
          for (const fsdp::FlatEntry& e : engine.layout(unit).entries) {
            const model::ParamInfo& p = spec.param(e.param);
            const auto first = full.begin() + e.offset;
            hdf5::write_f32(where, p.name, std::span<const float>(&*first, static_cast<size_t>(e.numel)),
                            checksummed(static_cast<size_t>(e.numel)));
            if (with_shape) hdf5::set_attr(where, "shape", nlohmann::json(p.shape).dump(), p.name);
          }
        });
      };
      write_unit(f, engine.gather_unit(unit), true);
      if (engine.layout(unit).entries.empty()) continue;
      const size_t i = shard_of.at(unit);
      std::vector<float> local(static_cast<size_t>(adamw.numel(i)));
      for (const auto& [kind, state] :
           {std::pair{"exp_avg", optim::OptimState::ExpAvg}, std::pair{"exp_avg_sq", optim::OptimState::ExpAvgSq}}) {
        adamw.read_state(i, state, local);
        write_unit(moments[kind], engine.gather_unit_values(unit, local), false);
      }
    }
  }
  writing([&] {
    moments.clear();
    hdf5::record_metadata_checksums(f);
    f.close();
    fsync_path(path);
  });
  if (!error.empty()) error = with_reason(error, errno, dir);
  if (scope.rank == 0) {  // a failed file is closed before its directory goes
    moments.clear();
    f = hdf5::Handle();
  }
  finish_save(scope, engine, StateDictType::Full, meta, {kFullFile}, adamw.steps(), dir, retention, error);
  return scope.final_dir;
}

}  // namespace shardtrain::checkpoint
