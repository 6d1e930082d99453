// Tensor sources: checkpoint directories, consolidated HDF5 files, Hugging Face safetensors directories.
#include "shardtrain/checkpoint/source.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "paths.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/log.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {
namespace {

// `what` after `where`, unless it names that file first already (the HDF5 helpers' messages do).
std::string at(const std::string& where, const std::string& what) {
  return what.rfind(where + ": ", 0) == 0 ? what : fmt::format("{}: {}", where, what);
}

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw CheckpointError(at(where, what)); }

class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(const std::string& dir) : reader_(dir) {}
  StateDictType type() const { return reader_.type(); }
  const std::string& path() const override { return reader_.path(); }
  const model::LlamaConfig& model_config() const override { return reader_.model_config(); }
  std::string tokenizer() const override { return reader_.tokenizer(); }
  std::string config_toml() const override { return reader_.config_toml(); }
  int64_t step() const override { return reader_.step(); }
  bool has(const std::string& name) const override {
    for (const TensorInfo& t : reader_.tensors())
      if (t.name == name) return true;
    return false;
  }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const TensorInfo& t : reader_.tensors()) names.push_back(t.name);
    return names;
  }
  void read(const std::string& name, int64_t begin, std::span<float> out) override {
    reader_.read(name, "param", begin, out);
  }

 private:
  CheckpointReader reader_;
};

// `shardtrain consolidate --format hdf5` output: one dataset per tensor, f32 or bf16 bits.
class ConsolidatedSource final : public TensorSource {
 public:
  explicit ConsolidatedSource(const std::string& file) : path_(file) {
    try {
      file_ = hdf5::open_file(file, hdf5::FileMode::ReadOnly);
      hdf5::verify_metadata_checksums(file_);  // consolidated before the checksums existed: not checked
    } catch (const Error& e) {
      fail(file, e.what());
    }
    if (hdf5::get_attr_string(file_, "format").value_or("") != "shardtrain-consolidated")
      fail(file,
           "not a consolidated shardtrain file (its 'format' attribute is not 'shardtrain-consolidated'): expected a "
           "file `shardtrain consolidate` wrote, a checkpoint folder (step_N; a FULL_STATE_DICT checkpoint's model.h5 "
           "is read through the index.h5 beside it) or a Hugging Face directory");
    config_ = model_config_from_json(hdf5::get_attr_string(file_, "model_config").value_or("{}"), file);
    tokenizer_ = hdf5::get_attr_string(file_, "tokenizer").value_or("");
    bf16_ = hdf5::get_attr_string(file_, "dtype").value_or("f32") == "bf16";
  }
  const std::string& path() const override { return path_; }
  const model::LlamaConfig& model_config() const override { return config_; }
  std::string tokenizer() const override { return tokenizer_; }
  bool has(const std::string& name) const override { return hdf5::exists(file_, name); }
  void read(const std::string& name, int64_t begin, std::span<float> out) override {
    if (!has(name)) fail(path_, fmt::format("no tensor named '{}'", name));
    // The HDF5 helpers report a chunk that fails its checksum as a data error; here it is damaged weights, as a
    // truncated file is (exit 5 for both).
    std::vector<uint16_t> all;
    try {
      if (!bf16_) {
        hdf5::read_f32_range(file_, name, static_cast<size_t>(begin), out);
        return;
      }
      all = hdf5::read_u16(file_, name);
    } catch (const CheckpointError&) {
      throw;
    } catch (const DataError& e) {
      fail(path_, e.what());
    }
    if (begin + static_cast<int64_t>(out.size()) > static_cast<int64_t>(all.size()))
      fail(path_, fmt::format("'{}' is too short", name));
    for (size_t i = 0; i < out.size(); ++i) out[i] = float_from_bf16_bits(all[static_cast<size_t>(begin) + i]);
  }

 private:
  std::string path_, tokenizer_;
  hdf5::Handle file_;
  model::LlamaConfig config_;
  bool bf16_ = false;
};

