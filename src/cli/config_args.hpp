// The options that make a run's configuration, shared by `train` and `check` so that both read the same
// command line the same way: --config, the seeds' --fsdp-config / --accelerate-config, --resume, and one
// --section.key option per config field.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "shardtrain/train/config.hpp"

namespace shardtrain::cli {

struct ConfigArgs {
  std::string config;
  std::string fsdp_config;
  std::string accelerate_config;
  std::string resume;                        // --resume: overrides checkpoint.resume
  std::vector<std::string> override_values;  // one per config field, in config_fields() order
  std::vector<CLI::Option*> override_options;

  // train and check: --config is required and --resume offered. evaluate: --config is optional (the
  // checkpoint's own config stands in for it) and there is no --resume. predict: --config is required and there is
  // no --resume (it predicts a step, whatever the run resumes from). plan: --config is optional (its own options
  // describe a model without one) and there is no --resume.
  enum class Use { Run, Evaluate, Predict, Plan };
  Use purpose = Use::Run;  // as add_to was given it
  void add_to(CLI::App* app, Use use = Use::Run);
  // TOML file < --fsdp-config / --accelerate-config < --section.key overrides < --resume; validated (for evaluate, only
  // what it reads: TrainConfig::validate_for_evaluation).
  // `notes` gets what the seeds' files changed, `source` a description ("a.toml + 2 override(s)"). Without
  // --config the defaults and then `base_toml` (named `base_source`) take the file's place.
  train::TrainConfig resolve(std::vector<std::string>& notes, std::string& source, std::string_view base_toml = {},
                             const std::string& base_source = {}) const;
  // The configuration as resolve(base_toml) gives it, read before MPI starts for what times the start; nullopt where
  // it does not resolve (the command says why, once it runs).
  std::optional<train::TrainConfig> resolve_quietly(std::string_view base_toml = {}) const noexcept;
};

}  // namespace shardtrain::cli
