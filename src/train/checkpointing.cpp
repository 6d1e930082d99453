// Resume and periodic saves through the checkpoint layer.
#include "shardtrain/train/checkpointing.hpp"

#include <fmt/format.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/deadline.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/pause.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/runtime/strings.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/preflight.hpp"
#include "shardtrain/train/rank_agreement.hpp"
#include "shardtrain/train/startup.hpp"

namespace shardtrain::train {
namespace {

[[noreturn]] void save_expired(const Deadline::Stretch& s) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0)
    std::this_thread::sleep_for(std::chrono::seconds(5));  // one line, rank 0's, when it fires too (its abort ends us)
  const std::string message = fmt::format(
      "checkpoint: {} has not finished after {:g} s (checkpoint.save_timeout){}: the file system may have stopped "
      "answering; ending the job rather than holding the allocation until its time limit (complete checkpoints are "
      "intact)",
      s.what, s.limit, stopped_note(s.stopped));
  log::error("{}", message);
  failure_record::write(ExitCode::Io, message);
  MpiSession::abort(ExitCode::Io);
}

Deadline::Expire save_expire() {
  return [](const Deadline::Stretch& s) { save_expired(s); };
}

// Ends the whole job when the blocking part of a save outlasts checkpoint.save_timeout: a file system that
// stopped answering would otherwise hold the allocation until its time limit, every rank waiting on the stuck
// one. Armed on every rank; the first to fire ends the job (exit code 8). Time the process spent stopped (Ctrl-Z)
// does not count: the file system did not keep it waiting.
class SaveDeadline {
 public:
  SaveDeadline(double timeout, std::string what) : deadline_(save_expire()) {
    deadline_.begin({std::move(what), timeout, "checkpoint.save_timeout"});
  }

 private:
  Deadline deadline_;
};

// Whether every element of this rank's weight shards is finite (host or device shards alike; device shards are
// read on `stream`, the ops' stream, after the work queued there).
bool shards_finite(const std::vector<fsdp::ShardView>& shards, StreamRef stream) {
  std::vector<float> host;
  for (const fsdp::ShardView& v : shards) {
    const auto n = static_cast<size_t>(v.numel);
    const float* p = v.param;
    if (v.device != DeviceKind::Cpu) {
      host.resize(n);
      copy_async(host.data(), v.param, n * sizeof(float), stream);
      stream_synchronize(stream);
      p = host.data();
    }
    if (!std::all_of(p, p + n, [](float x) { return std::isfinite(x); })) return false;
  }
  return true;
}

// "; runs of this config under RUNS_ROOT with checkpoints: A (step_N), ..." or "" when there are none: the earlier
// runs a `--resume auto` in a new run directory was probably meant to continue.
std::string runs_with_checkpoints(const TrainConfig& config, const std::string& this_run) {
  namespace fs = std::filesystem;
  const std::string prefix = (config.logging.name.empty() ? std::string("run") : config.logging.name) + "-";
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(config.logging.runs_root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path() == fs::path(this_run) || !e.is_directory(ec)) continue;
    const std::string latest = checkpoint::find_latest((e.path() / "checkpoints").string());
    // Quoted for a shell when it needs it: the path is meant to be pasted after --logging.run_dir.
    if (!latest.empty())
      found.push_back(fmt::format("{} ({})", shell_quoted(e.path().string()), fs::path(latest).filename().string()));
  }
  if (found.empty()) return {};
  std::sort(found.begin(), found.end());
  std::string text = fmt::format("; runs of this config under {} with checkpoints:", config.logging.runs_root);
  for (size_t k = found.size() > 3 ? found.size() - 3 : 0; k < found.size(); ++k) text += " " + found[k];
  return text;
}

}  // namespace

CheckpointHooks::CheckpointHooks(const Trainer& trainer) : dir_(checkpoint_dir_for(trainer.config(), trainer.run_dir())) {}

