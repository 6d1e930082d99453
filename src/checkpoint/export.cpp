// Consolidation to HDF5 and export to Hugging Face safetensors.
#include "shardtrain/checkpoint/export.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/files.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/temporaries.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

ExportFormat parse_export_format(std::string_view t) {
  if (t == "hdf5" || t == "h5") return ExportFormat::Hdf5;
  if (t == "safetensors" || t == "hf") return ExportFormat::Safetensors;
  throw UsageError(fmt::format("--format: unknown format '{}' (expected hdf5 or safetensors)", t));
}

namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_bits_from_float(v[i]);
  return out;
}

std::vector<float> read_all(CheckpointReader& r, const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.numel));
  r.read(t.name, "param", 0, v);
  return v;
}

// The temporary an export writes before renaming it into place: a name beside the output that the tool reserved
// itself (created exclusively, with its host and PID: temporary_beside), so a user's `OUT.tmp` is never replaced or
// deleted, and two exports never share one. Removed, with what is in it, unless the export finished: a failure leaves
// nothing behind. One a killed export of this host left (SIGKILL runs no handler) is removed first, and said.
class TempOutput {
 public:
  enum class Kind { File, Folder };

  TempOutput(const std::string& out, Kind kind) : out_(out) {
    for (const std::string& gone : sweep_dead_temporaries(out, {"tmp"}))
      log::warn("{}: removed, the temporary of an export on this host whose process no longer runs (killed?)", gone);
    const std::string first = temporary_beside(out);
    for (int n = 0; n < 1000; ++n) {
      const std::string name = n == 0 ? first : fmt::format("{}-{}", first, n);
      int rc = 0;
      if (kind == Kind::File) {
        const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) ::close(fd);
        rc = fd >= 0 ? 0 : -1;
      } else {
        rc = ::mkdir(name.c_str(), 0755);
      }
      if (rc == 0) {
        path_ = name;
        swept_.emplace(path_);
        return;
      }
      if (errno != EEXIST)
        throw IoError(fmt::format("{}: cannot create the temporary {} {}: {}", out, kind == Kind::File ? "file" : "folder",
                                  name, std::strerror(errno)));
    }
    throw IoError(fmt::format("{}: cannot find a free temporary name beside it ({}-N all exist)", out, first));
  }
  ~TempOutput() {
    if (path_.empty()) return;
    std::error_code ec;  // best effort: an error is already on its way out
    fs::remove_all(path_, ec);
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;

  const std::string& path() const { return path_; }

  // Renames the finished temporary to the output, never over a path that appeared meanwhile (RENAME_NOREPLACE;
  // where the file system lacks it, a check just before the rename).
  void commit() {
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, out_.c_str(), RENAME_NOREPLACE) != 0) {
      const int err = errno;
      if (err == EEXIST || ((err == EINVAL || err == ENOSYS) && fs::exists(out_)))
        throw UsageError(fmt::format("{}: appeared while the export ran; the export never overwrites (nothing kept)", out_));
      if (err != EINVAL && err != ENOSYS)
        throw IoError(
            fmt::format("{}: cannot move the finished export into place from {}: {}", out_, path_, std::strerror(err)));
      fs::rename(path_, out_);
    }
    swept_.reset();
    path_.clear();
  }

 private:
  std::string out_, path_;
  std::optional<SweptOnSignal> swept_;  // removed by a stop signal too (Ctrl-C, a time limit)
};

ExportSummary write_hdf5(CheckpointReader& r, const std::string& out, const ExportOptions& o) {
  ExportSummary s;
  TempOutput tmp(out, TempOutput::Kind::File);
  {
    hdf5::Handle f = hdf5::create_file(tmp.path());
    hdf5::set_attr(f, "format", "shardtrain-consolidated");
    hdf5::set_attr(f, "step", r.step());
    hdf5::set_attr(f, "dtype", dtype_name(o.dtype));
    hdf5::set_attr(f, "model_config", model_config_to_json(r.model_config()));
    hdf5::set_attr(f, "tokenizer", r.tokenizer());
    for (const TensorInfo& t : r.tensors()) {
      const std::vector<float> v = read_all(r, t);
      const hdf5::DatasetOptions opt{std::max<size_t>(1, std::min<size_t>(v.size(), size_t{1} << 20)),
                                     hdf5::Checksum::Fletcher32};
      if (o.dtype == DType::BF16) hdf5::write_u16(f, t.name, to_bf16(v), opt);
      else hdf5::write_f32(f, t.name, v, opt);
      hdf5::set_attr(f, "shape", nlohmann::json(t.shape).dump(), t.name);
      ++s.tensors;
      s.bytes += v.size() * dtype_size(o.dtype);
    }
    hdf5::record_metadata_checksums(f);
    f.close();
  }
  tmp.commit();
  s.files = 1;
  return s;
}

