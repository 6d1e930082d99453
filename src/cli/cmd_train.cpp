// `shardtrain train`: one training run from a TOML config (docs/training.md), optionally adjusted by the
// seeds' Transformers fsdp_config JSON or Accelerate YAML, then by --section.key overrides.
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "config_args.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/checkpointing.hpp"
#include "shardtrain/train/preemption.hpp"
#include "shardtrain/train/rank_agreement.hpp"
#include "shardtrain/train/run_dir.hpp"
#include "shardtrain/train/startup.hpp"
#include "shardtrain/train/step_memory.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/strings.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::cli {
namespace {

struct TrainOptions {
  ConfigArgs args;
  bool print_config = false;
};

// <run_dir>/result.json, written last by rank 0 (temporary file + rename): how the run ended. Job scripts
// read it because a launcher's exit status alone can lie (srun returns 0 when it could not start the
// ranks), and a run directory then says whether it finished, was stopped for a requeue, or neither.
// `total_steps`: the run's length in steps, however it was set (schedule.max_steps, max_tokens or epochs).
// A file that cannot be written (a full disk, a refused write) is logged and does not change the exit code: the
// training's outcome (finished, 0; preempted, 75) stands, so a full run directory never turns a requeue into the
// end of a job, nor a finished run into an I/O error (docs/training.md, "The run directory").
void write_result(const train::TrainSummary& s, int64_t step, int64_t total_steps, bool preempted,
                  const train::CheckpointHooks& checkpoints) {
  namespace fs = std::filesystem;
  // The newest checkpoint of this run: its last save, or, when it saved nothing (nothing was left to train, or it
  // was stopped before its first step), the one it resumed from.
  const std::string& checkpoint = checkpoints.last_saved().empty() ? checkpoints.resumed_from() : checkpoints.last_saved();
  nlohmann::json j = {{train::kResultMarkKey, train::kResultMarkValue},  // how a later start knows it may replace it
                      {"status", preempted ? "preempted" : "finished"},
                      {"exit_code", preempted ? static_cast<int>(ExitCode::Requeue) : 0},
                      {"step", step},
                      {"max_steps", total_steps},
                      {"last_loss", s.last_loss},
                      {"skipped_steps", s.skipped_steps},
                      {"rollbacks", s.rollbacks},
                      {"last_checkpoint", checkpoint}};
  if (!checkpoints.resumed_from().empty()) j["resumed_from"] = checkpoints.resumed_from();
  // --resume auto passed over damaged checkpoints (docs/checkpoints.md, "Damaged checkpoints")
  // Newer checkpoints a run branched from an older one renamed (docs/checkpoints.md, "One run per checkpoint directory")
  for (const auto& f : checkpoints.superseded())
    j["superseded_checkpoints"].push_back({{"checkpoint", f.checkpoint}, {"set_aside_as", f.set_aside_as}});
  for (const auto& f : checkpoints.resume_fallbacks())
    j["damaged_checkpoints"].push_back({{"checkpoint", f.checkpoint}, {"set_aside_as", f.set_aside_as}, {"error", f.error}});
  const std::string path = (fs::path(s.run_dir) / "result.json").string();
  try {
    write_json_file(path, j, "the run's result");
  } catch (const IoError& e) {
    log::error("train: {}; the run {} all the same (exit code {}), but job scripts that read result.json will not see it",
               e.what(), preempted ? "stopped for a requeue" : "finished",
               preempted ? static_cast<int>(ExitCode::Requeue) : 0);
  }
}

// The options that continue this run: its run directory (a generated one is new at every start, so `--resume auto`
// alone would start over) and the checkpoint directory, quoted for a shell when they need it: the line is meant to be
// pasted, and a run directory with a space in it ("runs/my runs/tiny cpu-...") was two words there (usage error 2).
std::string resume_options(const train::TrainConfig& config, const std::string& run_dir) {
  std::string text =
      config.logging.run_dir.empty() ? fmt::format("--logging.run_dir {} ", shell_quoted(run_dir)) : std::string();
  if (!config.checkpoint.dir.empty()) text += fmt::format("--checkpoint.dir {} ", shell_quoted(config.checkpoint.dir));
  return text + "--resume auto";
}

int run_train(const TrainOptions& o, Runtime* rt) {
  // First (the signals have been caught since main()'s first line, stops_on_signals): SIGUSR1/SIGTERM only set a flag
  // (a start-up takes minutes on a large model), and a run signalled before its first step stops with 75 below instead
  // of dying of the default action.
  train::PreemptionHooks preemption;  // before checkpoints: a requested save happens in the same step
  std::vector<std::string> notes;
  std::string source;
  train::TrainConfig config = o.args.resolve(notes, source);
  for (const auto& n : notes) log::info("train: {}", n);
  if (o.print_config) {
    if (rt->topology().world_rank == 0) {
      std::fputs(train::to_toml(config).c_str(), stdout);
      errno = 0;  // its product is what it prints: a full disk under `> f` is an I/O error, not an empty file and 0
      if (std::fflush(stdout) != 0 || std::ferror(stdout))
        throw IoError(fmt::format("train --print-config: standard output could not be written ({})",
                                  errno != 0 ? std::strerror(errno) : "a write failed"));
    }
    return 0;
  }
  const char* fault = std::getenv("SHARDTRAIN_FAULT");
  train::TrainerOptions topts;
  topts.faults = train::FaultPlan::parse(fault ? fault : "");
  topts.config_source = source;
  // From here to the first step, a stage that does not end (a rank held up, a peer that never arrives) ends the job
  // with exit code 10 rather than holding it until its time limit (startup.hpp).
  train::StartupWatch startup(config, config.logging.run_dir);
  topts.startup = &startup;
  // Ranks that resolved different configurations stop here, naming the first differing key, before any of the
  // checks below could fail on some ranks and not others (the trainer asks again, for its other callers).
  startup.stage("the ranks' agreement on the configuration");
  train::check_ranks_agree_on_config(rt->world(), train::to_toml(config));
  // A run directory that is named is looked into first (not a directory at all; a config.toml or result.json the
  // run would replace), and the earlier start's records in it go: from here on it tells of this start. The trainer
  // writes into it only once the start is validated.
  startup.stage("looking into logging.run_dir");
  if (!config.logging.run_dir.empty())
    topts.run_dir_existed = train::begin_start_in_run_dir(rt->world(), config, config.logging.run_dir);
  // Everything that can be checked before anything is made, in seconds: the model and a step against the memory,
  // the world, the datasets and the run's length. A run refused for them leaves no directory behind.
  startup.stage("checking the model and a step against the memory");
  check_model_fits(config, *rt);
  config.validate_for_world(rt->topology().world_size, rt->topology().node_count);
  train::check_step_memory(config, *rt);
  startup.stage("opening the datasets");
  // A dataset some ranks do not see (a node-local path): one error naming them, not a line from each.
  train::agreed_outcome(
      rt->world(), [&] { topts.sources = train::open_data_sources(config); },
      "every rank opens the same data.path, on a file system every node mounts");
  if (const train::RankFault* f = topts.faults.rank_fault_at(rt->topology().world_rank, 0)) train::inject(*f);
  train::check_run_length(config, topts.sources);
  // The checkpoint directory is claimed (created, writable, locked) before anything is built when its name is known,
  // so a refusal costs seconds, not a model's initialization; a generated run directory's is new, and claimed once
  // the trainer made it.
  startup.stage("claiming the checkpoint directory");
  train::CheckpointDirClaim claim;
  if (!config.logging.run_dir.empty() || !config.checkpoint.dir.empty())
    claim.acquire(rt->world(), train::checkpoint_dir_for(config, config.logging.run_dir), config.logging.run_dir);
  train::Trainer trainer(*rt, config, std::move(topts));
  startup.stage("claiming the checkpoint directory");
  if (!claim.acquired()) claim.acquire(rt->world(), train::checkpoint_dir_for(config, trainer.run_dir()), trainer.run_dir());
  train::CheckpointHooks checkpoints(trainer);
  checkpoints.set_claim(&claim);
  trainer.add_hooks(&preemption);
  trainer.add_hooks(&checkpoints);
  // The checkpoint directory's checks and the resume: a start they refuse has written nothing into the run
  // directory (run_dir.hpp). Past them, the run directory is this run's.
  trainer.start();
  startup.stage("the ranks' check for a stop signal before the first step");
  if (preemption.stop_before_start(rt->world())) {
    train::TrainSummary s;
    s.run_dir = trainer.run_dir();
    s.last_loss = std::nan("");
    if (rt->topology().world_rank == 0) {
      write_result(s, trainer.state().step, trainer.total_steps(), true, checkpoints);
      log::warn(
          "train: stopped by a signal before the first step; to continue, run the same command with {} (exit code 75 "
          "asks for a requeue)",
          resume_options(config, trainer.run_dir()));
    }
    return static_cast<int>(ExitCode::Requeue);
  }
  startup.done();
  const train::TrainSummary s = trainer.run();
  if (!preemption.preempted()) preemption.say_signal_after_the_last_step(trainer);  // every rank alike (the steps agreed)
  // Steps and tokens of this start; a resumed run's life so far beside them, said as such.
  const std::string life = s.first_step > 0
                               ? fmt::format(" (steps {} to {} of {}; {} tokens over the run's life)", s.first_step + 1,
                                             trainer.state().step, trainer.total_steps(), s.tokens_total)
                               : std::string();
  const char* const ended = preemption.preempted() ? "stopped" : "done";  // a stop is not the run's end
  if (s.steps == 0)
    log::info("train: done: no step left to take (at step {} of {}); run directory {}", trainer.state().step,
              trainer.total_steps(), s.run_dir);
  else
    log::info(
        "train: {}: {} steps, {} tokens in {}{}, {:.0f} tokens/s in the steps (evaluations and saves aside); loss {:.4f} "
        "-> {:.4f}{}{}{}; run directory {}{}",
        // A short run's time to the hundredth: whole seconds said "3072 tokens in 0s, 14678 tokens/s".
        ended, s.steps, s.tokens, s.seconds < 60 ? fmt::format("{:.2f}s", s.seconds) : format_duration(s.seconds), life,
        s.tokens_per_s, s.first_loss, s.last_loss,
        std::isnan(s.last_val_loss) ? std::string() : fmt::format(", validation loss {:.4f}", s.last_val_loss),
        s.skipped_steps ? fmt::format(", {} step(s) skipped", s.skipped_steps) : std::string(),
        s.rollbacks ? fmt::format(", {} rollback(s)", s.rollbacks) : std::string(), s.run_dir,
        s.metrics_path.empty() ? std::string() : fmt::format(" (metrics {})", s.metrics_path));  // rank 0 writes them
  if (!checkpoints.last_saved().empty()) log::info("train: last checkpoint {}", checkpoints.last_saved());
  // Not into a run directory another run claimed after this one's was removed (Trainer::keep_run_dir said so).
  if (rt->topology().world_rank == 0 && trainer.keep_run_dir()) {
    write_result(s, trainer.state().step, trainer.total_steps(), preemption.preempted(), checkpoints);
  }
  if (preemption.preempted()) {
    // mpirun sends SIGTERM for a SIGTERM or Ctrl-C of its own, and then exits 1 whatever the ranks return; a SIGTERM
    // sent to the ranks alone leaves it 75. Which one came cannot be told here.
    const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
    if (rt->topology().world_rank == 0)
      log::warn(
          "train: stopped by a signal after step {}; to continue, run the same command with {} (exit code 75 asks "
          "for a requeue{})",
          trainer.state().step, resume_options(config, trainer.run_dir()),
          (preemption.signal() == SIGTERM || preemption.signal() == SIGINT) && under_mpirun
              ? "; if mpirun itself was sent the SIGTERM or a Ctrl-C, it exits 1 whatever the ranks return: start it "
                "through jobs/launch.sh to read 75, docs/exit-codes.md"
              : "");
    return static_cast<int>(ExitCode::Requeue);
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& parent) {
  auto o = std::make_shared<TrainOptions>();
  Command c;
  c.stops_on_signals = true;
  c.start_settings = [o] {
    StartSettings s;
    if (const auto config = o->args.resolve_quietly()) s = {config->fsdp.startup_timeout, true, config->logging.run_dir};
    return s;
  };
  c.app = parent.add_subcommand("train",
                                "train a Llama model with FSDP from a TOML config (--section.key value overrides any key)");
  o->args.add_to(c.app);
  c.app->add_flag("--print-config", o->print_config, "print the resolved config as TOML on stdout and exit");
  c.app->footer(
      "Precedence: the TOML file < --fsdp-config / --accelerate-config < --section.key overrides.\n"
      "Keys and defaults: docs/training.md.");
  c.launch = Launch::Mpi;
  c.run = [o](Runtime* rt) { return run_train(*o, rt); };
  return c;
}

}  // namespace shardtrain::cli