std::string CheckpointHooks::tokenizer_json(const Trainer& trainer) const {
  if (!tokenizer_json_.empty()) return tokenizer_json_;
  const data::DatasetInfo& info = trainer.dataset().info();
  nlohmann::json sources = nlohmann::json::array();
  // train_samples: what the sampler's order is a permutation of; identity: the file's content (size and checksums, no
  // token read): so that a file prepared again at the same path shows on resume (resume_data_change)
  const DataSection& d = trainer.config().data;
  for (const auto& c : trainer.sources())
    sources.push_back(
        {{"path", c.dataset->path()},
         {"weight", c.weight},
         {"train_samples", data::SampleSource(*c.dataset, data::DatasetSplit::Train, d.layout, d.seq_len).num_samples()},
         {"identity", c.dataset->identity()}});
  tokenizer_json_ = json_text(nlohmann::json{{"name", info.tokenizer_name},
                                             {"hash", info.tokenizer_hash},
                                             {"encoding_hash", info.tokenizer_encoding_hash},
                                             {"path", info.tokenizer_path},
                                             {"format", info.tokenizer_format},
                                             {"vocab_size", info.vocab_size},
                                             {"eot_id", info.eot_id ? int64_t{*info.eot_id} : int64_t{-1}},
                                             {"bot_id", info.bot_id ? int64_t{*info.bot_id} : int64_t{-1}},
                                             {"dataset", trainer.dataset().path()},
                                             {"sources", sources}});
  return tokenizer_json_;
}

void CheckpointHooks::report_space(Trainer& trainer) const {
  const auto& c = trainer.config().checkpoint;
  if (c.every_n_steps <= 0 || trainer.runtime().topology().world_rank != 0) return;
  // The function and words of `shardtrain check`'s space line: the two agree for the same world.
  const checkpoint::CheckpointRoom room =
      checkpoint::checkpoint_room(dir_, checkpoint::checkpoint_size(trainer.engine(), c.state_dict_type), c.state_dict_type,
                                  {c.keep_last, c.keep_every});
  using Verdict = checkpoint::CheckpointRoom::Verdict;
  if (room.verdict == Verdict::NotOne) log::warn("checkpoint: {}: saves will fail until there is room", room.text);
  else if (room.verdict == Verdict::WillFail || room.verdict == Verdict::MayFail) log::warn("checkpoint: {}", room.text);
  else log::info("checkpoint: {}", room.text);
}

template <typename Fn>
void CheckpointHooks::periodic(Trainer& trainer, int64_t step, Fn&& fn) {
  try {
    fn();
  } catch (const IoError& e) {
    // The end failed_save gave the run, from a save it waited for inside this one (save_async waits for the previous
    // one): not one more failure. Counted again, it said "5 save(s) in a row failed ... the last: checkpoint: 4 save(s)
    // in a row failed ...".
    if (giving_up_) throw;
    failed_save(trainer, step, e.what());
  }
}

void CheckpointHooks::last_save(Trainer& trainer, SaveCause cause) {
  try {
    save(trainer, cause);
  } catch (const IoError& e) {
    if (giving_up_) throw;
    failed_save(trainer, trainer.state().step, e.what(), cause);
  }
}

void CheckpointHooks::published(const std::string& path) {
  if (path.empty()) return;
  last_saved_ = path;
  failed_saves_ = 0;
}

void CheckpointHooks::failed_save(Trainer& trainer, int64_t step, const std::string& why, SaveCause cause) {
  ++failed_saves_;
  last_saved_step_ = -1;  // a later save of the same step is not "already done"
  const int max = trainer.config().checkpoint.max_failed_saves;
  const std::string newest = checkpoint::find_latest(dir_);
  const std::string keep = newest.empty() ? "there is no checkpoint yet"
                                          : "the newest checkpoint is " + newest + " (--resume auto continues from it)";
  // Every failure is a line of the metrics, the one that ends the run too (the 4th of 4, a final or requested save's).
  trainer.record_event(json_text(nlohmann::json{{"kind", "checkpoint_failed"},
                                                {"step", trainer.state().step},
                                                {"save_step", step},
                                                {"failed_in_a_row", failed_saves_},
                                                {"error", why}}));
  if (cause != SaveCause::Periodic) {
    giving_up_ = true;
    throw IoError(fmt::format("checkpoint: the {} save of step {} failed; {}: {}",
                              cause == SaveCause::Final ? "final" : "requested (a stop signal's)", step, keep, why));
  }
  if (failed_saves_ > max) {
    giving_up_ = true;
    throw IoError(fmt::format("checkpoint: {} save(s) in a row failed (checkpoint.max_failed_saves = {}); {}; the last: {}",
                              failed_saves_, max, keep, why));
  }
  if (trainer.runtime().topology().world_rank == 0) {
    // At the last step nothing trains on: the final save tries once more, and its failure ends the run.
    if (trainer.state().step >= trainer.total_steps())
      log::error("checkpoint: the save of step {} failed; the run's final save tries it once more; {}: {}", step, keep, why);
    else
      log::error(
          "checkpoint: the save of step {} failed, training goes on ({} failed in a row; the run stops at failure {} in a "
          "row, checkpoint.max_failed_saves = {}); {}: {}",
          step, failed_saves_, max + 1, max, keep, why);
  }
}