// The special tokens a Hugging Face directory names: the shipped tokenizer's (ids and text), else the ids
// the checkpoint's tokenizer record holds (no text then, and no tokenizer files to name it in).
struct SpecialRoles {
  std::optional<data::SpecialToken> bos, eos, pad;
};

SpecialRoles roles_of(const data::Tokenizer& t) {
  SpecialRoles r;
  const auto role = [&t](std::optional<data::TokenId> id) -> std::optional<data::SpecialToken> {
    if (!id) return std::nullopt;
    for (const data::SpecialToken& s : t.special_tokens())
      if (s.id == *id) return s;
    return data::SpecialToken{std::string(t.token_bytes(*id)), *id};
  };
  r.bos = role(t.bot_id());
  r.eos = role(t.eot_id());
  r.pad = role(t.pad_id());
  return r;
}

SpecialRoles roles_of(const nlohmann::json& record) {
  SpecialRoles r;
  const auto role = [&record](const char* key) -> std::optional<data::SpecialToken> {
    if (!record.contains(key) || !record[key].is_number_integer() || record[key].get<int64_t>() < 0) return std::nullopt;
    return data::SpecialToken{"", record[key].get<data::TokenId>()};
  };
  r.bos = role("bot_id");
  r.eos = role("eot_id");
  return r;
}

// bos/eos/pad ids, in config.json and generation_config.json alike; null where the tokenizer has none (left out,
// transformers' LlamaConfig took its default bos_token_id 1: GPT-2's '"').
void add_special_ids(nlohmann::json& j, const SpecialRoles& roles) {
  auto id = [](const auto& token) { return token ? nlohmann::json(token->id) : nlohmann::json(nullptr); };
  j["bos_token_id"] = id(roles.bos);
  j["eos_token_id"] = id(roles.eos);
  j["pad_token_id"] = id(roles.pad);
}

// RoPE as transformers 5 writes it (rope_parameters: the type, the base and the type's parameters); a
// scaled one also as 4.x read it (rope_scaling: the same without the base, which 4.x took from rope_theta).
nlohmann::json hf_rope_parameters(const model::LlamaConfig& c) {
  nlohmann::json p = {{"rope_type", ops::rope_scaling_name(c.rope_scaling)}, {"rope_theta", c.rope_theta}};
  if (c.rope_scaling != ops::RopeScaling::None) p["factor"] = c.rope_factor;
  if (c.rope_scaling == ops::RopeScaling::Llama3) {
    p["low_freq_factor"] = c.rope_low_freq_factor;
    p["high_freq_factor"] = c.rope_high_freq_factor;
    p["original_max_position_embeddings"] = c.rope_original_max_position_embeddings;
  }
  return p;
}

// Hugging Face's LlamaConfig fields.
nlohmann::json hf_config(const model::LlamaConfig& c, DType dtype, const SpecialRoles& roles) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads},
                      {"head_dim", c.head_dim()},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"rms_norm_eps", c.rms_norm_eps},
                      {"rope_theta", c.rope_theta},  // transformers 4.x reads this, 5.x rope_parameters
                      {"rope_parameters", hf_rope_parameters(c)},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"hidden_act", "silu"},
                      {"attention_bias", false},
                      {"attention_dropout", 0.0},
                      {"mlp_bias", false},
                      {"initializer_range", c.init_std},
                      {"pretraining_tp", 1},
                      {"use_cache", true},
                      {"torch_dtype", dtype == DType::BF16 ? "bfloat16" : "float32"}};
  if (c.rope_scaling != ops::RopeScaling::None) {
    j["rope_scaling"] = j["rope_parameters"];
    j["rope_scaling"].erase("rope_theta");
  }
  add_special_ids(j, roles);
  return j;
}

// What transformers' generate() reads first: the same ids, so decoding stops at the end-of-text token.
nlohmann::json hf_generation_config(const SpecialRoles& roles) {
  nlohmann::json j = {{"_from_model_config", true}};
  add_special_ids(j, roles);
  return j;
}

std::ofstream open_for_writing(const fs::path& p, std::ios::openmode mode = std::ios::out) {
  errno = 0;
  std::ofstream out(p, mode);
  if (!out) throw IoError(fmt::format("{}: cannot create{}", p.string(), os_reason()));
  return out;
}

