#include "config_args.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/hf_configs.hpp"

namespace shardtrain::cli {

void ConfigArgs::add_to(CLI::App* app, Use use) {
  purpose = use;
  auto* c = app->add_option("--config,-c", config, "the run's TOML config, e.g. configs/tiny-cpu.toml");
  if (use != Use::Evaluate && use != Use::Plan) c->required();
  app->add_option("--fsdp-config", fsdp_config, "a Transformers fsdp_config JSON file (applied over the TOML)");
  app->add_option("--accelerate-config", accelerate_config, "an Accelerate config YAML file (applied over the TOML)");
  if (use == Use::Run)
    app->add_option("--resume", resume, "auto (the newest complete checkpoint in checkpoint.dir) or a checkpoint path");
  // Every config key is an option of its own: --section.key value (or =value), listed by --help.
  const auto& fields = train::config_fields();
  override_values.resize(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const train::ConfigField& f = fields[i];
    override_options.push_back(
        app->add_option("--" + f.dotted(), override_values[i], f.help)->group("Config keys (override the file)"));
  }
}

train::TrainConfig ConfigArgs::resolve(std::vector<std::string>& notes, std::string& source, std::string_view base_toml,
                                       const std::string& base_source) const {
  train::TrainConfig c;
  if (!config.empty()) {
    c = train::load_train_config(config);
    source = config;
  } else {
    train::apply_toml_text(c, base_toml, base_source);
    source = base_source;
  }
  if (!fsdp_config.empty()) {
    for (auto& n : train::apply_fsdp_config_json(c, fsdp_config)) notes.push_back(std::move(n));
    source += " + " + fsdp_config;
  }
  if (!accelerate_config.empty()) {
    for (auto& n : train::apply_accelerate_config(c, accelerate_config)) notes.push_back(std::move(n));
    source += " + " + accelerate_config;
  }
  int overrides = 0;
  const auto& fields = train::config_fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (override_options[i]->count() == 0) continue;
    train::apply_override(c, fields[i].dotted(), override_values[i]);
    ++overrides;
  }
  if (overrides) source += fmt::format(" + {} override(s)", overrides);
  if (!resume.empty()) {
    // Two answers to one question: neither silently wins.
    for (size_t i = 0; i < fields.size(); ++i)
      if (fields[i].dotted() == "checkpoint.resume" && override_options[i]->count() != 0)
        throw UsageError(
            fmt::format("--resume {} and --checkpoint.resume {}: give one of them", resume, override_values[i]));
    c.checkpoint.resume = resume;
  }
  // Evaluation takes no step: a training run's schedule, optimizer, checkpointing and batch rules are not its to refuse.
  if (purpose == Use::Evaluate) c.validate_for_evaluation();
  else c.validate();
  return c;
}

std::optional<train::TrainConfig> ConfigArgs::resolve_quietly(std::string_view base_toml) const noexcept {
  try {
    std::vector<std::string> notes;
    std::string source;
    return resolve(notes, source, base_toml, "the defaults");
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace shardtrain::cli