void CheckpointHooks::on_start(Trainer& trainer) {
  const int rank = trainer.runtime().topology().world_rank;
  StartupWatch* const watch = trainer.startup_watch();
  startup_checkpoint_stage(watch, fmt::format("the checks of checkpoint.dir {}", dir_));
  if (trainer.config().checkpoint.resume.empty()) {
    // A fresh run beside complete checkpoints would skip its saves at their steps, report theirs as its own and rotate
    // its own away in their favour: refused before anything is touched. Rank 0 looks; every rank throws its line.
    const std::string problem =
        lowest_error(trainer.runtime().world(), rank, rank == 0 ? fresh_run_problem(dir_) : std::string());
    if (!problem.empty()) throw on_every_rank(CheckpointError(problem));
  }
  report_space(trainer);
  // What saves killed half-way (or removals cut short) left: only rank 0 touches the directory, and no save of this
  // run is in flight yet. Complete checkpoints are never touched. Not when the run names a checkpoint to resume
  // from (it may be one of them, named to be refused with its reason): the first save cleans up then.
  const std::string& resume_setting = trainer.config().checkpoint.resume;
  if (trainer.runtime().topology().world_rank == 0 && (resume_setting.empty() || resume_setting == "auto"))
    checkpoint::remove_incomplete(dir_);
  resume(trainer);
  if (!resumed_from_.empty() && trainer.config().checkpoint.resume != "auto") set_aside_newer(trainer);
  const auto& c = trainer.config().checkpoint;
  if (resumed_from_.empty() && !c.init_from.empty()) {
    startup_checkpoint_stage(watch, fmt::format("importing checkpoint.init_from {}", c.init_from));
    // Refused as `shardtrain check` refuses it: not weights, another tokenizer's, another model's (preflight.hpp).
    auto source = open_init_from(trainer.config(), &trainer.dataset());
    checkpoint::import_weights(trainer.engine(), *source,
                               c.cpu_ram_efficient_loading ? checkpoint::ImportMode::NodeLeaderReads
                                                           : checkpoint::ImportMode::EveryRankReadsItsSlices);
  }
}

void CheckpointHooks::set_aside_newer(Trainer& trainer) {
  // A run resumed from an older checkpoint than the newest here (a branch after a divergence, say) would have its
  // saves skipped at their steps and rotated away in their favour: they are renamed, never deleted, and said loudly.
  if (trainer.runtime().topology().world_rank != 0) return;
  // From a checkpoint outside the directory, every one here is another line of training, older ones too: the rotation
  // would remove them as this run's own once its saves passed them (keep_last).
  const bool outside = resumes_from_outside(dir_, resumed_from_);
  for (const std::string& path : checkpoints_beside(dir_, trainer.state().step, resumed_from_)) {
    const std::string target = set_aside_superseded(path);
    if (outside)
      log::warn(
          "checkpoint: SET ASIDE {} as {}: this run resumed from {} (step {}), outside checkpoint.dir {}, and its saves "
          "must not mix with a checkpoint it does not continue; nothing was deleted",
          path, target, resumed_from_, trainer.state().step, dir_);
    else
      log::warn(
          "checkpoint: SET ASIDE {} as {}: this run resumed from the older {} (step {}), and its saves must not mix with "
          "a checkpoint it does not continue; nothing was deleted (to continue the newest instead: --resume auto, after "
          "renaming it back)",
          path, target, resumed_from_, trainer.state().step);
    superseded_.push_back({path, target, ""});
    trainer.record_event(json_text(nlohmann::json{{"kind", "checkpoint_set_aside"},
                                                  {"checkpoint", path},
                                                  {"set_aside_as", target},
                                                  {"resumed_from", resumed_from_},
                                                  {"step", trainer.state().step}}));
  }
}