// Closes a file written through `out` and flushes it to disk. The close writes what the stream still buffers: a file's
// last block. Unchecked, a full disk could leave a short file in an output published as complete.
void close_written(std::ofstream& out, const fs::path& p) {
  errno = 0;
  out.close();
  if (!out) throw IoError(fmt::format("{}: cannot write{}", p.string(), os_reason()));
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  const int rc = fd < 0 ? -1 : ::fsync(fd);
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (rc != 0) throw IoError(fmt::format("{}: cannot flush it to disk: {}", p.string(), std::strerror(err)));
}

// Each call checked and flushed (write_file_whole): through a stream checked before its close, a full disk left a short
// config.json in an output published as complete.
void write_json(const fs::path& p, const nlohmann::json& j) {
  write_file_whole(p.string(), j.dump(2) + "\n", p.filename().string());
}

// tokenizer_config.json: the class AutoTokenizer builds, the special tokens by their text (without them
// the tokenizer has no eos_token and no pad_token), the model's length, and no clean-up of spaces on decode
// (byte-level BPE decodes exactly; transformers' clean-up would change " ." into ".").
nlohmann::json hf_tokenizer_config(const char* tokenizer_class, const SpecialRoles& roles, int64_t max_positions) {
  nlohmann::json j = {
      {"tokenizer_class", tokenizer_class}, {"model_max_length", max_positions}, {"clean_up_tokenization_spaces", false}};
  if (roles.bos) j["bos_token"] = roles.bos->content;
  if (roles.eos) j["eos_token"] = roles.eos->content;
  if (roles.pad) j["pad_token"] = roles.pad->content;
  return j;
}

struct ShippedTokenizer {
  std::string note;
  std::optional<SpecialRoles> roles;  // when tokenizer files were shipped
};