// config.json's `key`: a number (double), a boolean or a string (T), or `fallback` when absent or null (transformers
// takes a null as unset: "attention_bias": null was refused as "type must be boolean, but is null", naming no key).
template <class T>
T field(const nlohmann::json& j, const char* key, T fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const nlohmann::json& v = j[key];
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    fail(where, fmt::format("{} is {}: expected true or false", key, v.dump()));
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
    fail(where, fmt::format("{} is {}: expected a string", key, v.dump()));
  } else {
    if (v.is_number()) return v.get<double>();
    fail(where, fmt::format("{} is {}: expected a number", key, v.dump()));
  }
}

// RoPE from a Llama config.json into c. transformers 5 writes rope_parameters {rope_type, rope_theta, the
// type's parameters}; 4.x wrote rope_theta, and rope_scaling {rope_type (or type), parameters} when scaled.
// shardtrain computes the default, linear and llama3 types (ops/rope.hpp); any other (dynamic, yarn, longrope,
// ...) changes the angles in ways it does not, and is refused rather than silently ignored.
void read_rope(const nlohmann::json& j, const std::string& where, model::LlamaConfig& c) {
  c.rope_theta = field(j, "rope_theta", 10000.0, where);
  const auto given = [&](const char* k) -> const nlohmann::json* {
    if (!j.contains(k) || j[k].is_null()) return nullptr;
    if (!j[k].is_object()) fail(where, fmt::format("{} is {}, expected an object", k, j[k].dump()));
    return &j[k];
  };
  const nlohmann::json *params = given("rope_parameters"), *scaling = given("rope_scaling");
  const auto type_of = [](const nlohmann::json& o) { return o.value("rope_type", o.value("type", std::string("default"))); };
  if (params) {  // 5.x's form wins: it carries the base too. A 4.x form beside it must say the same.
    c.rope_theta = params->value("rope_theta", c.rope_theta);
    const auto differs = [&](const char* name) {
      return scaling->contains(name) && (*scaling)[name] != params->value(name, nlohmann::json());
    };
    if (scaling && (type_of(*scaling) != type_of(*params) || differs("factor") || differs("low_freq_factor") ||
                    differs("high_freq_factor") || differs("original_max_position_embeddings")))
      fail(where, fmt::format("rope_parameters {} and rope_scaling {} disagree", params->dump(), scaling->dump()));
    if (j.contains("rope_theta") && params->contains("rope_theta") && j["rope_theta"] != (*params)["rope_theta"])
      fail(where, fmt::format("rope_theta {} and rope_parameters.rope_theta {} disagree (transformers 4 reads the one, "
                              "5 the other)",
                              j["rope_theta"].dump(), (*params)["rope_theta"].dump()));
  }
  for (const nlohmann::json* o : {&j, params, scaling})
    if (o && o->value("partial_rotary_factor", 1.0) != 1.0)
      fail(where, fmt::format("partial_rotary_factor is {}: shardtrain rotates the whole head",
                              (*o)["partial_rotary_factor"].dump()));
  const nlohmann::json* spec = params ? params : scaling;
  if (!spec) return;
  const std::string key = params ? "rope_parameters" : "rope_scaling";
  const nlohmann::json& p = *spec;
  const std::string type = type_of(p);
  if (type != "default" && type != "linear" && type != "llama3")
    fail(where,
         fmt::format("{}.rope_type is \"{}\": shardtrain computes the default, linear and llama3 RoPE types", key, type));
  c.rope_scaling = ops::parse_rope_scaling(type);
  const auto need = [&](const char* name) {
    if (!p.contains(name) || !p[name].is_number())
      fail(where, fmt::format("{} of rope_type \"{}\" has no number {}", key, type, name));
    return p[name].get<double>();
  };
  if (c.rope_scaling != ops::RopeScaling::None) c.rope_factor = need("factor");
  if (c.rope_scaling == ops::RopeScaling::Llama3) {
    c.rope_low_freq_factor = need("low_freq_factor");
    c.rope_high_freq_factor = need("high_freq_factor");
    // As transformers 5: a top-level original_max_position_embeddings first, then the rope dict's, then the
    // model's max_position_embeddings.
    c.rope_original_max_position_embeddings =
        j.value("original_max_position_embeddings",
                p.value("original_max_position_embeddings", j.value("max_position_embeddings", int64_t{2048})));
  }
}