TrainerState CheckpointHooks::load_for_resume(Trainer& trainer, const std::string& path) {
  // The tokens in the dataset must be the ones the checkpoint's model was trained on.
  checkpoint::CheckpointReader reader(path);
  check_resume_tokenizer(reader, trainer.dataset());
  // Other data than the checkpoint's (a new mixture for a final phase, or a slip): allowed, and said.
  const std::string change = resume_data_change(reader, trainer.config(), trainer.sources());
  if (!change.empty() && trainer.runtime().topology().world_rank == 0) log::warn("checkpoint: {}", change);
  if (!change.empty())
    trainer.record_event(
        json_text(nlohmann::json{{"kind", "resume_data_changed"}, {"checkpoint", path}, {"change", change}}));
  const checkpoint::LoadResult r = checkpoint::load(trainer.engine(), &trainer.optimizer(), reader);
  TrainerState state;
  try {
    state = trainer_state_from_json(r.trainer_state, path);
  } catch (const CheckpointError& e) {
    throw checkpoint::CheckpointDamaged(e.what());
  }
  const std::string schedule =
      resume_schedule_change(reader, trainer.config(), trainer.sources(), trainer.total_steps(), state.step);
  const std::string optimizer = r.optimizer_loaded ? resume_optimizer_change(reader, trainer.config()) : std::string();
  for (const std::string& said : {schedule, optimizer})
    if (!said.empty() && trainer.runtime().topology().world_rank == 0) log::warn("checkpoint: {}", said);
  if (!r.optimizer_loaded) {  // a full checkpoint saved before 2026-11-29: fresh moments, also after a damaged one
    optim::AdamW& adamw = trainer.optimizer();
    for (size_t i = 0; i < adamw.num_shards(); ++i) {
      const std::vector<float> zeros(static_cast<size_t>(adamw.numel(i)), 0.0f);
      adamw.write_state(i, optim::OptimState::ExpAvg, zeros);
      adamw.write_state(i, optim::OptimState::ExpAvgSq, zeros);
    }
    state.optimizer_steps = 0;
  }
  return state;
}

