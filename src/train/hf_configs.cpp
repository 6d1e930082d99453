// Transformers fsdp_config JSON and Accelerate YAML -> TrainConfig (hf_configs.hpp). Both formats share
// most option names (Accelerate prefixes them with fsdp_), so one table of option handlers serves both.
#include "shardtrain/train/hf_configs.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/yaml_subset.hpp"

namespace shardtrain::train {
namespace {

// One option value in either format.
struct Value {
  enum class Kind { Null, Bool, Int, Float, String, List } kind = Kind::Null;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<std::string> list;
  std::string where;  // "file:line key" or "file key"
};

// The most processes or machines an Accelerate file may name: the ranks plan and check take (2^20).
constexpr int64_t kMaxYamlCount = int64_t{1} << 20;

[[noreturn]] void fail(const Value& v, const std::string& what) { throw ConfigError(fmt::format("{}: {}", v.where, what)); }

bool as_bool(const Value& v) {
  if (v.kind == Value::Kind::Bool) return v.b;
  if (v.kind == Value::Kind::String && (v.s == "true" || v.s == "True")) return true;
  if (v.kind == Value::Kind::String && (v.s == "false" || v.s == "False")) return false;
  fail(v, "expected true or false");
}
int64_t as_int(const Value& v) {
  if (v.kind == Value::Kind::Int) return v.i;
  if (v.kind == Value::Kind::Float && std::abs(v.f) < 0x1p62 && v.f == static_cast<double>(static_cast<int64_t>(v.f)))
    return static_cast<int64_t>(v.f);
  fail(v, v.kind == Value::Kind::Float && std::isfinite(v.f) && v.f == std::floor(v.f)
              ? "expected an integer of at most 2^62"
              : "expected an integer");
}
std::string as_string(const Value& v) {
  if (v.kind == Value::Kind::String) return v.s;
  if (v.kind == Value::Kind::Int) return std::to_string(v.i);
  fail(v, "expected a string");
}
// A class list: a JSON/YAML list, or one string with comma-separated names (Accelerate writes that).
std::vector<std::string> as_names(const Value& v) {
  std::vector<std::string> out;
  auto add_split = [&](const std::string& s) {
    std::stringstream ss(s);
    std::string part;
    while (std::getline(ss, part, ',')) {
      part.erase(0, part.find_first_not_of(' '));
      while (!part.empty() && part.back() == ' ') part.pop_back();
      if (!part.empty()) out.push_back(part);
    }
  };
  if (v.kind == Value::Kind::String) add_split(v.s);
  else if (v.kind == Value::Kind::List)
    for (const auto& s : v.list) add_split(s);
  else if (v.kind != Value::Kind::Null) fail(v, "expected a class name or a list of class names");
  return out;
}

template <typename F>
auto rethrow_at(const Value& v, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    fail(v, e.what());
  }
}

struct Context {
  TrainConfig* config;
  std::vector<std::string> notes;
};

using Handler = std::function<void(Context&, const Value&)>;

void set_layer_classes(Context& c, const Value& v) {
  std::vector<model::ModuleClass> cls;
  for (const std::string& name : as_names(v)) {
    try {
      cls.push_back(model::parse_module_class(name));
    } catch (const ConfigError&) {
      c.notes.push_back(
          fmt::format("{}: '{}' is not a Llama module class; ignored (the Llama transformer block is LlamaDecoderLayer)",
                      v.where, name));
    }
  }
  if (cls.empty()) {
    cls.push_back(model::ModuleClass::LlamaDecoderLayer);
    if (v.kind != Value::Kind::Null) c.notes.push_back(fmt::format("{}: wrapping LlamaDecoderLayer", v.where));
  }
  c.config->fsdp.engine.wrap.transformer_layer_cls = std::move(cls);
}

void accepted(Context& c, const Value& v, const char* why) {
  c.notes.push_back(fmt::format("{}: accepted, no effect ({})", v.where, why));
}

int backward_prefetch_depth(const Value& v) {
  if (v.kind == Value::Kind::Null) return 0;
  const std::string s = as_string(v);
  if (s == "BACKWARD_PRE" || s == "BACKWARD_POST" || s == "backward_pre" || s == "backward_post") return 1;
  if (s == "NO_PREFETCH" || s == "no_prefetch") return 0;
  fail(v, fmt::format("unknown backward prefetch '{}' (expected BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH)", s));
}

// Options both formats share, by their Transformers name (Accelerate's is the same with fsdp_ in front).
const std::map<std::string, Handler>& fsdp_options() {
  static const std::map<std::string, Handler> table = {
      {"version",
       [](Context& c, const Value& v) {
         const int64_t ver = as_int(v);
         if (ver != 1 && ver != 2) fail(v, fmt::format("expected FSDP version 1 or 2, got {}", ver));
       }},
      {"sharding_strategy",
       [](Context& c, const Value& v) {
         c.config->fsdp.engine.strategy = rethrow_at(v, [&] { return parse_sharding_strategy(as_string(v)); });
       }},
      {"reshard_after_forward",
       [](Context& c, const Value& v) {
         if (v.kind == Value::Kind::Bool) c.config->fsdp.engine.reshard_after_forward = v.b;
         else
           c.config->fsdp.engine.strategy =
               rethrow_at(v, [&] { return parse_sharding_strategy(as_string(v)); });  // FSDP1 spelling
       }},
      {"cpu_offload", [](Context& c, const Value& v) { c.config->fsdp.engine.offload_params = as_bool(v); }},
      {"offload_params", [](Context& c, const Value& v) { c.config->fsdp.engine.offload_params = as_bool(v); }},
      {"auto_wrap_policy",
       [](Context& c, const Value& v) {
         c.config->fsdp.engine.wrap.policy = rethrow_at(v, [&] { return fsdp::parse_wrap_policy(as_string(v)); });
       }},
      {"transformer_layer_cls_to_wrap", set_layer_classes},
      {"min_num_params",
       [](Context& c, const Value& v) {
         const int64_t n = as_int(v);
         if (n <= 0) fail(v, fmt::format("expected a positive parameter count, got {}", n));
         c.config->fsdp.engine.wrap.min_num_params = n;
       }},
      {"state_dict_type",
       [](Context& c, const Value& v) {
         c.config->checkpoint.state_dict_type = rethrow_at(v, [&] { return parse_state_dict_type(as_string(v)); });
       }},
      {"cpu_ram_efficient_loading",
       [](Context& c, const Value& v) { c.config->checkpoint.cpu_ram_efficient_loading = as_bool(v); }},
      {"activation_checkpointing",
       [](Context& c, const Value& v) { c.config->fsdp.engine.activation_checkpointing = as_bool(v); }},
      {"backward_prefetch",
       [](Context& c, const Value& v) { c.config->fsdp.engine.backward_prefetch = backward_prefetch_depth(v); }},
      {"backward_prefetch_policy",
       [](Context& c, const Value& v) { c.config->fsdp.engine.backward_prefetch = backward_prefetch_depth(v); }},
      {"forward_prefetch", [](Context& c, const Value& v) { c.config->fsdp.engine.forward_prefetch = as_bool(v) ? 1 : 0; }},
      {"sync_module_states", [](Context& c, const Value& v) { c.config->fsdp.engine.sync_module_states = as_bool(v); }},
      {"use_orig_params",
       [](Context& c, const Value& v) {
         as_bool(v);
         accepted(c, v, "parameters are always views into the flat buffers");
       }},
      {"limit_all_gathers",
       [](Context& c, const Value& v) {
         as_bool(v);
         accepted(c, v, "gathers are bounded by the prefetch depth");
       }},
      {"xla",
       [](Context& c, const Value& v) {
         if (as_bool(v)) fail(v, "PyTorch/XLA (TPU) is not a shardtrain backend; expected false");
       }},
      {"xla_fsdp_grad_ckpt",
       [](Context& c, const Value& v) {
         if (as_bool(v)) fail(v, "XLA options are not supported; use activation_checkpointing");
       }},
  };
  return table;
}

void apply_fsdp_option(Context& c, const std::string& name, const Value& v, const std::string& file_hint) {
  const auto& table = fsdp_options();
  auto it = table.find(name);
  if (it == table.end()) {
    std::string known;
    for (const auto& [k, h] : table) known += (known.empty() ? "" : ", ") + k;
    fail(v, fmt::format("unknown {} option (known: {})", file_hint, known));
  }
  it->second(c, v);
}

Value from_json(const nlohmann::json& j, std::string where) {
  Value v;
  v.where = std::move(where);
  if (j.is_null()) v.kind = Value::Kind::Null;
  else if (j.is_boolean()) v.kind = Value::Kind::Bool, v.b = j.get<bool>();
  else if (j.is_number_integer()) v.kind = Value::Kind::Int, v.i = j.get<int64_t>();
  else if (j.is_number_float()) v.kind = Value::Kind::Float, v.f = j.get<double>();
  else if (j.is_string()) v.kind = Value::Kind::String, v.s = j.get<std::string>();
  else if (j.is_array()) {
    v.kind = Value::Kind::List;
    for (const auto& e : j) {
      if (!e.is_string()) fail(v, "expected a list of strings");
      v.list.push_back(e.get<std::string>());
    }
  } else {
    fail(v, "expected a scalar or a list of strings, got an object");
  }
  return v;
}

Value from_yaml(const YamlNode& n, std::string where) {
  Value v;
  v.where = std::move(where);
  if (n.kind == YamlNode::Kind::List) {
    v.kind = Value::Kind::List;
    for (const auto& e : n.list) v.list.push_back(e.scalar);
    return v;
  }
  if (n.kind == YamlNode::Kind::Map) fail(v, "expected a value, got a mapping");
  if (n.null) return v;
  v.kind = Value::Kind::String;
  v.s = n.scalar;
  if (n.quoted) return v;
  // Plain scalars: YAML 1.1 booleans and numbers as PyYAML reads them.
  const std::string& s = n.scalar;
  if (s == "true" || s == "True" || s == "TRUE") return v.kind = Value::Kind::Bool, v.b = true, v;
  if (s == "false" || s == "False" || s == "FALSE") return v.kind = Value::Kind::Bool, v.b = false, v;
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  // Past int64 strtoll gives its limit: read on as a float, which no count takes.
  if (end == s.c_str() + s.size() && errno != ERANGE) return v.kind = Value::Kind::Int, v.i = i, v;
  const double f = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size()) return v.kind = Value::Kind::Float, v.f = f, v;
  return v;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("{}: cannot read the {}", path, what));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<std::string> apply_fsdp_config_json_text(TrainConfig& config, std::string_view text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(fmt::format("{}: not valid JSON (byte {}): {}", source, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {  // a number past a double (1e400): out_of_range, an internal error
    throw ConfigError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) throw ConfigError(fmt::format("{}: expected a JSON object of fsdp_config options", source));
  Context c{&config, {}};
  for (const auto& [key, value] : j.items()) {
    if (key == "xla_fsdp_settings") {
      if (!value.is_object() || !value.empty())
        throw ConfigError(fmt::format("{}: {}: XLA settings are not supported", source, key));
      continue;
    }
    // Transformers accepts the fsdp_ prefix on every key and strips it.
    const std::string name = key.rfind("fsdp_", 0) == 0 ? key.substr(5) : key;
    apply_fsdp_option(c, name, from_json(value, fmt::format("{}: {}", source, key)), "fsdp_config");
  }
  return c.notes;
}

std::vector<std::string> apply_fsdp_config_json(TrainConfig& config, const std::string& path) {
  return apply_fsdp_config_json_text(config, read_file(path, "Transformers fsdp_config JSON file"), path);
}

std::vector<std::string> apply_accelerate_config_text(TrainConfig& config, std::string_view text,
                                                      const std::string& source) {
  const YamlNode root = parse_yaml_subset(text, source);
  if (root.kind != YamlNode::Kind::Map)
    throw ConfigError(fmt::format("{}:{}: expected a mapping of Accelerate options", source, root.line));
  Context c{&config, {}};
  // Keys of `accelerate config` that describe the launcher or other backends, with no native meaning.
  static const char* const no_effect[] = {"compute_environment",
                                          "debug",
                                          "downcast_bf16",
                                          "machine_rank",
                                          "main_training_function",
                                          "rdzv_backend",
                                          "same_network",
                                          "tpu_env",
                                          "tpu_use_cluster",
                                          "tpu_use_sudo",
                                          "use_cpu",
                                          "main_process_ip",
                                          "main_process_port",
                                          "gpu_ids",
                                          "enable_cpu_affinity",
                                          "dynamo_config",
                                          "tpu_name",
                                          "tpu_zone",
                                          "commands",
                                          "command_file"};
  for (const auto& [key, node] : root.map) {
    const std::string where = fmt::format("{}:{}: {}", source, node.line, key);
    if (key == "fsdp_config") {
      if (node.kind != YamlNode::Kind::Map)
        throw ConfigError(fmt::format("{}: expected a mapping of fsdp_* options", where));
      for (const auto& [k, n] : node.map) {
        const std::string w = fmt::format("{}:{}: fsdp_config.{}", source, n.line, k);
        const std::string name = k.rfind("fsdp_", 0) == 0 ? k.substr(5) : k;
        apply_fsdp_option(c, name, from_yaml(n, w), "Accelerate fsdp_config");
      }
      continue;
    }
    const Value v = from_yaml(node, where);
    if (key == "distributed_type") {
      if (as_string(v) != "FSDP")
        fail(v, fmt::format("'{}' is not FSDP: shardtrain trains with FSDP (expected distributed_type: FSDP)", v.s));
    } else if (key == "mixed_precision") {
      const std::string mp = v.kind == Value::Kind::Bool ? (v.b ? "yes" : "no") : as_string(v);
      if (mp == "no") {
        config.fsdp.engine.param_dtype = DType::F32;
      } else if (mp == "bf16") {
        config.fsdp.engine.param_dtype = DType::BF16;
      } else {
        fail(v, fmt::format("'{}' is not supported (expected 'no' or bf16; fp16 and fp8 have no native path)", mp));
      }
    } else if (key == "num_processes") {
      const int64_t n = as_int(v);
      // 4294967297 went into an int as 1.
      if (n < 1 || n > kMaxYamlCount) fail(v, fmt::format("expected 1 to {} processes, got {}", kMaxYamlCount, n));
      config.fsdp.num_processes = static_cast<int>(n);
    } else if (key == "num_machines") {
      const int64_t n = as_int(v);
      if (n < 1 || n > kMaxYamlCount) fail(v, fmt::format("expected 1 to {} machines, got {}", kMaxYamlCount, n));
      config.fsdp.num_machines = static_cast<int>(n);
    } else {
      bool known = false;
      for (const char* k : no_effect) known = known || key == k;
      if (!known)
        fail(
            v,
            "unknown Accelerate option (expected distributed_type, mixed_precision, num_processes, num_machines, fsdp_config, "
            "or a launcher option such as compute_environment)");
      if (key == "use_cpu" && v.kind == Value::Kind::Bool && v.b)
        c.notes.push_back(fmt::format("{}: the device comes from --device", where));
    }
  }
  return c.notes;
}

std::vector<std::string> apply_accelerate_config(TrainConfig& config, const std::string& path) {
  return apply_accelerate_config_text(config, read_file(path, "Accelerate config YAML file"), path);
}

}  // namespace shardtrain::train