// config.json's `key`, a whole number (64.5 was read as 64, a number past int64 as -2^63), or `fallback` when absent
// (or null, where `fallback` is given).
int64_t whole_number(const nlohmann::json& j, const char* key, const std::string& where,
                     std::optional<int64_t> fallback = std::nullopt) {
  if (fallback && (!j.contains(key) || j[key].is_null())) return *fallback;
  if (!j.contains(key)) fail(where, fmt::format("not a Llama config.json: it has no {}", key));
  const nlohmann::json& v = j[key];
  if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{1} << 62)) return v.get<int64_t>();
  fail(where, fmt::format("{} is {}: expected a whole number", key, v.dump()));
}

// A Hugging Face directory: config.json (LlamaConfig fields) and model.safetensors or its shards.
class SafetensorsSource final : public TensorSource {
 public:
  explicit SafetensorsSource(const std::string& dir) : path_(dir) {
    const fs::path cfg = fs::path(dir) / "config.json";
    if (std::error_code ec; !fs::is_regular_file(cfg, ec)) fail(cfg.string(), "not a file: expected a Llama config.json");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::ifstream(cfg));
      if (!j.is_object()) fail(cfg.string(), "not a Llama config.json: expected a JSON object");
      const std::string where = cfg.string();
      if (const std::string type = field(j, "model_type", std::string(), where); type != "llama")
        fail(where,
             fmt::format("model_type is {}: shardtrain reads Llama models (model_type \"llama\") only; other "
                         "architectures (Mistral's sliding window, Qwen2's q/k/v biases, ...) compute what it does not",
                         type.empty() ? std::string("absent") : "\"" + type + "\""));
      config_.vocab_size = whole_number(j, "vocab_size", where);
      config_.hidden_size = whole_number(j, "hidden_size", where);
      config_.intermediate_size = whole_number(j, "intermediate_size", where);
      config_.num_hidden_layers = whole_number(j, "num_hidden_layers", where);
      config_.num_attention_heads = whole_number(j, "num_attention_heads", where);
      config_.num_key_value_heads = whole_number(j, "num_key_value_heads", where, config_.num_attention_heads);
      config_.max_position_embeddings = whole_number(j, "max_position_embeddings", where, int64_t{2048});
      config_.rms_norm_eps = field(j, "rms_norm_eps", 1e-6, where);
      read_rope(j, cfg.string(), config_);
      config_.tie_word_embeddings = field(j, "tie_word_embeddings", false, where);
      // What shardtrain's Llama does not compute: refused, never dropped (their tensors would be ignored).
      if (field(j, "attention_bias", false, where))
        fail(cfg.string(), "attention_bias is true: shardtrain's attention has no biases");
      if (field(j, "mlp_bias", false, where)) fail(cfg.string(), "mlp_bias is true: shardtrain's MLP has no biases");
      if (const std::string act = field(j, "hidden_act", std::string("silu"), where); act != "silu")
        fail(cfg.string(), fmt::format("hidden_act is \"{}\": shardtrain's MLP is SwiGLU (silu)", act));
      if (j.contains("head_dim") && !j["head_dim"].is_null()) {
        const int64_t head_dim = whole_number(j, "head_dim", where);
        if (config_.num_attention_heads > 0 && head_dim != config_.hidden_size / config_.num_attention_heads)
          fail(where, fmt::format("head_dim {} differs from hidden_size / num_attention_heads", head_dim));
      }
    } catch (const nlohmann::json::exception& e) {
      fail(cfg.string(), fmt::format("not a Llama config.json: {}", e.what()));
    } catch (const std::ios_base::failure& e) {
      fail(cfg.string(), fmt::format("cannot read it: {}", e.what()));
    }
    try {
      config_.validate();
    } catch (const ConfigError& e) {
      fail(cfg.string(), e.what());
    }
    if (fs::exists(fs::path(dir) / "tokenizer.json")) {
      tokenizer_ = nlohmann::json{{"name", "tokenizer.json"}, {"path", (fs::path(dir) / "tokenizer.json").string()}}.dump();
    } else if (fs::exists(fs::path(dir) / "vocab.json") && fs::exists(fs::path(dir) / "merges.txt")) {
      // GPT-2's files as the export writes them (a model trained with encoder.json + vocab.bpe): the folder loads.
      tokenizer_ = nlohmann::json{{"name", "gpt2"}, {"path", dir}}.dump();
    }
    for (const std::string& file : weight_files(dir)) read_header(file);
    for (const auto& [tensor, file] : indexed_)
      if (!entries_.count(tensor))
        fail(index_, fmt::format("its weight_map puts '{}' in {}, which does not hold it", tensor, file));
    if (entries_.empty()) fail(dir, "no .safetensors files");
    check_shapes(cfg.string());
  }
  const std::string& path() const override { return path_; }
  const model::LlamaConfig& model_config() const override { return config_; }
  std::string tokenizer() const override { return tokenizer_; }
  bool has(const std::string& name) const override { return entries_.count(name) > 0; }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> names;
    for (const auto& [name, e] : entries_) names.push_back(name);
    return names;
  }
  std::string file_of(const std::string& name) const override {
    auto it = entries_.find(name);
    return it == entries_.end() ? path_ : it->second.file;
  }
  void read(const std::string& name, int64_t begin, std::span<float> out) override {
    auto it = entries_.find(name);
    if (it == entries_.end())
      fail(path_, fmt::format("no tensor named '{}'{}", name,
                              index_.empty() ? std::string() : fmt::format(" (the index {} lists the files)", index_)));
    const Entry& e = it->second;
    if (begin + static_cast<int64_t>(out.size()) > e.numel)
      fail(e.file, fmt::format("'{}' has only {} elements", name, e.numel));
    const size_t esz = e.dtype == "BF16" ? 2 : 4;
    std::ifstream in(e.file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(e.offset + static_cast<uint64_t>(begin) * esz));
    if (esz == 4) {
      in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 4));
    } else {
      std::vector<uint16_t> b(out.size());
      in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size() * 2));
      for (size_t i = 0; i < b.size(); ++i) out[i] = float_from_bf16_bits(b[i]);
    }
    if (!in) fail(e.file, fmt::format("truncated: cannot read '{}'", name));
  }

 private:
  struct Entry {
    std::string file;
    uint64_t offset = 0;  // of the tensor's first byte in the file
    std::string dtype;
    int64_t numel = 1;
    std::vector<int64_t> shape;
  };

  // The files the weights are in: those model.safetensors.index.json's weight_map names (each must be there), or
  // without an index every *.safetensors of the folder. A stray file beside an index (an older export's) was read as
  // well, and the last one listed won a tensor both held: another model's weights, silently.
  std::vector<std::string> weight_files(const std::string& dir) {
    std::vector<std::string> files;
    std::error_code ec;
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index, ec)) {
      index_ = index.string();
      std::set<std::string> named;
      try {
        const nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
        for (const auto& [tensor, file] : j.at("weight_map").items()) {
          const std::string f = file.get<std::string>();
          if (f.empty() || f.find('/') != std::string::npos)
            fail(index_, fmt::format("weight_map: '{}' is not a file name", f));
          named.insert(f);
          indexed_[tensor] = f;
        }
      } catch (const nlohmann::json::exception& e) {
        fail(index_, fmt::format("not a safetensors index: {}", e.what()));
      }
      for (const std::string& f : named) {
        const fs::path path = fs::path(dir) / f;
        if (!fs::exists(path, ec)) fail(index_, fmt::format("names {}, which is not in {}", f, dir));
        files.push_back(path.string());
      }
    } else {
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
      std::sort(files.begin(), files.end());
    }
    for (const std::string& f : files)
      if (!fs::is_regular_file(f, ec))  // a FIFO waited for a writer for ever
        fail(f, "not a regular file: expected a safetensors file");
    return files;
  }

  // One file's header: each tensor's dtype, shape and place, checked as the format defines them: data_offsets
  // [begin, end) relative to the data after the header, end - begin the tensor's bytes, inside the file, no two
  // tensors overlapping. An offset outside the data read the header or another tensor's bytes as weights.
  void read_header(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    unsigned char len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | len[b];
    std::error_code ec;
    const uint64_t size = fs::file_size(file, ec);
    if (!in || ec || n > (uint64_t{1} << 30) || 8 + n > size) fail(file, "not a safetensors file (header length)");
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    const uint64_t data_bytes = size - 8 - n;
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> spans;
    try {
      const nlohmann::json parsed = nlohmann::json::parse(header);  // items() must not outlive it
      for (auto& [name, info] : parsed.items()) {
        if (name == "__metadata__") continue;
        Entry en{file, 0, info.at("dtype").get<std::string>(), 1, {}};
        if (en.dtype != "F32" && en.dtype != "BF16")
          fail(file, fmt::format("'{}' is {} (expected F32 or BF16)", name, en.dtype));
        for (const nlohmann::json& d : info.at("shape")) {
          if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40) ||
              (d.get<uint64_t>() > 0 && static_cast<uint64_t>(en.numel) > (uint64_t{1} << 40) / d.get<uint64_t>()))
            fail(file, fmt::format("'{}' has shape {}: expected sizes from 0, at most 2^40 values in all", name,
                                   info.at("shape").dump()));
          en.shape.push_back(d.get<int64_t>());
          en.numel *= en.shape.back();
        }
        const nlohmann::json& at = info.at("data_offsets");
        if (!at.is_array() || at.size() != 2 || !at[0].is_number_unsigned() || !at[1].is_number_unsigned())
          fail(file, fmt::format("'{}' has data_offsets {}: expected [begin, end]", name, at.dump()));
        const uint64_t begin = at[0].get<uint64_t>(), end = at[1].get<uint64_t>();
        const uint64_t bytes = static_cast<uint64_t>(en.numel) * (en.dtype == "BF16" ? 2 : 4);
        if (end < begin || end - begin != bytes || end > data_bytes)
          fail(file, fmt::format("'{}' has data_offsets [{}, {}]: its {} {} values take {} bytes, within the {} bytes of "
                                 "data after the header",
                                 name, begin, end, en.numel, en.dtype, bytes, data_bytes));
        en.offset = 8 + n + begin;
        if (!index_.empty()) {
          const auto listed = indexed_.find(name);
          if (listed == indexed_.end() || listed->second != fs::path(file).filename().string()) continue;  // not this file's
        }
        if (const auto seen = entries_.find(name); seen != entries_.end())
          fail(file, fmt::format("'{}' is in {} too: which of the two is the model's? (a stray file of another export "
                                 "in the folder?)",
                                 name, seen->second.file));
        if (bytes > 0) spans.push_back({{begin, end}, name});
        entries_[name] = std::move(en);
      }
    } catch (const nlohmann::json::exception& ex) {
      fail(file, fmt::format("malformed header: {}", ex.what()));
    }
    std::sort(spans.begin(), spans.end());
    for (size_t k = 1; k < spans.size(); ++k)
      if (spans[k].first.first < spans[k - 1].first.second)
        fail(file,
             fmt::format("'{}' and '{}' overlap (data_offsets [{}, {}) and [{}, {}))", spans[k - 1].second, spans[k].second,
                         spans[k - 1].first.first, spans[k - 1].first.second, spans[k].first.first, spans[k].first.second));
  }

  // Every tensor the model has is the shape config.json's model needs: a config.json of another shape read the front
  // of each tensor, laid out wrongly (a loss and text from garbage, exit 0), or sized a model far larger than the weights
  // before they were looked at.
  void check_shapes(const std::string& cfg) const {
    const model::ModelSpec spec(config_);
    for (const model::ParamInfo& p : spec.params()) {
      const auto it = entries_.find(p.name);
      if (it == entries_.end() || it->second.shape == p.shape) continue;
      fail(it->second.file, fmt::format("'{}' has shape [{}], but the model {} describes needs [{}]: the configuration "
                                        "and the weights disagree",
                                        p.name, fmt::join(it->second.shape, ", "), cfg, fmt::join(p.shape, ", ")));
    }
  }

  std::string path_, tokenizer_, index_;
  std::map<std::string, std::string> indexed_;  // the index's weight_map: tensor -> file name
  model::LlamaConfig config_;
  std::map<std::string, Entry> entries_;
};

}  // namespace

