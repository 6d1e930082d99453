// Reading, overriding and printing a TrainConfig. Every key is one entry of a field table (section,
// key, type, default, help), so TOML files, --section.key overrides, the printed resolved config and
// docs/training.md all speak about the same keys. Unknown keys are errors.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

enum class FieldType { Int, Float, Bool, String, StringList, BoolOrAuto };
const char* field_type_name(FieldType t);  // "an integer", "a float", ...

using FieldValue = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;

struct ConfigField {
  std::string section;
  std::string key;
  FieldType type = FieldType::String;
  std::string help;
  std::function<FieldValue(const TrainConfig&)> get;
  // Converts and stores; throws ConfigError (without the key: the caller prefixes file and key).
  std::function<void(TrainConfig&, const FieldValue&)> set;
  std::string dotted() const { return section + "." + key; }
};

// All keys, in printing order (sections in the order model, fsdp, optim, schedule, data, checkpoint, logging).
const std::vector<ConfigField>& config_fields();
const std::vector<std::string>& config_sections();
const ConfigField* find_config_field(std::string_view section, std::string_view key);

// Applies a TOML document to `config`. `source` names it in errors ("configs/tiny-cpu.toml").
// Throws ConfigError with source:line, the key and what was expected.
void apply_toml_text(TrainConfig& config, std::string_view text, const std::string& source);
// Defaults, then the file. The run name defaults to the file's stem. Throws ConfigError for a missing file.
TrainConfig load_train_config(const std::string& path);

// One command-line override: key "section.key", value as typed on the command line (lists comma-separated).
void apply_override(TrainConfig& config, std::string_view dotted_key, std::string_view value);
// Splits "--a.b v --c.d=w" style arguments into (key, value) pairs; throws UsageError on anything else.
std::vector<std::pair<std::string, std::string>> parse_override_args(const std::vector<std::string>& args);

// The resolved configuration as TOML that load_train_config reads back to the same config.
std::string to_toml(const TrainConfig& config);

}  // namespace shardtrain::train