// `from` copied to `to` through write_file_whole: std::filesystem::copy_file turned a full disk's short write into
// "Input/output error"; this names the file system's reason (No space left on device).
void copy_whole(const fs::path& from, const fs::path& to, std::string_view what) {
  std::ifstream in(from, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw IoError(fmt::format("{}: cannot read {}", from.string(), what));
  write_file_whole(to.string(), text.str(), what);
}

// Ships the tokenizer, already loaded and checked against the weights, in a form transformers reads:
// tokenizer.json as is, GPT-2's encoder.json + vocab.bpe as vocab.json + merges.txt. A tiktoken rank file has
// no Hugging Face equivalent file.
ShippedTokenizer ship_tokenizer(const std::string& source, const data::Tokenizer& tokenizer, const fs::path& out,
                                int64_t max_positions) {
  const fs::path src(source);
  const fs::path json = fs::is_directory(src) ? src / "tokenizer.json" : src;
  const fs::path dir = fs::is_directory(src) ? src : src.parent_path();
  const char* cls = nullptr;
  std::string note;
  if (fs::is_regular_file(json) && json.extension() == ".json" && json.filename() != "encoder.json") {
    copy_whole(json, out / "tokenizer.json", "the tokenizer");
    cls = "PreTrainedTokenizerFast";
    note = fmt::format("tokenizer.json copied from {}", json.string());
  } else if (fs::is_regular_file(dir / "encoder.json") && fs::is_regular_file(dir / "vocab.bpe")) {
    copy_whole(dir / "encoder.json", out / "vocab.json", "the tokenizer's vocabulary");
    copy_whole(dir / "vocab.bpe", out / "merges.txt", "the tokenizer's merges");
    cls = "GPT2Tokenizer";
    note = fmt::format("GPT-2 vocab.json and merges.txt copied from {}", dir.string());
  } else {
    return {fmt::format("{} has no Hugging Face form (not a tokenizer.json or GPT-2 encoder.json/vocab.bpe): none shipped",
                        source),
            std::nullopt};
  }
  const SpecialRoles roles = roles_of(tokenizer);
  write_json(out / "tokenizer_config.json", hf_tokenizer_config(cls, roles, max_positions));
  return {note, roles};
}

// The tokenizer to ship and why: one the user named must load and fit the weights (DataError otherwise); the one
// the checkpoint records (found at `recorded`, else at its recorded path) is shipped only when it loads and is still
// the file the weights were trained with, else the note says why none was.
ShippedTokenizer ship_tokenizer_for(const ExportOptions& o, const nlohmann::json& record, const std::string& record_text,
                                    const model::LlamaConfig& config, const std::string& weights, const fs::path& out) {
  if (!o.tokenizer.empty()) {
    std::optional<data::Tokenizer> tok;
    try {
      tok.emplace(data::Tokenizer::load(o.tokenizer));
    } catch (const DataError& e) {
      throw DataError(fmt::format("--tokenizer {}: cannot be read: {}", o.tokenizer, e.what()));
    }
    // Unchecked skips the comparison with the checkpoint's tokenizer (another file form of it), never the size: more
    // ids than the model's vocabulary wrote an eos_token_id past it into config.json.
    check_tokenizer_matches(*tok, o.tokenizer, o.tokenizer_check == TokenizerCheck::Match ? record_text : std::string(),
                            config, weights);
    return ship_tokenizer(o.tokenizer, *tok, out, config.max_position_embeddings);
  }
  const std::string source = !o.recorded_tokenizer.empty() ? o.recorded_tokenizer : record.value("path", std::string());
  if (source.empty()) return {"no tokenizer recorded: none shipped (pass --tokenizer)", std::nullopt};
  try {
    const data::Tokenizer tok = data::Tokenizer::load(source);
    check_tokenizer_matches(tok, source, record_text, config, weights);
    return ship_tokenizer(source, tok, out, config.max_position_embeddings);
  } catch (const DataError& e) {
    return {fmt::format("the checkpoint's tokenizer cannot be shipped ({}): none shipped (pass --tokenizer)", e.what()),
            std::nullopt};
  }
}

// Reads one tensor's values in full: from a checkpoint, or from memory.
using ReadTensor = std::function<std::vector<float>(const TensorInfo&)>;

// One safetensors file: the header (8-byte little-endian length, JSON padded to 8 bytes), then every
// tensor's data in order. Returns the bytes of tensor data.
uint64_t write_safetensors_at(const fs::path& path, const std::vector<const TensorInfo*>& tensors, const ReadTensor& read,
                              DType dtype) {
  const size_t esz = dtype_size(dtype);
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  uint64_t at = 0;
  for (const TensorInfo* t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t->numel) * esz;
    header[t->name] = {
        {"dtype", dtype == DType::BF16 ? "BF16" : "F32"}, {"shape", t->shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream out = open_for_writing(path, std::ios::binary);
  const uint64_t n = text.size();
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>((n >> (8 * b)) & 0xff));  // little-endian u64
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorInfo* t : tensors) {
    const std::vector<float> v = read(*t);
    if (static_cast<int64_t>(v.size()) != t->numel)
      throw InternalError(fmt::format("{}: {} holds {} values, its shape {}", path.string(), t->name, v.size(), t->numel));
    if (dtype == DType::BF16) {
      const std::vector<uint16_t> b = to_bf16(v);
      out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size() * 2));
    } else {
      out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    }
    // Said at once, while errno is the write's: the next tensor's read sets it again.
    if (!out) throw IoError(fmt::format("{}: cannot write {}{}", path.string(), t->name, os_reason()));
  }
  close_written(out, path);
  return at;
}

// The Hugging Face directory, written in a temporary folder and renamed when complete. `tokenizer_record` is the
// weights' tokenizer JSON ("" = none); `weights` names them in messages.
ExportSummary write_hf_directory(const std::vector<TensorInfo>& tensors, const ReadTensor& read,
                                 const model::LlamaConfig& config, const std::string& tokenizer_record,
                                 const std::string& weights, const std::string& out_dir, const ExportOptions& o) {
  TempOutput tmp_dir(out_dir, TempOutput::Kind::Folder);
  const fs::path tmp = tmp_dir.path();
  nlohmann::json tok = nlohmann::json::object();
  if (!tokenizer_record.empty()) tok = nlohmann::json::parse(tokenizer_record, nullptr, false);
  if (!tok.is_object()) tok = nlohmann::json::object();
  // The tokenizer first: a wrong one named on the command line is refused before the weights are written.
  const ShippedTokenizer shipped = ship_tokenizer_for(o, tok, tokenizer_record, config, weights, tmp);
  const size_t esz = dtype_size(o.dtype);
  // Plan the files: tensors in registry order, a new file once the limit would be passed.
  std::vector<std::vector<const TensorInfo*>> files(1);
  uint64_t in_file = 0, total = 0;
  for (const TensorInfo& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel) * esz;
    if (in_file > 0 && in_file + bytes > o.max_shard_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(&t);
    in_file += bytes;
    total += bytes;
  }
  ExportSummary s;
  nlohmann::json weight_map;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const std::string name =
        files.size() == 1 ? "model.safetensors" : fmt::format("model-{:05}-of-{:05}.safetensors", fi + 1, files.size());
    for (const TensorInfo* t : files[fi]) weight_map[t->name] = name;
    write_safetensors_at(tmp / name, files[fi], read, o.dtype);
    s.tensors += static_cast<int64_t>(files[fi].size());
  }
  if (files.size() > 1)
    write_json(tmp / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  s.tokenizer_note = shipped.note;
  const SpecialRoles roles = shipped.roles ? *shipped.roles : roles_of(tok);
  write_json(tmp / "config.json", hf_config(config, o.dtype, roles));
  write_json(tmp / "generation_config.json", hf_generation_config(roles));
  tmp_dir.commit();
  s.bytes = total;
  s.files = static_cast<int>(files.size());
  return s;
}