void CheckpointHooks::resume(Trainer& trainer) {
  const std::string& resume = trainer.config().checkpoint.resume;
  if (resume.empty()) return;
  // An explicit checkpoint is loaded or refused; `auto` takes the newest complete one that loads, newest first, so
  // that a damaged newest checkpoint does not stop a requeued job forever.
  const bool fall_back = resume == "auto";
  const MPI_Comm world = trainer.runtime().world();
  // Rank 0 lists them, every rank tries the same ones: a rank that listed its own (a checkpoint.dir on node-local disks)
  // once started from scratch beside ranks that resumed, and the two entered different collectives.
  const std::vector<std::string> candidates = rank0_answer(world, [&] {
    std::vector<std::string> out;
    if (fall_back) {
      const auto all = checkpoint::complete_checkpoints(dir_);
      for (auto it = all.rbegin(); it != all.rend(); ++it) out.push_back(it->second);
    } else {
      out.push_back(resolve_resume_path(resume, dir_));
    }
    return out;
  });
  if (candidates.empty()) {
    const TrainConfig& config = trainer.config();
    if (config.logging.run_dir.empty() && config.checkpoint.dir.empty()) {
      // A run directory made new for this run has no checkpoints: `--resume auto` alone never continues anything.
      if (trainer.runtime().topology().world_rank == 0)
        log::warn(
            "checkpoint: resume = auto, but logging.run_dir is not set, so this run's directory {} is new and holds no "
            "checkpoint: STARTING FROM SCRATCH. To continue a run, pass its directory: --logging.run_dir RUN_DIR "
            "--resume auto{}",
            trainer.run_dir(), runs_with_checkpoints(config, trainer.run_dir()));
    } else {
      log::info("checkpoint: resume = auto and no complete checkpoint in {}: starting from scratch", dir_);
    }
    return;
  }
  const int rank = trainer.runtime().topology().world_rank;
  std::vector<Fallback> damaged;
  for (const std::string& path : candidates) {
    startup_checkpoint_stage(trainer.startup_watch(), fmt::format("resuming from {}", path));
    // Seen alike by every rank, or a clear error on all of them (not one rank's "not a checkpoint" or "damaged").
    check_ranks_see_checkpoint(world, path, "resume");
    std::string error;
    TrainerState state;
    try {
      state = load_for_resume(trainer, path);
    } catch (const checkpoint::CheckpointDamaged& e) {
      if (!fall_back) throw;
      error = e.what();
    }
    // Every rank read other parts of the files: a damaged chunk only one of them met fails the checkpoint for all.
    if (fall_back) error = lowest_error(world, rank, error);
    if (!error.empty()) {
      if (rank == 0)
        log::error("checkpoint: {} does not load{}: {}", path,
                   &path == &candidates.back() ? ", and it was the oldest" : ", trying the one before it", error);
      damaged.push_back({path, "", error});
      continue;
    }
    trainer.restore(state);
    resumed_from_ = path;
    last_saved_step_ = state.step;
    log::info("checkpoint: resumed from {} at step {} ({} tokens seen)", path, state.step, state.tokens_seen);
    if (rank == 0 && checkpoint::checkpoint_health(path) == checkpoint::Health::Diverging) {
      std::string sound;
      for (const auto& [step, p] : checkpoint::complete_checkpoints(dir_))
        if (checkpoint::checkpoint_health(p) == checkpoint::Health::Healthy) sound = p;
      log::warn("checkpoint: {} was saved during a streak of skipped steps (the run was diverging); {}", path,
                sound.empty()
                    ? std::string("no checkpoint of this directory was saved while training was sound")
                    : fmt::format("the newest one saved while training was sound is {} (--resume {})", sound, sound));
    }
    break;
  }
  if (resumed_from_.empty()) {
    std::vector<std::string> errors;
    for (const Fallback& d : damaged) errors.push_back(d.error);
    throw checkpoint::CheckpointDamaged(no_checkpoint_loads_problem(dir_, errors));
  }
  if (damaged.empty()) return;
  // Set aside, not deleted: the damaged ones stay for inspection but are no longer candidates, and their steps
  // can be saved again.
  for (Fallback& d : damaged) {
    if (rank == 0) {
      try {
        d.set_aside_as = checkpoint::set_aside_damaged(d.checkpoint);
      } catch (const IoError& e) {
        log::error("checkpoint: {}", e.what());
      }
      log::error(
          "checkpoint: RESUMED FROM AN OLDER CHECKPOINT: {} is damaged ({}); {}; resumed from {}, so the steps after it are "
          "trained again",
          d.checkpoint, d.error, d.set_aside_as.empty() ? "it stays where it is" : "set aside as " + d.set_aside_as,
          resumed_from_);
    }
    trainer.record_event(json_text(nlohmann::json{{"kind", "resume_fallback"},
                                                  {"damaged", d.checkpoint},
                                                  {"set_aside_as", d.set_aside_as},
                                                  {"error", d.error},
                                                  {"resumed_from", resumed_from_},
                                                  {"step", trainer.state().step}}));
  }
  fallbacks_ = std::move(damaged);
}

