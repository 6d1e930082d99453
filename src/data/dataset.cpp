// Writing and reading token datasets (dataset.hpp) through the runtime's HDF5 helpers.
#include "shardtrain/data/dataset.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "shardtrain/data/sampler.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/hdf5.hpp"

namespace shardtrain::data {

DatasetSplit parse_dataset_split(const std::string& s) {
  if (s == "train") return DatasetSplit::Train;
  if (s == "validation" || s == "val") return DatasetSplit::Validation;
  throw UsageError(fmt::format("unknown split '{}': expected train or validation", s));
}

const char* dataset_split_name(DatasetSplit s) { return s == DatasetSplit::Train ? "train" : "validation"; }

DatasetInfo dataset_info_for(const Tokenizer& tokenizer) {
  DatasetInfo info;
  info.tokenizer_name = tokenizer.name();
  info.tokenizer_path = tokenizer.path();
  info.tokenizer_hash = tokenizer.hash();
  info.tokenizer_format = tokenizer_format_name(tokenizer.format());
  info.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  info.eot_id = tokenizer.eot_id();
  info.bot_id = tokenizer.bot_id();
  info.pad_id = tokenizer.pad_id();
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& s : tokenizer.special_tokens()) specials[s.content] = s.id;
  info.special_tokens_json = specials.dump();
  return info;
}

std::vector<int64_t> choose_validation_documents(size_t num_documents, double fraction, uint64_t seed) {
  if (fraction < 0 || fraction >= 1) throw UsageError(fmt::format("validation fraction {} is outside [0, 1)", fraction));
  size_t n = static_cast<size_t>(std::llround(fraction * static_cast<double>(num_documents)));
  if (fraction > 0 && num_documents >= 2) n = std::max<size_t>(n, 1);
  n = std::min(n, num_documents > 0 ? num_documents - 1 : 0);
  const auto order = shuffled_indices(num_documents, seed ^ 0x76616c6964ull);
  std::vector<int64_t> out(order.begin(), order.begin() + static_cast<ptrdiff_t>(n));
  std::sort(out.begin(), out.end());
  return out;
}

void write_dataset(const std::string& path, std::span<const TokenId> tokens, std::span<const int64_t> doc_offsets,
                   const DatasetInfo& info) {
  const size_t docs = doc_offsets.size() - 1;
  const auto validation = choose_validation_documents(docs, info.validation_fraction, info.split_seed);
  std::vector<int64_t> train;
  train.reserve(docs - validation.size());
  for (size_t d = 0, v = 0; d < docs; ++d) {
    if (v < validation.size() && validation[v] == static_cast<int64_t>(d)) ++v;
    else train.push_back(static_cast<int64_t>(d));
  }
  auto f = hdf5::create_file(path);
  const hdf5::DatasetOptions checked{.chunk_elements = 1 << 20, .checksum = hdf5::Checksum::Fletcher32};
  hdf5::write_u32(f, "tokens", tokens, checked);
  hdf5::write_i64(f, "doc_offsets", doc_offsets, checked);
  auto split = hdf5::create_group(f, "split");
  hdf5::write_i64(split, "train", train, checked);
  hdf5::write_i64(split, "validation", validation, checked);
  hdf5::set_attr(f, "format", std::string(kDatasetFormat));
  hdf5::set_attr(f, "format_version", kDatasetFormatVersion);
  hdf5::set_attr(f, "tokenizer_name", info.tokenizer_name);
  hdf5::set_attr(f, "tokenizer_path", info.tokenizer_path);
  hdf5::set_attr(f, "tokenizer_hash", info.tokenizer_hash);
  hdf5::set_attr(f, "tokenizer_format", info.tokenizer_format);
  hdf5::set_attr(f, "vocab_size", info.vocab_size);
  hdf5::set_attr(f, "eot_id", info.eot_id ? int64_t{*info.eot_id} : int64_t{-1});
  hdf5::set_attr(f, "bot_id", info.bot_id ? int64_t{*info.bot_id} : int64_t{-1});
  hdf5::set_attr(f, "pad_id", info.pad_id ? int64_t{*info.pad_id} : int64_t{-1});
  hdf5::set_attr(f, "special_tokens", info.special_tokens_json);
  hdf5::set_attr(f, "sources", nlohmann::json(info.sources).dump());
  hdf5::set_attr(f, "num_documents", static_cast<int64_t>(docs));
  hdf5::set_attr(f, "num_tokens", static_cast<int64_t>(tokens.size()));
  hdf5::set_attr(f, "validation_fraction_ppm", static_cast<int64_t>(std::llround(info.validation_fraction * 1e6)));
  hdf5::set_attr(f, "split_seed", static_cast<int64_t>(info.split_seed));
  split = hdf5::Handle();
  f.close();
}