void check_tokenizer_matches(const data::Tokenizer& tokenizer, const std::string& tokenizer_path, const std::string& record,
                             const model::LlamaConfig& model, const std::string& weights) {
  if (static_cast<int64_t>(tokenizer.vocab_size()) > model.vocab_size)
    throw DataError(
        fmt::format("{}: {} token ids, more than the model's vocabulary of {} ({}): not the tokenizer it was "
                    "trained with",
                    tokenizer_path, tokenizer.vocab_size(), model.vocab_size, weights));
  const auto r = nlohmann::json::parse(record.empty() ? std::string("{}") : record, nullptr, false);
  if (!r.is_object()) return;
  const auto text = [&r](const char* key) {
    return r.contains(key) && r[key].is_string() ? r[key].get<std::string>() : std::string();
  };
  std::string want = text("hash"), want_encoding = text("encoding_hash"), name = text("name");
  if (want.empty()) {
    // A Hugging Face directory records no hash, only its tokenizer.json: that file is the model's tokenizer.
    const std::string path = text("path");
    std::error_code ec;
    if (path.empty() || !fs::exists(path, ec) || fs::equivalent(path, tokenizer_path, ec)) return;
    try {
      const auto shipped = data::Tokenizer::load(path);
      want = shipped.hash();
      want_encoding = shipped.encoding_hash();
      name = path;
    } catch (const DataError&) {
      return;  // unreadable: nothing to compare with (generation then reads the named one, as asked)
    }
  }
  if (!data::same_tokenizer(tokenizer.hash(), tokenizer.encoding_hash(), want, want_encoding))
    throw DataError(
        fmt::format("{}: tokenizer {} is not the one {} was trained with ({}, {}): its ids would mean other "
                    "text; give that tokenizer, or none (the weights name theirs)",
                    tokenizer_path, tokenizer.hash(), weights, name.empty() ? "?" : name, want));
}