std::optional<RollbackPoint> CheckpointHooks::load_rollback_point(Trainer& trainer) {
  if (async_.pending()) wait_async(trainer);  // a save in flight is the newest
  // Host collectives and file reads, as a save's: a rank whose file system stopped answering ends the job.
  const SaveDeadline deadline(trainer.config().checkpoint.save_timeout,
                              fmt::format("the rollback's load (from step {})", trainer.state().step));
  // Rank 0 picks the checkpoint, every rank loads it: ranks that listed the directory each for itself could go back to
  // different steps, or some to none.
  const MPI_Comm world = trainer.runtime().world();
  const std::string path =
      rank0_answer(world, [&] {
        const std::vector<std::pair<int64_t, std::string>> saved = checkpoint::complete_checkpoints(dir_);  // oldest first
        std::string chosen = saved.empty() ? resumed_from_ : saved.back().second;
        const int64_t again = trainer.state().last_rollback_to;
        if (!saved.empty() && saved.back().first == again) {
          for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
            if (it->first < again) {
              log::warn(
                  "checkpoint: the run diverged again from step {} without a newer checkpoint: going back further, to step {}",
                  again, it->first);
              chosen = it->second;
              break;
            }
          }
        }
        return std::vector<std::string>{chosen};
      }).front();
  if (path.empty()) return std::nullopt;
  check_ranks_see_checkpoint(world, path, "rollback");
  checkpoint::CheckpointReader reader(path);
  optim::AdamW& adamw = trainer.optimizer();
  const checkpoint::LoadResult r = checkpoint::load(trainer.engine(), &adamw, reader);
  RollbackPoint point{trainer_state_from_json(r.trainer_state, path), path};
  if (!r.optimizer_loaded) {  // the diverged run's moments must not survive
    for (size_t i = 0; i < adamw.num_shards(); ++i) {
      const std::vector<float> zeros(static_cast<size_t>(adamw.numel(i)), 0.0f);
      adamw.write_state(i, optim::OptimState::ExpAvg, zeros);
      adamw.write_state(i, optim::OptimState::ExpAvgSq, zeros);
    }
    point.state.optimizer_steps = 0;
  }
  last_saved_step_ = point.state.step;
  return point;
}

checkpoint::SaveMeta CheckpointHooks::meta_for(const Trainer& trainer) const {
  checkpoint::SaveMeta meta;
  meta.step = trainer.state().step;
  meta.trainer_state = trainer_state_to_json(trainer.state());
  meta.config_toml = trainer.resolved_config_toml();
  meta.tokenizer = tokenizer_json(trainer);
  meta.health = trainer.state().consecutive_nonfinite == 0 ? checkpoint::Health::Healthy : checkpoint::Health::Diverging;
  return meta;
}

bool CheckpointHooks::weights_savable(Trainer& trainer, SaveCause cause) {
  trainer.optimizer();  // waits for CPU offload's update in flight: the shards are final
  int finite = shards_finite(trainer.engine().shards(), trainer.replica().ops().stream()) ? 1 : 0;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &finite, 1, MPI_INT, MPI_MIN, trainer.runtime().world()));
  if (finite) return true;
  const int64_t step = trainer.state().step;
  std::string newest;
  for (const auto& [saved_step, path] : checkpoint::complete_checkpoints(dir_))
    if (checkpoint::checkpoint_health(path) == checkpoint::Health::Healthy) newest = path;
  const std::string keep = newest.empty() ? "there is no sound checkpoint yet" : "the newest sound checkpoint is " + newest;
  if (cause != SaveCause::Periodic)
    throw Error(ExitCode::Diverged,
                fmt::format("the weights are not finite at step {}, so the {} save is not made; {}; lower optim.lr "
                            "and {}",
                            step, cause == SaveCause::Final ? "final" : "requested", keep,
                            newest.empty() ? "start again" : "resume from it"));
  if (trainer.runtime().topology().world_rank == 0)
    log::error(
        "checkpoint: the save of step {} is skipped: the weights are not finite (a checkpoint of them could only diverge); {}",
        step, keep);
  trainer.record_event(
      nlohmann::json{{"kind", "checkpoint_skipped"}, {"step", step}, {"reason", "non-finite weights"}}.dump());
  return false;
}

