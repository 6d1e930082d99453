// TOML in, TOML out, and --section.key overrides, all through the field table (config_fields.cpp).
#include "shardtrain/train/config_io.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/strings.hpp"

namespace shardtrain::train {
namespace {

std::string join_keys(std::string_view section) {
  std::string out;
  for (const ConfigField& f : config_fields()) {
    if (f.section != section) continue;
    if (!out.empty()) out += ", ";
    out += f.key;
  }
  return out;
}

std::string join_sections() {
  std::string out;
  for (const auto& s : config_sections()) out += (out.empty() ? "[" : ", [") + s + "]";
  return out;
}

// "where: section.key: what", without repeating the key when the message already starts with it.
[[noreturn]] void fail_key(const std::string& where, const ConfigField& f, std::string message) {
  const std::string prefix = f.dotted() + ": ";
  if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  throw ConfigError(fmt::format("{}: {}: {}", where, f.dotted(), message));
}

void store(TrainConfig& config, const ConfigField& f, const FieldValue& value, const std::string& where) {
  try {
    f.set(config, value);
  } catch (const Error& e) {
    fail_key(where, f, e.what());
  }
}

const char* toml_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

FieldValue from_toml(const toml::node& n, const ConfigField& f, const std::string& where) {
  auto wrong = [&]() { fail_key(where, f, fmt::format("expected {}, got {}", field_type_name(f.type), toml_type_name(n))); };
  switch (f.type) {
    case FieldType::Int:
      if (auto v = n.value_exact<int64_t>()) return *v;
      break;
    case FieldType::Float:
      if (n.is_integer()) return static_cast<double>(*n.value_exact<int64_t>());
      if (auto v = n.value_exact<double>()) return *v;
      break;
    case FieldType::Bool:
      if (auto v = n.value_exact<bool>()) return *v;
      break;
    case FieldType::String:
      if (auto v = n.value_exact<std::string>()) return *v;
      if (f.section == "fsdp" && f.key == "strategy" && n.is_integer()) return std::to_string(*n.value_exact<int64_t>());
      break;
    case FieldType::BoolOrAuto:
      if (auto v = n.value_exact<bool>()) return *v;
      if (auto v = n.value_exact<std::string>()) {
        if (*v == "auto") return *v;
        fail_key(where, f, fmt::format("expected true, false or \"auto\", got \"{}\"", *v));
      }
      break;
    case FieldType::StringList:
      if (auto v = n.value_exact<std::string>()) return std::vector<std::string>{*v};
      if (const toml::array* a = n.as_array()) {
        std::vector<std::string> out;
        for (const toml::node& e : *a) {
          auto s = e.value_exact<std::string>();
          if (!s)
            fail_key(where, f, fmt::format("expected an array of strings, got an element that is {}", toml_type_name(e)));
          out.push_back(*s);
        }
        return out;
      }
      break;
  }
  wrong();
  return {};
}

bool parse_bool(std::string_view s, bool& out) {
  if (s == "true" || s == "1" || s == "yes" || s == "on") return out = true, true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return out = false, true;
  return false;
}

FieldValue from_text(std::string_view s, const ConfigField& f, const std::string& where) {
  switch (f.type) {
    case FieldType::Int: {
      std::string digits;
      for (char ch : s)
        if (ch != '_') digits += ch;
      int64_t v = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec == std::errc() && p == digits.data() + digits.size() && !digits.empty()) return v;
      fail_key(where, f, fmt::format("expected an integer, got '{}'", s));
    }
    case FieldType::Float: {
      const std::string str(s);
      char* end = nullptr;
      const double v = std::strtod(str.c_str(), &end);
      if (!str.empty() && end == str.c_str() + str.size()) return v;
      fail_key(where, f, fmt::format("expected a number, got '{}'", s));
    }
    case FieldType::Bool: {
      bool b = false;
      if (parse_bool(s, b)) return b;
      fail_key(where, f, fmt::format("expected true or false (or 1/0, yes/no, on/off), got '{}'", s));
    }
    case FieldType::BoolOrAuto: {
      bool b = false;
      if (s == "auto") return std::string("auto");
      if (parse_bool(s, b)) return b;
      fail_key(where, f, fmt::format("expected true, false (or 1/0, yes/no, on/off) or auto, got '{}'", s));
    }
    case FieldType::String: return std::string(s);
    case FieldType::StringList: {
      std::vector<std::string> out;
      size_t start = 0;
      while (start <= s.size() && !s.empty()) {
        const size_t comma = s.find(',', start);
        const std::string_view part =
            s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
        if (!part.empty()) out.emplace_back(part);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
      return out;
    }
  }
  return {};
}

std::string toml_value(const FieldValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (auto* d = std::get_if<double>(&v)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    std::string s = fmt::format("{}", *d);  // shortest form that reads back exactly
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  }
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return quoted_string(*s);
  std::string out = "[";
  for (const auto& s : std::get<std::vector<std::string>>(v)) out += (out.size() > 1 ? ", " : "") + quoted_string(s);
  return out + "]";
}

}  // namespace

const char* field_type_name(FieldType t) {
  switch (t) {
    case FieldType::Int: return "an integer";
    case FieldType::Float: return "a number";
    case FieldType::Bool: return "a boolean";
    case FieldType::String: return "a string";
    case FieldType::StringList: return "an array of strings";
    case FieldType::BoolOrAuto: return "true, false or \"auto\"";
  }
  return "?";
}

void apply_toml_text(TrainConfig& config, std::string_view text, const std::string& source) {
  toml::table doc;
  try {
    doc = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}:{}:{}: not valid TOML: {}", source, e.source().begin.line, e.source().begin.column,
                                  e.description()));
  }
  for (auto&& [section_key, node] : doc) {
    const std::string section(section_key.str());
    const std::string at = fmt::format("{}:{}", source, node.source().begin.line);
    const toml::table* table = node.as_table();
    if (node.is_array_of_tables())
      throw ConfigError(fmt::format("{}: [[{}]] is an array of tables, not a section; write [{}] (the sections are {})", at,
                                    section, section, join_sections()));
    if (!table)
      throw ConfigError(
          fmt::format("{}: '{}' is outside any section; keys belong in one of {}", at, section, join_sections()));
    bool known = false;
    for (const auto& s : config_sections()) known = known || s == section;
    if (!known)
      throw ConfigError(fmt::format("{}: unknown section [{}] (expected one of {})", at, section, join_sections()));
    for (auto&& [key, value] : *table) {
      const std::string where = fmt::format("{}:{}", source, value.source().begin.line);
      const ConfigField* f = find_config_field(section, key.str());
      if (!f)
        throw ConfigError(fmt::format("{}: unknown key '{}.{}' (the keys of [{}] are: {})", where, section, key.str(),
                                      section, join_keys(section)));
      store(config, *f, from_toml(value, *f, where), where);
    }
  }
}