namespace {
std::string required_string(const hdf5::Handle& f, const std::string& path, const char* name) {
  auto v = hdf5::get_attr_string(f, name);
  if (!v) throw DataError(fmt::format("{}: attribute '{}' is missing (not a shardtrain dataset?)", path, name));
  return *v;
}
int64_t required_int(const hdf5::Handle& f, const std::string& path, const char* name) {
  auto v = hdf5::get_attr_int(f, name);
  if (!v) throw DataError(fmt::format("{}: attribute '{}' is missing (not a shardtrain dataset?)", path, name));
  return *v;
}
std::optional<TokenId> optional_id(int64_t v) {
  return v < 0 ? std::nullopt : std::optional<TokenId>(static_cast<TokenId>(v));
}
}  // namespace

TokenDataset TokenDataset::open(const std::string& path) {
  TokenDataset ds;
  ds.path_ = path;
  auto f = hdf5::open_file(path, hdf5::FileMode::ReadOnly);
  const std::string format = required_string(f, path, "format");
  if (format != kDatasetFormat)
    throw DataError(fmt::format("{}: attribute 'format' is '{}', expected '{}'", path, format, kDatasetFormat));
  const int64_t version = required_int(f, path, "format_version");
  if (version != kDatasetFormatVersion)
    throw DataError(fmt::format("{}: format_version {} is not supported (this build reads {})", path, version,
                                kDatasetFormatVersion));
  auto& info = ds.info_;
  info.tokenizer_name = required_string(f, path, "tokenizer_name");
  info.tokenizer_path = hdf5::get_attr_string(f, "tokenizer_path").value_or("");
  info.tokenizer_hash = required_string(f, path, "tokenizer_hash");
  info.tokenizer_format = hdf5::get_attr_string(f, "tokenizer_format").value_or("");
  info.vocab_size = required_int(f, path, "vocab_size");
  info.eot_id = optional_id(required_int(f, path, "eot_id"));
  info.bot_id = optional_id(hdf5::get_attr_int(f, "bot_id").value_or(-1));
  info.pad_id = optional_id(hdf5::get_attr_int(f, "pad_id").value_or(-1));
  info.special_tokens_json = hdf5::get_attr_string(f, "special_tokens").value_or("{}");
  try {
    info.sources = nlohmann::json::parse(hdf5::get_attr_string(f, "sources").value_or("[]")).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception&) {
    throw DataError(fmt::format("{}: attribute 'sources' is not a JSON list of strings", path));
  }
  info.validation_fraction = static_cast<double>(hdf5::get_attr_int(f, "validation_fraction_ppm").value_or(0)) / 1e6;
  info.split_seed = static_cast<uint64_t>(hdf5::get_attr_int(f, "split_seed").value_or(0));

  ds.tokens_ = hdf5::read_u32(f, "tokens");
  ds.offsets_ = hdf5::read_i64(f, "doc_offsets");
  ds.train_ = hdf5::read_i64(f, "split/train");
  ds.validation_ = hdf5::read_i64(f, "split/validation");

  const auto& off = ds.offsets_;
  if (off.empty() || off.front() != 0 || off.back() != static_cast<int64_t>(ds.tokens_.size()))
    throw DataError(fmt::format("{}: doc_offsets must start at 0 and end at the token count {}", path, ds.tokens_.size()));
  for (size_t i = 1; i < off.size(); ++i)
    if (off[i] < off[i - 1]) throw DataError(fmt::format("{}: doc_offsets decrease at document {}", path, i - 1));
  const size_t docs = off.size() - 1;
  std::vector<char> seen(docs, 0);
  for (const auto* list : {&ds.train_, &ds.validation_}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const int64_t d = (*list)[i];
      if (d < 0 || static_cast<size_t>(d) >= docs || (i > 0 && d <= (*list)[i - 1]) || seen[static_cast<size_t>(d)]++)
        throw DataError(fmt::format("{}: split lists must hold ascending, disjoint document indices in [0, {}); bad entry {}",
                                    path, docs, d));
    }
  }
  const auto max_token = std::max_element(ds.tokens_.begin(), ds.tokens_.end());
  if (max_token != ds.tokens_.end() && static_cast<int64_t>(*max_token) >= info.vocab_size)
    throw DataError(fmt::format("{}: token id {} is outside the vocabulary (vocab_size {})", path, *max_token, info.vocab_size));
  return ds;
}

std::span<const TokenId> TokenDataset::document(size_t d) const {
  if (d + 1 >= offsets_.size()) throw DataError(fmt::format("{}: document {} out of range ({})", path_, d, num_documents()));
  return std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(offsets_[d]),
                                                   static_cast<size_t>(offsets_[d + 1] - offsets_[d]));
}

void TokenDataset::check_tokenizer(const Tokenizer& tokenizer) const {
  if (tokenizer.hash() != info_.tokenizer_hash)
    throw DataError(fmt::format("{}: made with tokenizer {} ({}), but {} ({}) was given", path_, info_.tokenizer_name,
                                info_.tokenizer_hash, tokenizer.name(), tokenizer.hash()));
}

}  // namespace shardtrain::data
