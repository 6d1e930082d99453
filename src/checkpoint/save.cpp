// Saving: sharded (each shard rank of the first replica writes its own file, no collective while
// writing) and full (units gathered one at a time, rank 0 streams them into one file). Both write to
// a temporary directory, and rank 0 publishes it (rename, then DONE) after a barrier.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fault.hpp"
#include "paths.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/log.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

std::string rank_file_name(int shard_rank) { return fmt::format("rank_{:05}.h5", shard_rank); }

StateDictType parse_state_dict_type(std::string_view t) {
  if (t == "SHARDED_STATE_DICT" || t == "sharded" || t == "LOCAL_STATE_DICT") return StateDictType::Sharded;
  if (t == "FULL_STATE_DICT" || t == "full") return StateDictType::Full;
  throw ConfigError(fmt::format("state_dict_type: unknown type '{}' (expected SHARDED_STATE_DICT or FULL_STATE_DICT)", t));
}

const char* state_dict_type_name(StateDictType t) { return t == StateDictType::Full ? "FULL_STATE_DICT" : "SHARDED_STATE_DICT"; }

namespace {

hdf5::DatasetOptions checksummed(size_t n) {
  return {std::max<size_t>(1, std::min<size_t>(n, size_t{1} << 20)), hdf5::Checksum::Fletcher32};
}

std::vector<float> to_host(const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  copy_async(out.data(), p, out.size() * sizeof(float), {});
  stream_synchronize({});
  return out;
}

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
  f.close();
  fsync_path(path);
}

// One file per shard rank: every unit's param, exp_avg and exp_avg_sq slices, and which element
// ranges of which parameters they hold.
void write_rank_file(const std::string& path, fsdp::FsdpEngine& engine, const optim::AdamW& adamw, int64_t step) {
  const model::ModelSpec& spec = engine.model_spec();
  hdf5::Handle f = hdf5::create_file(path);
  hdf5::set_attr(f, "format", kFormatName);
  hdf5::set_attr(f, "format_version", kFormatVersion);
  hdf5::set_attr(f, "step", step);
  hdf5::set_attr(f, "shard_rank", int64_t{engine.mesh().coord().shard});
  hdf5::Handle units = hdf5::create_group(f, "units");
  for (size_t i = 0; i < engine.shards().size(); ++i) {
    const fsdp::ShardView& v = engine.shards()[i];
    const fsdp::FlatLayout& layout = engine.layout(v.unit);
    hdf5::Handle g = hdf5::create_group(units, fmt::format("{:04}", v.unit));
    const auto n = static_cast<size_t>(v.numel);
    hdf5::write_f32(g, "param", to_host(v.param, v.numel), checksummed(n));
    std::vector<float> state(n);  // host or device states alike, through one host buffer
    adamw.read_state(i, optim::OptimState::ExpAvg, state);
    hdf5::write_f32(g, "exp_avg", state, checksummed(n));
    adamw.read_state(i, optim::OptimState::ExpAvgSq, state);
    hdf5::write_f32(g, "exp_avg_sq", state, checksummed(n));
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
    hdf5::set_attr(g, "name", engine.units()[static_cast<size_t>(v.unit)].name);
    hdf5::set_attr(g, "padded_numel", layout.padded_numel);
    hdf5::set_attr(g, "shard_begin", v.flat_begin);
    hdf5::set_attr(g, "shard_numel", v.numel);
    hdf5::set_attr(g, "params", params.dump());
  }
  units.close();
  f.close();
  fsync_path(path);
}

std::string done_text(int64_t step, StateDictType type, const std::vector<std::string>& files) {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  return nlohmann::json{{"step", step}, {"type", state_dict_type_name(type)}, {"files", files}, {"time", now}}.dump() + "\n";
}

// Agrees on whether to save at all: an existing complete checkpoint of this step is never touched.
bool already_saved(const std::string& final_dir, MPI_Comm world) {
  int complete = is_complete(final_dir) ? 1 : 0;
  ST_CHECK_MPI(MPI_Bcast(&complete, 1, MPI_INT, 0, world));
  if (complete) log::info("checkpoint: {} is already complete, not saving it again", final_dir);
  return complete != 0;
}

void barrier(MPI_Comm world) { ST_CHECK_MPI(MPI_Barrier(world)); }