TrainConfig load_train_config(const std::string& path) {
  // A folder opens as a stream that reads nothing: it was taken as an empty config, and the error named the first
  // key an empty config lacks (schedule.max_steps).
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: is a folder (expected a TOML file, e.g. configs/tiny-cpu.toml)", path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(
        fmt::format("{}: cannot read the config file (expected a TOML file, e.g. configs/tiny-cpu.toml)", path));
  std::stringstream ss;
  ss << in.rdbuf();
  TrainConfig config;
  config.logging.name = std::filesystem::path(path).stem().string();
  apply_toml_text(config, ss.str(), path);
  return config;
}

void apply_override(TrainConfig& config, std::string_view dotted_key, std::string_view value) {
  const size_t dot = dotted_key.find('.');
  const std::string where = fmt::format("--{}", dotted_key);
  if (dot == std::string_view::npos)
    throw ConfigError(fmt::format("{}: overrides are --section.key value, with a section among {}", where, join_sections()));
  const std::string_view section = dotted_key.substr(0, dot), key = dotted_key.substr(dot + 1);
  const ConfigField* f = find_config_field(section, key);
  if (!f) {
    bool known = false;
    for (const auto& s : config_sections()) known = known || s == section;
    if (!known)
      throw ConfigError(fmt::format("{}: unknown section '{}' (expected one of {})", where, section, join_sections()));
    throw ConfigError(
        fmt::format("{}: unknown key '{}' (the keys of [{}] are: {})", where, dotted_key, section, join_keys(section)));
  }
  // --logging.name "" is the default, the config file's stem (set when it was read), not "" (which made "run-TIME").
  if (section == "logging" && key == "name" && value.empty()) return;
  store(config, *f, from_text(value, *f, "command line"), "command line");
  // data.path and data.mixture are two ways to name the data: the command line's choice replaces the file's.
  if (section == "data" && key == "path" && !config.data.path.empty()) config.data.mixture.clear();
  if (section == "data" && key == "mixture" && !config.data.mixture.empty()) config.data.path.clear();
}

std::vector<std::pair<std::string, std::string>> parse_override_args(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.find('.') == std::string::npos)
      throw UsageError(
          fmt::format("unexpected argument '{}' (overrides are --section.key value or --section.key=value)", a));
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      out.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    } else {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{}: expected a value after it", a));
      out.emplace_back(a.substr(2), args[++i]);
    }
  }
  return out;
}

std::string to_toml(const TrainConfig& config) {
  std::string out;
  for (const auto& section : config_sections()) {
    out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    for (const ConfigField& f : config_fields()) {
      if (f.section != section) continue;
      out += fmt::format("{} = {}\n", f.key, toml_value(f.get(config)));
    }
  }
  return out;
}

bool operator==(const TrainConfig& a, const TrainConfig& b) { return to_toml(a) == to_toml(b); }

}  // namespace shardtrain::train