void CheckpointHooks::save(Trainer& trainer, SaveCause cause) {
  if (async_.pending()) wait_async(trainer);
  const TrainerState& s = trainer.state();
  if (s.step == last_saved_step_) return;
  const auto& c = trainer.config().checkpoint;
  // Armed before the first of the save's host collectives (the finiteness all-reduce): none of them is watched by the
  // collective watchdog, so a rank that never reached one would otherwise hold the others there for ever.
  const SaveDeadline deadline(c.save_timeout, fmt::format("the save of step {}", s.step));
  if (!weights_savable(trainer, cause)) return;
  if (claim_) claim_->renew(trainer.runtime().world());
  const checkpoint::SaveMeta meta = meta_for(trainer);
  // A complete checkpoint of this step that is there already is left alone by the save: it is not this run's
  // save, and is never reported as the run's last checkpoint.
  // Rank 0's view, as the save's own (checkpoint::save_*): a rank that saw otherwise would count failed saves apart.
  int existed = trainer.runtime().topology().world_rank == 0 &&
                        checkpoint::is_complete((std::filesystem::path(dir_) / checkpoint::step_dir_name(s.step)).string())
                    ? 1
                    : 0;
  ST_CHECK_MPI(MPI_Bcast(&existed, 1, MPI_INT, 0, trainer.runtime().world()));
  const std::string path =
      c.state_dict_type == StateDictType::Full
          ? checkpoint::save_full(trainer.engine(), trainer.optimizer(), dir_, meta, {c.keep_last, c.keep_every})
          : checkpoint::save_sharded(trainer.engine(), trainer.optimizer(), dir_, meta, {c.keep_last, c.keep_every});
  last_saved_step_ = s.step;
  if (!existed) published(path);
}

void CheckpointHooks::save_async(Trainer& trainer) {
  const TrainerState& s = trainer.state();
  if (s.step == last_saved_step_) return;
  if (async_.pending()) wait_async(trainer);  // the previous one first: its failure is its own
  const auto& c = trainer.config().checkpoint;
  const SaveDeadline deadline(c.save_timeout, fmt::format("the start of the asynchronous save of step {}", s.step));
  if (!weights_savable(trainer, SaveCause::Periodic)) return;
  if (claim_) claim_->renew(trainer.runtime().world());
  last_saved_step_ = async_step_ = s.step;
  // Timed from its start to its publication, steps and all, by a deadline of its own (it sees a pause; a step's end
  // comparing clocks counted the time the job was stopped as the file system's).
  async_deadline_ = std::make_unique<Deadline>(save_expire());
  async_deadline_->begin(
      {fmt::format("the asynchronous save of step {}", async_step_), c.save_timeout, "checkpoint.save_timeout"});
  try {
    async_.start(trainer.engine(), trainer.optimizer(), dir_, meta_for(trainer), {c.keep_last, c.keep_every});
  } catch (...) {
    async_deadline_.reset();
    throw;
  }
  if (!async_.pending()) async_deadline_.reset();  // a complete checkpoint of the step was there: nothing in flight
}

void CheckpointHooks::wait_async(Trainer& trainer) {
  periodic(trainer, async_step_, [&] { published(async_.wait()); });
  if (!async_.pending()) async_deadline_.reset();
}

void CheckpointHooks::on_step_end(Trainer& trainer, const StepMetrics&) {
  if (async_.pending()) {  // every rank asks, every step, until all have written
    periodic(trainer, async_step_, [&] { published(async_.poll()); });
    if (!async_.pending()) async_deadline_.reset();
  }
  const auto& c = trainer.config().checkpoint;
  const bool due = c.every_n_steps > 0 && trainer.state().step % c.every_n_steps == 0;
  if (trainer.save_requested()) {  // preemption: published before the run stops
    last_save(trainer, SaveCause::Requested);
    trainer.clear_save_request();
  } else if (due) {
    periodic(trainer, trainer.state().step, [&] {
      if (c.async_save && c.state_dict_type == StateDictType::Sharded) {
        save_async(trainer);
      } else {
        save(trainer, SaveCause::Periodic);
      }
    });
  }
}

void CheckpointHooks::on_end(Trainer& trainer) {
  if (async_.pending()) wait_async(trainer);
  if (trainer.config().checkpoint.every_n_steps > 0 || trainer.save_requested())
    last_save(trainer, trainer.save_requested() ? SaveCause::Requested : SaveCause::Final);
}

}  // namespace shardtrain::train