// The output as given, checked before any work: a name (not ""), for HDF5 a file (no trailing slash), for
// safetensors a folder whose trailing slashes are dropped ("hf/" is "hf", not "hf/" + ".tmp"); never an existing
// path. Returns the name to write.
std::string checked_output(const std::string& output, ExportFormat format) {
  if (output.empty()) throw UsageError("--output: expected a file or folder name, got \"\"");
  fs::path p(output);
  while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "hf/" and "hf//" are "hf"
  if (fs::exists(p) || fs::is_symlink(p))
    throw UsageError(fmt::format("{}: already exists; consolidation never overwrites", output));
  if (!p.has_filename() || p.filename() == "." || p.filename() == "..")
    throw UsageError(fmt::format("--output {}: expected a new file or folder name", output));
  if (format == ExportFormat::Hdf5 && p.string() != output)
    throw UsageError(fmt::format("--output {}: a folder name, but --format hdf5 writes one file", output));
  return p.string();
}

void check_export_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16) {
    throw UsageError(fmt::format("--dtype: {} is not supported (expected fp32 or bf16)", dtype_name(dtype)));
  }
}

// In-memory tensors as the writers take them: infos, and a reader that copies the values.
std::vector<TensorInfo> infos_of(std::span<const FullTensor> tensors) {
  std::vector<TensorInfo> infos;
  for (const FullTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (numel != static_cast<int64_t>(t.values.size()))
      throw InternalError(fmt::format("export: {} holds {} values, its shape ({}) {}", t.name, t.values.size(),
                                      fmt::join(t.shape, ", "), numel));
    infos.push_back(TensorInfo{t.name, t.shape, numel});
  }
  return infos;
}

ReadTensor reader_of(std::span<const FullTensor> tensors) {
  return [tensors](const TensorInfo& info) {
    for (const FullTensor& t : tensors)
      if (t.name == info.name) return std::vector<float>(t.values.begin(), t.values.end());
    throw InternalError(fmt::format("export: no tensor {}", info.name));
  };
}

}  // namespace

ExportSummary consolidate(const std::string& checkpoint_dir, const std::string& output, const ExportOptions& o) {
  check_export_dtype(o.dtype);
  const std::string out = checked_output(output, o.format);
  if (o.format == ExportFormat::Hdf5 && !o.tokenizer.empty())
    throw UsageError(
        fmt::format("--tokenizer {}: only --format safetensors ships a tokenizer (an HDF5 file records the "
                    "checkpoint's own, as its tokenizer attribute)",
                    o.tokenizer));
  CheckpointReader reader(checkpoint_dir);
  if (o.format == ExportFormat::Hdf5) return write_hdf5(reader, out, o);
  return write_hf_directory(
      reader.tensors(), [&reader](const TensorInfo& t) { return read_all(reader, t); }, reader.model_config(),
      reader.tokenizer(), reader.path(), out, o);
}

ExportSummary export_hf_directory(const model::LlamaConfig& config, std::span<const FullTensor> tensors,
                                  const std::string& out_dir, const ExportOptions& o) {
  check_export_dtype(o.dtype);
  const std::string out = checked_output(out_dir, ExportFormat::Safetensors);
  return write_hf_directory(infos_of(tensors), reader_of(tensors), config, "", "the exported weights", out, o);
}

uint64_t write_safetensors_file(const std::string& path, std::span<const FullTensor> tensors, DType dtype) {
  check_export_dtype(dtype);
  if (fs::exists(path)) throw UsageError(fmt::format("{}: already exists; the export never overwrites", path));
  const std::vector<TensorInfo> infos = infos_of(tensors);
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : infos) order.push_back(&t);
  return write_safetensors_at(path, order, reader_of(tensors), dtype);
}

}  // namespace shardtrain::checkpoint
