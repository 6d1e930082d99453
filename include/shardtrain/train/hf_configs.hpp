// The seeds' configuration files, read into a TrainConfig: the Transformers `fsdp_config` JSON
// (TrainingArguments(fsdp_config=...)) and the Accelerate config YAML (`accelerate config`). Each
// known key maps to a shardtrain key (docs/training.md has the table); keys that mean nothing natively
// (use_orig_params, tpu_*, ...) are accepted and reported; unknown keys are ConfigErrors naming file:key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

// Both return notes for the log (keys accepted without effect, class names that are not Llama modules).
std::vector<std::string> apply_fsdp_config_json_text(TrainConfig& config, std::string_view text, const std::string& source);
std::vector<std::string> apply_fsdp_config_json(TrainConfig& config, const std::string& path);
std::vector<std::string> apply_accelerate_config_text(TrainConfig& config, std::string_view text, const std::string& source);
std::vector<std::string> apply_accelerate_config(TrainConfig& config, const std::string& path);

}  // namespace shardtrain::train
