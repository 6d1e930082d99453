// `shardtrain train`: one training run from a TOML config (docs/training.md), optionally adjusted by the
// seeds' Transformers fsdp_config JSON or Accelerate YAML, then by --section.key overrides.
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/train/checkpointing.hpp"
#include "shardtrain/train/preemption.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/hf_configs.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::cli {
namespace {

struct TrainOptions {
  std::string resume;  // --resume: overrides checkpoint.resume
  std::vector<std::string> override_values;   // one per config field, in config_fields() order
  std::vector<CLI::Option*> override_options;
  std::string config;
  std::string fsdp_config;
  std::string accelerate_config;
  bool print_config = false;
};

// TOML file < --fsdp-config / --accelerate-config < --section.key overrides.
train::TrainConfig resolve(const TrainOptions& o, std::vector<std::string>& notes, std::string& source) {
  train::TrainConfig c = train::load_train_config(o.config);
  source = o.config;
  if (!o.fsdp_config.empty()) {
    for (auto& n : train::apply_fsdp_config_json(c, o.fsdp_config)) notes.push_back(std::move(n));
    source += " + " + o.fsdp_config;
  }
  if (!o.accelerate_config.empty()) {
    for (auto& n : train::apply_accelerate_config(c, o.accelerate_config)) notes.push_back(std::move(n));
    source += " + " + o.accelerate_config;
  }
  int overrides = 0;
  const auto& fields = train::config_fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (o.override_options[i]->count() == 0) continue;
    train::apply_override(c, fields[i].dotted(), o.override_values[i]);
    ++overrides;
  }
  if (overrides) source += fmt::format(" + {} override(s)", overrides);
  c.validate();
  return c;
}

// <run_dir>/result.json, written last by rank 0 (temporary file + rename): how the run ended. Job scripts
// read it because a launcher's exit status alone can lie (srun returns 0 when it could not start the
// ranks), and a run directory then says whether it finished, was stopped for a requeue, or neither.
void write_result(const train::TrainSummary& s, int64_t step, int64_t max_steps, bool preempted, const std::string& checkpoint) {
  namespace fs = std::filesystem;
  const nlohmann::json j = {{"status", preempted ? "preempted" : "finished"},
                            {"exit_code", preempted ? static_cast<int>(ExitCode::Requeue) : 0},
                            {"step", step},
                            {"max_steps", max_steps},
                            {"last_loss", s.last_loss},
                            {"last_checkpoint", checkpoint}};
  const fs::path out = fs::path(s.run_dir) / "result.json", tmp = fs::path(s.run_dir) / "result.json.tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) throw IoError(fmt::format("{}: cannot write the run's result", tmp.string()));
  }
  fs::rename(tmp, out);
}

int run_train(const TrainOptions& o, Runtime* rt) {
  std::vector<std::string> notes;
  std::string source;
  train::TrainConfig config = resolve(o, notes, source);
  if (!o.resume.empty()) config.checkpoint.resume = o.resume;  // --resume is checkpoint.resume
  for (const auto& n : notes) log::info("train: {}", n);
  if (o.print_config) {
    if (rt->topology().world_rank == 0) std::fputs(train::to_toml(config).c_str(), stdout);
    return 0;
  }
  const char* fault = std::getenv("SHARDTRAIN_FAULT");
  train::TrainerOptions topts;
  topts.faults = train::FaultPlan::parse(fault ? fault : "");
  topts.config_source = source;
  train::Trainer trainer(*rt, config, topts);
  train::PreemptionHooks preemption(rt->world());  // before checkpoints: a requested save happens in the same step
  train::CheckpointHooks checkpoints(trainer);
  trainer.add_hooks(&preemption);
  trainer.add_hooks(&checkpoints);
  const train::TrainSummary s = trainer.run();
  log::info("train: done: {} steps, {} tokens in {}, {:.0f} tokens/s; loss {:.4f} -> {:.4f}{}{}; run directory {} (metrics {})",
            s.steps, s.tokens, format_duration(s.seconds), s.tokens_per_s, s.first_loss, s.last_loss,
            std::isnan(s.last_val_loss) ? std::string() : fmt::format(", validation loss {:.4f}", s.last_val_loss),
            s.skipped_steps ? fmt::format(", {} step(s) skipped", s.skipped_steps) : std::string(), s.run_dir, s.metrics_path);
  if (!checkpoints.last_saved().empty()) log::info("train: last checkpoint {}", checkpoints.last_saved());
  if (rt->topology().world_rank == 0) {
    write_result(s, trainer.state().step, config.schedule.max_steps, preemption.preempted(), checkpoints.last_saved());
  }
  if (preemption.preempted()) {
    log::warn("train: stopped by a signal after step {}; resume with --resume auto (exit code 75 asks for a requeue)",
              trainer.state().step);
    return static_cast<int>(ExitCode::Requeue);
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& parent) {
  auto o = std::make_shared<TrainOptions>();
  Command c;
  c.app = parent.add_subcommand("train", "train a Llama model with FSDP from a TOML config (--section.key value overrides any key)");
  c.app->add_option("--config,-c", o->config, "the run's TOML config, e.g. configs/tiny-cpu.toml")->required();
  c.app->add_option("--fsdp-config", o->fsdp_config, "a Transformers fsdp_config JSON file (applied over the TOML)");
  c.app->add_option("--accelerate-config", o->accelerate_config, "an Accelerate config YAML file (applied over the TOML)");
  c.app->add_flag("--print-config", o->print_config, "print the resolved config as TOML on stdout and exit");
  c.app->add_option("--resume", o->resume, "auto (the newest complete checkpoint in checkpoint.dir) or a checkpoint path");
  // Every config key is an option of its own: --section.key value (or =value), listed by --help.
  const auto& fields = train::config_fields();
  o->override_values.resize(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const train::ConfigField& f = fields[i];
    o->override_options.push_back(c.app->add_option("--" + f.dotted(), o->override_values[i], f.help)->group("Config keys (override the file)"));
  }
  c.app->footer("Precedence: the TOML file < --fsdp-config / --accelerate-config < --section.key overrides.\n"
                "Keys and defaults: docs/training.md.");
  c.launch = Launch::Mpi;
  c.run = [o](Runtime* rt) { return run_train(*o, rt); };
  return c;
}

}  // namespace shardtrain::cli