// Rank 0 creates the temporary directory; everyone learns whether that worked.
std::string make_temporary(const std::string& final_dir, MPI_Comm world, int rank) {
  std::string err;
  std::string tmp = final_dir + ".tmp";
  if (rank == 0) {
    try {
      tmp = prepare_temporary(final_dir);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  int failed = err.empty() ? 0 : 1;
  ST_CHECK_MPI(MPI_Bcast(&failed, 1, MPI_INT, 0, world));
  if (failed) throw IoError(rank == 0 ? err : fmt::format("{}: rank 0 could not create the checkpoint directory", tmp));
  return tmp;
}

}  // namespace

CheckpointFault checkpoint_fault_from_env() {
  CheckpointFault f;
  const char* v = std::getenv("SHARDTRAIN_CHECKPOINT_FAULT");
  if (!v) return f;
  const std::string s(v);
  try {
    if (s == "fail_write") {
      f.fail_write = true;
    } else if (s.rfind("stall_before_publish:", 0) == 0) {
      const std::string arg = s.substr(21);
      const size_t at = arg.find('@');
      f.stall_before_publish = std::stod(arg.substr(0, at));
      if (at != std::string::npos) f.only_step = std::stoll(arg.substr(at + 1));
    } else {
      throw std::invalid_argument(s);
    }
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("SHARDTRAIN_CHECKPOINT_FAULT='{}': expected fail_write or stall_before_publish:SECONDS[@STEP]", s));
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

SaveScope begin_save(fsdp::FsdpEngine& engine, const std::string& dir, int64_t step) {
  SaveScope s;
  s.world = engine.mesh().world_comm();
  ST_CHECK_MPI(MPI_Comm_rank(s.world, &s.rank));
  s.final_dir = (fs::path(dir) / step_dir_name(step)).string();
  s.skip = already_saved(s.final_dir, s.world);
  if (!s.skip) s.tmp = make_temporary(s.final_dir, s.world, s.rank);
  return s;
}

void finish_save(const SaveScope& s, fsdp::FsdpEngine& engine, StateDictType type, const SaveMeta& meta,
                 const std::vector<std::string>& files, int64_t optimizer_steps, const std::string& dir, int keep_last) {
  barrier(s.world);  // every file is written
  const CheckpointFault fault = checkpoint_fault_from_env();
  if (fault.stall_before_publish > 0 && (fault.only_step < 0 || fault.only_step == meta.step))
    std::this_thread::sleep_for(std::chrono::duration<double>(fault.stall_before_publish));
  if (s.rank == 0) {
    write_index(s.tmp, engine, type, meta, files, optimizer_steps);
    publish(s.tmp, s.final_dir, done_text(meta.step, type, files));
    rotate(dir, keep_last, s.final_dir);
    log::info("checkpoint: saved {} ({}, {} files) in {:.2f} s", s.final_dir, state_dict_type_name(type), files.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - s.start).count());
  }
  barrier(s.world);
}

}  // namespace

std::string save_sharded(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                         int keep_last) {
  const SaveScope scope = begin_save(engine, dir, meta.step);
  if (scope.skip) return scope.final_dir;
  const DeviceMesh& mesh = engine.mesh();
  std::vector<std::string> files;
  for (int s = 0; s < mesh.shard_size(); ++s) files.push_back(rank_file_name(s));
  if (mesh.coord().replicate == 0) {  // replicas hold identical shards: the first one writes
    const std::string path = (fs::path(scope.tmp) / rank_file_name(mesh.coord().shard)).string();
    if (checkpoint_fault_from_env().fail_write) {
      throw IoError(fmt::format("{}: write failed (injected by SHARDTRAIN_CHECKPOINT_FAULT)", path));
    }
    write_rank_file(path, engine, adamw, meta.step);
  }
  finish_save(scope, engine, StateDictType::Sharded, meta, files, adamw.steps(), dir, keep_last);
  return scope.final_dir;
}

std::string save_full(fsdp::FsdpEngine& engine, const std::string& dir, const SaveMeta& meta, int keep_last) {
  const SaveScope scope = begin_save(engine, dir, meta.step);
  if (scope.skip) return scope.final_dir;
  const DeviceMesh& mesh = engine.mesh();
  const model::ModelSpec& spec = engine.model_spec();
  const std::string path = (fs::path(scope.tmp) / kFullFile).string();
  hdf5::Handle f;
  if (scope.rank == 0) f = hdf5::create_file(path);
  // Unit by unit: the first replica's shard group gathers one unit (every member takes part, nobody
  // idles in a long wait), rank 0 writes its parameters, and the buffer is dropped before the next.
  if (mesh.coord().replicate == 0) {
    for (size_t u = 0; u < engine.units().size(); ++u) {
      const std::vector<float> full = engine.gather_unit(static_cast<int>(u));
      if (scope.rank != 0) continue;
      for (const fsdp::FlatEntry& e : engine.layout(static_cast<int>(u)).entries) {
        const model::ParamInfo& p = spec.param(e.param);
        const auto first = full.begin() + e.offset;
        hdf5::write_f32(f, p.name, std::span<const float>(&*first, static_cast<size_t>(e.numel)),
                        checksummed(static_cast<size_t>(e.numel)));
        hdf5::set_attr(f, "shape", nlohmann::json(p.shape).dump(), p.name);
      }
    }
  }
  if (scope.rank == 0) {
    f.close();
    fsync_path(path);
  }
  finish_save(scope, engine, StateDictType::Full, meta, {kFullFile}, 0, dir, keep_last);
  return scope.final_dir;
}

}  // namespace shardtrain::checkpoint