std::unique_ptr<TensorSource> open_tensor_source(const std::string& path) {
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "config.json")) return std::make_unique<SafetensorsSource>(path);
    // A save's folder without DONE (one in progress, or killed) is said as checkpoint info and consolidate say it.
    const fs::path named = fs::path(path).lexically_normal();  // "step_N/" names step_N
    if (is_complete(path) || fs::exists(fs::path(path) / "index.h5") ||
        is_save_dir_name((named.has_filename() ? named : named.parent_path()).filename().string()))
      return std::make_unique<CheckpointSource>(path);
    // A folder of checkpoints: its newest; again when a running job's rotation (keep_last) removed that one between
    // the listing and its opening (a "damaged DONE" of a checkpoint that was no more).
    for (int attempt = 1;; ++attempt) {
      const std::string latest = find_latest(path);
      if (latest.empty()) break;
      try {
        return std::make_unique<CheckpointSource>(latest);
      } catch (const CheckpointError&) {
        std::error_code ec;
        if (attempt == 5 || fs::exists(fs::path(latest) / kDoneFile, ec)) throw;
        log::info("{}: removed as it was opened (a running job's rotation?); its folder's newest again", latest);
      }
    }
    fail(path, "not a checkpoint, a directory of checkpoints, or a Hugging Face directory (config.json)");
  }
  if (fs::is_regular_file(path)) {
    // A FULL_STATE_DICT checkpoint's model.h5 holds the weights (and AdamW's moments); what they are (model config,
    // tokenizer, step) is in the index.h5 beside it. It is what --resume's refusal of a file advises to give init_from,
    // and was refused here as "not a consolidated shardtrain file": it is read as its checkpoint, DONE and checksums
    // included.
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    if (fs::path(path).filename() == kFullFile && fs::exists(dir / kIndexFile)) {
      auto checkpoint = std::make_unique<CheckpointSource>(dir.string());
      if (checkpoint->type() == StateDictType::Full) return checkpoint;
    }
    return std::make_unique<ConsolidatedSource>(path);
  }
  fail(path, "no such file or directory");
}

}  // namespace shardtrain::checkpoint
