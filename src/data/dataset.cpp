// Writing and reading token datasets (dataset.hpp) through the runtime's HDF5 helpers.
#include "shardtrain/data/dataset.hpp"

#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>

#include "shardtrain/data/output_file.hpp"
#include "shardtrain/data/sampler.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "splitmix.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "tokenizer_model.hpp"

namespace shardtrain::data {

DatasetSplit parse_dataset_split(const std::string& s) {
  if (s == "train") return DatasetSplit::Train;
  if (s == "validation" || s == "val") return DatasetSplit::Validation;
  throw UsageError(fmt::format("unknown split '{}': expected train or validation", s));
}

const char* dataset_split_name(DatasetSplit s) { return s == DatasetSplit::Train ? "train" : "validation"; }

SplitBy parse_split_by(const std::string& s) {
  if (s == "shuffle") return SplitBy::Shuffle;
  if (s == "content") return SplitBy::Content;
  throw UsageError(fmt::format("unknown validation split '{}': expected shuffle or content", s));
}

const char* split_by_name(SplitBy s) { return s == SplitBy::Shuffle ? "shuffle" : "content"; }

DatasetInfo dataset_info_for(const Tokenizer& tokenizer) {
  DatasetInfo info;
  info.tokenizer_name = tokenizer.name();
  info.tokenizer_path = tokenizer.path();
  info.tokenizer_hash = tokenizer.hash();
  info.tokenizer_encoding_hash = tokenizer.encoding_hash();
  info.tokenizer_format = tokenizer_format_name(tokenizer.format());
  info.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  info.eot_id = tokenizer.eot_id();
  info.bot_id = tokenizer.bot_id();
  info.pad_id = tokenizer.pad_id();
  nlohmann::json specials = nlohmann::json::object();
  for (const auto& s : tokenizer.special_tokens()) specials[s.content] = s.id;
  info.special_tokens_json = json_text(specials);
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

uint64_t content_hash_start(uint64_t seed) { return detail::mix64(seed ^ 0x636f6e74656e74ull); }
uint64_t content_hash_add(uint64_t state, TokenId id) { return detail::mix64((state ^ id) + 0x9e3779b97f4a7c15ull); }
uint64_t document_content_hash(std::span<const TokenId> ids, uint64_t seed) {
  uint64_t h = content_hash_start(seed);
  for (const TokenId id : ids) h = content_hash_add(h, id);
  return h;
}

std::vector<int64_t> choose_validation_by_content(std::span<const uint64_t> hashes, double fraction) {
  if (fraction < 0 || fraction >= 1) throw UsageError(fmt::format("validation fraction {} is outside [0, 1)", fraction));
  const auto below = [&](uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-53 < fraction; };
  std::vector<int64_t> out;
  for (size_t d = 0; d < hashes.size(); ++d)
    if (below(hashes[d])) out.push_back(static_cast<int64_t>(d));
  if (hashes.size() < 2) return fraction > 0 && hashes.size() == 1 ? std::vector<int64_t>{} : out;
  const auto by_hash = [&](int64_t a, int64_t b) {
    return hashes[static_cast<size_t>(a)] != hashes[static_cast<size_t>(b)]
               ? hashes[static_cast<size_t>(a)] < hashes[static_cast<size_t>(b)]
               : a < b;
  };
  if (fraction > 0 && out.empty()) {  // a small corpus: the document with the smallest hash
    int64_t best = 0;
    for (size_t d = 1; d < hashes.size(); ++d)
      if (by_hash(static_cast<int64_t>(d), best)) best = static_cast<int64_t>(d);
    out.push_back(best);
  }
  if (out.size() == hashes.size())  // every one: the largest hash trains
    out.erase(std::max_element(out.begin(), out.end(), by_hash));
  return out;
}

uint64_t fletcher64(std::span<const uint32_t> words) {
  constexpr uint64_t kMod = 0xffffffffull;
  // Both sums start below 2^32; 92679 words keep the second below 2^64 before it is reduced.
  constexpr size_t kRun = 92679;
  uint64_t a = 0, b = 0;
  for (size_t i = 0; i < words.size();) {
    const size_t end = std::min(words.size(), i + kRun);
    for (; i < end; ++i) {
      a += words[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
  }
  return (b << 32) | a;
}

namespace detail {

// The tokens' memory. A mapping covers whole pages around the tokens; `checked` has one flag per checksum block.
struct TokenStorage {
  std::vector<TokenId> owned;
  void* map = nullptr;
  size_t map_bytes = 0;
  std::vector<int64_t> sums;  // format 2: one per block
  std::unique_ptr<std::atomic<bool>[]> checked;
  int64_t block = kChecksumBlockTokens;
  // The mapped file, kept open with its size and modification time at open, so that a rewrite in place can be
  // told from the rename prepare-data does (which leaves this file, its inode, as it was).
  int fd = -1;
  struct stat opened {};
  std::mutex changes;  // check_unchanged, from every loader thread
  timespec mtime_seen{};
  std::atomic<bool> modified{false};  // its modification time changed: blocks are checked again
  int noted = -1;                     // failure_record's handle for the mapping: a SIGBUS in it names the file

  TokenStorage() = default;
  TokenStorage(const TokenStorage&) = delete;
  TokenStorage& operator=(const TokenStorage&) = delete;
  ~TokenStorage() {
    failure_record::forget_mapped_file(noted);
    if (map) munmap(map, map_bytes);
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace detail

namespace {

// Maps `count` uint32 tokens at byte `offset` of `path`, read-only and shared.
std::span<const TokenId> map_tokens(detail::TokenStorage& st, const std::string& path, uint64_t offset, size_t count) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open to map its tokens: {}", path, std::strerror(errno)));
  st.fd = fd;  // closed with the storage
  struct stat& sb = st.opened;
  const uint64_t bytes = static_cast<uint64_t>(count) * sizeof(TokenId);
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < offset + bytes)
    throw DataError(fmt::format("{}: the file ends before its {} tokens do (truncated: prepare it again)", path, count));
  st.mtime_seen = sb.st_mtim;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  st.map_bytes = static_cast<size_t>(offset + bytes - start);
  void* m = mmap(nullptr, st.map_bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  const int err = errno;
  if (m == MAP_FAILED) throw DataError(fmt::format("{}: cannot map its tokens: {}", path, std::strerror(err)));
  st.map = m;
  st.noted = failure_record::note_mapped_file(m, st.map_bytes, path);
  return {reinterpret_cast<const TokenId*>(static_cast<const char*>(m) + (offset - start)), count};
}

}  // namespace

namespace {

// The root group's attributes, what a reader believes about the tokens. Stored dense (create_file), as the
// attribute heap holds any size: `sources` of 1024 C4 shards under a long path, or `special_tokens` of a
// tokenizer with 3000 reserved tokens, passed the 64 KiB a compact attribute may hold.
void write_dataset_attributes(const hdf5::Handle& f, const DatasetInfo& info, size_t docs, size_t num_tokens) {
  hdf5::set_attr(f, "format", std::string(kDatasetFormat));
  hdf5::set_attr(f, "format_version", kDatasetFormatVersion);
  hdf5::set_attr(f, "tokenizer_name", info.tokenizer_name);
  hdf5::set_attr(f, "tokenizer_path", info.tokenizer_path);
  hdf5::set_attr(f, "tokenizer_hash", info.tokenizer_hash);
  if (!info.tokenizer_encoding_hash.empty()) hdf5::set_attr(f, "tokenizer_encoding_hash", info.tokenizer_encoding_hash);
  hdf5::set_attr(f, "tokenizer_format", info.tokenizer_format);
  hdf5::set_attr(f, "vocab_size", info.vocab_size);
  hdf5::set_attr(f, "eot_id", info.eot_id ? int64_t{*info.eot_id} : int64_t{-1});
  hdf5::set_attr(f, "bot_id", info.bot_id ? int64_t{*info.bot_id} : int64_t{-1});
  hdf5::set_attr(f, "pad_id", info.pad_id ? int64_t{*info.pad_id} : int64_t{-1});
  hdf5::set_attr(f, "special_tokens", info.special_tokens_json);
  hdf5::set_attr(f, "sources", json_text(nlohmann::json(info.sources)));
  hdf5::set_attr(f, "num_documents", static_cast<int64_t>(docs));
  hdf5::set_attr(f, "num_tokens", static_cast<int64_t>(num_tokens));
  hdf5::set_attr(f, "validation_fraction_ppm", static_cast<int64_t>(std::llround(info.validation_fraction * 1e6)));
  hdf5::set_attr(f, "split_seed", static_cast<int64_t>(info.split_seed));
  hdf5::set_attr(f, "split_by", std::string(split_by_name(info.split_by)));
}

}  // namespace

void check_dataset_metadata_fits(const std::string& path, const DatasetInfo& info) {
  try {
    const auto f = hdf5::create_memory_file(path + ".metadata-check", hdf5::AttributeStorage::Dense);
    write_dataset_attributes(f, info, 0, 0);
  } catch (const Error& e) {
    throw DataError(fmt::format("{}: the dataset's metadata cannot be stored ({}); nothing was tokenized", path, e.what()));
  }
}

size_t write_dataset(const std::string& path, std::span<const TokenId> tokens, std::span<const int64_t> doc_offsets,
                     const DatasetInfo& info, ExistingOutput existing) {
  return write_dataset(
      path, tokens.size(),
      [&](size_t offset, std::span<TokenId> out) {
        std::copy_n(tokens.begin() + static_cast<ptrdiff_t>(offset), out.size(), out.begin());
      },
      doc_offsets, info, existing);
}

size_t write_dataset(const std::string& path, size_t num_tokens, const TokenFill& fill, std::span<const int64_t> doc_offsets,
                     const DatasetInfo& info, ExistingOutput existing) {
  if (doc_offsets.empty() || doc_offsets.front() != 0 || doc_offsets.back() != static_cast<int64_t>(num_tokens))
    throw InternalError(fmt::format("write_dataset({}): doc_offsets must run from 0 to the {} tokens", path, num_tokens));
  const size_t docs = doc_offsets.size() - 1;
  // SplitBy::Content: each document's hash, taken from the tokens as they stream past.
  const bool by_content = info.split_by == SplitBy::Content;
  std::vector<uint64_t> hashes(by_content ? docs : 0);
  size_t doc = 0;
  uint64_t hash = content_hash_start(info.split_seed);
  const auto hash_tokens = [&](size_t at, std::span<const TokenId> ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
      while (doc < docs && static_cast<int64_t>(at + i) >= doc_offsets[doc + 1]) {  // document `doc` is whole
        hashes[doc++] = hash;
        hash = content_hash_start(info.split_seed);
      }
      hash = content_hash_add(hash, ids[i]);
    }
  };
  TemporaryOutput guard(output_temporary(path));  // a failed write leaves nothing behind
  const std::string& tmp = guard.path();
  auto f = hdf5::create_file(tmp, hdf5::AttributeStorage::Dense);
  const hdf5::DatasetOptions checked{.chunk_elements = 1 << 20, .checksum = hdf5::Checksum::Fletcher32};
  hdf5::create_u32(f, "tokens", num_tokens);  // contiguous and unfiltered: readers map it
  // Pieces of whole checksum blocks (64 MiB), so each block's checksum is taken from one piece.
  std::vector<TokenId> piece(std::min<size_t>(num_tokens, 16 * static_cast<size_t>(kChecksumBlockTokens)));
  std::vector<int64_t> sums;
  for (size_t at = 0; at < num_tokens; at += piece.size()) {
    const std::span<TokenId> out(piece.data(), std::min(piece.size(), num_tokens - at));
    fill(at, out);
    if (by_content) hash_tokens(at, out);
    hdf5::write_u32_range(f, "tokens", at, out);
    for (size_t b = 0; b < out.size(); b += kChecksumBlockTokens) {
      const auto words = std::span<const TokenId>(out).subspan(b, std::min<size_t>(kChecksumBlockTokens, out.size() - b));
      sums.push_back(static_cast<int64_t>(fletcher64(words)));
    }
  }
  hdf5::write_i64(f, "tokens_checksums", sums, checked);
  hdf5::set_attr(f, "checksum_block_tokens", kChecksumBlockTokens);
  hdf5::write_i64(f, "doc_offsets", doc_offsets, checked);
  if (by_content)
    for (; doc < docs; ++doc) {  // the last document, and any empty ones at the end
      hashes[doc] = hash;
      hash = content_hash_start(info.split_seed);
    }
  const auto validation = by_content ? choose_validation_by_content(hashes, info.validation_fraction)
                                     : choose_validation_documents(docs, info.validation_fraction, info.split_seed);
  std::vector<int64_t> train;
  train.reserve(docs - validation.size());
  for (size_t d = 0, v = 0; d < docs; ++d) {
    if (v < validation.size() && validation[v] == static_cast<int64_t>(d)) ++v;
    else train.push_back(static_cast<int64_t>(d));
  }
  auto split = hdf5::create_group(f, "split");
  hdf5::write_i64(split, "train", train, checked);
  hdf5::write_i64(split, "validation", validation, checked);
  write_dataset_attributes(f, info, docs, num_tokens);
  split = hdf5::Handle();
  hdf5::record_metadata_checksums(f);
  f.close();
  fsync_path(tmp);  // on disk before it takes the name: a crash leaves the old file or the whole new one
  move_into_place(tmp, path, existing, "a dataset is not replaced unless asked (prepare-data --overwrite)");
  guard.moved();
  const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
  fsync_path(dir.string());  // the rename itself
  return validation.size();
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

// The tokens read through HDF5 (format 1, or a format-2 file that is not mapped). HDF5 converts any integer type to
// uint32 by clamping, without a word: an int32 -7 came back as 0 and an int64 2^32 + 5 as 2^32 - 1. Stored as
// anything but unsigned integers of 32 bits or fewer, they are read as int64 and each checked against the
// vocabulary before it is narrowed. (open_1d has already required a 1-D integer dataset.)
std::vector<TokenId> read_tokens(const hdf5::Handle& f, const std::string& path, int64_t vocab_size) {
  const hdf5::Handle d(ST_CHECK_HDF5(H5Dopen2(f.get(), "tokens", H5P_DEFAULT)));
  const hdf5::Handle type(ST_CHECK_HDF5(H5Dget_type(d.get())));
  if (H5Tget_sign(type.get()) == H5T_SGN_NONE && H5Tget_size(type.get()) <= sizeof(TokenId))
    return hdf5::read_u32(f, "tokens");
  const std::vector<int64_t> wide = hdf5::read_i64(f, "tokens");
  std::vector<TokenId> out(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < 0 || wide[i] >= vocab_size)
      throw DataError(
          fmt::format("{}: token id {} (at {}) is outside the vocabulary (vocab_size {})", path, wide[i], i, vocab_size));
    out[i] = static_cast<TokenId>(wide[i]);
  }
  return out;
}
}  // namespace

TokenDataset TokenDataset::open(const std::string& path) {
  TokenDataset ds;
  ds.path_ = path;
  // HDF5 says only "no such file" of a folder.
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw DataError(fmt::format("{}: is a folder, not a dataset file (expected the .h5 file prepare-data wrote)", path));
  // And "no such file" of a pipe or a device, which it cannot map either.
  if (std::error_code ec; std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw DataError(fmt::format("{}: is not a regular file (a pipe, socket or device), not a dataset file", path));
  hdf5::Handle f;
  try {
    f = hdf5::open_file(path, hdf5::FileMode::ReadOnly);
  } catch (const DataError& e) {
    // (A file unreadable or held by a writer is a FileRefused that says so: hdf5::why_unopened.)
    if (std::string_view(e.what()).find("not an HDF5 file") == std::string_view::npos) throw;
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) == 0 && !ec)
      throw DataError(fmt::format("{}: the file is empty (0 bytes), not a dataset (a copy that did not finish?)", path));
    const std::string ext = std::filesystem::path(path).extension().string();
    if (ext == ".h5" || ext == ".hdf5") throw;
    // The likeliest such file: the corpus itself (JSONL, Parquet, text) given where its prepared dataset belongs.
    throw DataError(
        fmt::format("{}; a dataset is the .h5 file prepare-data makes from a corpus (text, JSONL, Parquet or "
                    "Arrow): shardtrain prepare-data --tokenizer T --input {} --output DATASET.h5",
                    e.what(), path));
  }
  // Every attribute, layout and link against its checksum, before any of them is believed.
  try {
    const hdf5::MetadataCheck check = hdf5::verify_metadata_checksums(f);
    ds.metadata_recorded_ = check.recorded;
    ds.metadata_entries_ = check.entries;
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}; prepare the dataset again", e.what()));
  }
  if (ds.metadata_recorded_) ds.metadata_record_ = hdf5::get_attr_string(f, hdf5::kMetadataChecksums).value_or("");
  const std::string format = required_string(f, path, "format");
  if (format != kDatasetFormat)
    throw DataError(fmt::format("{}: attribute 'format' is '{}', expected '{}'", path, format, kDatasetFormat));
  const int64_t version = required_int(f, path, "format_version");
  if (version != 1 && version != 2)
    throw DataError(fmt::format("{}: format_version {} is not supported (this build reads 1 and 2)", path, version));
  // Only now: an HDF5 file that is no dataset at all was first said to be one from an older build.
  if (!ds.metadata_recorded_ && log::config().rank == 0) {
    log::warn(
        "{}: has no metadata checksums (prepared by a build before they existed): its attributes (eot_id, vocab_size, ...) "
        "are not checked; prepare it again to add them",
        path);
  }
  auto& info = ds.info_;
  info.tokenizer_name = required_string(f, path, "tokenizer_name");
  info.tokenizer_path = hdf5::get_attr_string(f, "tokenizer_path").value_or("");
  info.tokenizer_hash = required_string(f, path, "tokenizer_hash");
  info.tokenizer_encoding_hash = hdf5::get_attr_string(f, "tokenizer_encoding_hash").value_or("");
  info.tokenizer_format = hdf5::get_attr_string(f, "tokenizer_format").value_or("");
  info.vocab_size = required_int(f, path, "vocab_size");
  if (info.vocab_size < 1)
    throw DataError(fmt::format("{}: attribute 'vocab_size' is {}; expected the tokenizer's vocabulary size, at least 1",
                                path, info.vocab_size));
  // The layouts write these ids into every sample, past the per-block check of the tokens: one outside the vocabulary
  // trained as a token the tokenizer does not have (or failed in the embedding without naming the file), and one of
  // 2^32 or more wrapped to a small id.
  const auto special_id = [&](const char* name, int64_t id) {
    if (id < -1 || id >= info.vocab_size)
      throw DataError(
          fmt::format("{}: attribute '{}' is {}, outside the vocabulary [0, {}) (-1: none); prepare the dataset "
                      "again",
                      path, name, id, info.vocab_size));
    return optional_id(id);
  };
  info.eot_id = special_id("eot_id", required_int(f, path, "eot_id"));
  info.bot_id = special_id("bot_id", hdf5::get_attr_int(f, "bot_id").value_or(-1));
  info.pad_id = special_id("pad_id", hdf5::get_attr_int(f, "pad_id").value_or(-1));
  info.special_tokens_json = hdf5::get_attr_string(f, "special_tokens").value_or("{}");
  try {
    info.sources = nlohmann::json::parse(hdf5::get_attr_string(f, "sources").value_or("[]")).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception&) {
    throw DataError(fmt::format("{}: attribute 'sources' is not a JSON list of strings", path));
  }
  info.validation_fraction = static_cast<double>(hdf5::get_attr_int(f, "validation_fraction_ppm").value_or(0)) / 1e6;
  info.split_seed = static_cast<uint64_t>(hdf5::get_attr_int(f, "split_seed").value_or(0));
  info.split_by =
      hdf5::get_attr_string(f, "split_by").value_or("shuffle") == "content" ? SplitBy::Content : SplitBy::Shuffle;

  auto st = std::make_shared<detail::TokenStorage>();
  const size_t num_tokens = hdf5::dataset_length(f, "tokens");
  const std::optional<uint64_t> raw = version >= 2 ? hdf5::raw_u32le_offset(f, "tokens") : std::nullopt;
  if (version >= 2) {
    st->block = hdf5::get_attr_int(f, "checksum_block_tokens").value_or(0);
    if (st->block <= 0)
      throw DataError(fmt::format("{}: attribute 'checksum_block_tokens' is missing or not positive", path));
    st->sums = hdf5::read_i64(f, "tokens_checksums");
    const size_t blocks = (num_tokens + static_cast<size_t>(st->block) - 1) / static_cast<size_t>(st->block);
    if (st->sums.size() != blocks)
      throw DataError(fmt::format("{}: tokens_checksums holds {} values, expected {} (one per {} tokens)", path,
                                  st->sums.size(), blocks, st->block));
    st->checked = std::make_unique<std::atomic<bool>[]>(blocks);
  }
  if (raw) {
    ds.tokens_ = map_tokens(*st, path, *raw, num_tokens);
  } else {  // format 1, or a format-2 file rewritten with filters (h5repack): read through HDF5
    st->owned = read_tokens(f, path, info.vocab_size);
    ds.tokens_ = st->owned;
  }
  ds.storage_ = st;
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
        throw DataError(fmt::format(
            "{}: split lists must hold ascending, disjoint document indices in [0, {}); bad entry {}", path, docs, d));
    }
  }
  if (version == 1) {  // read whole: check every id now (format 2 checks each block at its first use)
    const auto max_token = std::max_element(ds.tokens_.begin(), ds.tokens_.end());
    if (max_token != ds.tokens_.end() && static_cast<int64_t>(*max_token) >= info.vocab_size)
      throw DataError(
          fmt::format("{}: token id {} is outside the vocabulary (vocab_size {})", path, *max_token, info.vocab_size));
  }
  return ds;
}

bool TokenDataset::mapped() const { return storage_ && storage_->map != nullptr; }

std::string TokenDataset::identity() const {
  const auto bytes_of = [](const auto& v) {
    return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0]));
  };
  std::string parts = metadata_record_ + "|" + detail::fnv1a64_hex(bytes_of(offsets_)) + "|" +
                      detail::fnv1a64_hex(bytes_of(train_)) + "|" + detail::fnv1a64_hex(bytes_of(validation_)) + "|";
  parts += storage_ && !storage_->sums.empty() ? detail::fnv1a64_hex(bytes_of(storage_->sums))
                                               : detail::fnv1a64_hex(bytes_of(tokens_));
  // The size of the file this dataset read, not of whatever the path names now: after prepare-data --overwrite
  // under a run, the path's new file size beside the old content's checksums matched neither file.
  std::error_code ec;
  const auto size = storage_ && storage_->fd >= 0 ? static_cast<uintmax_t>(storage_->opened.st_size)
                                                  : std::filesystem::file_size(path_, ec);
  return fmt::format("{} bytes, {} tokens in {} documents, content {}", ec ? 0 : size, num_tokens(), num_documents(),
                     detail::fnv1a64_hex(parts));
}

void TokenDataset::check_blocks(size_t begin, size_t end) const {
  if (!storage_ || !storage_->checked || begin >= end) return;
  const size_t block = static_cast<size_t>(storage_->block);
  for (size_t b = begin / block; b <= (end - 1) / block; ++b) {
    if (storage_->checked[b].load(std::memory_order_acquire)) continue;
    // Two threads may check the same block at once: the same work twice, the same verdict.
    const size_t from = b * block, n = std::min(block, tokens_.size() - from);
    const auto words = tokens_.subspan(from, n);
    if (static_cast<int64_t>(fletcher64(words)) != storage_->sums[b]) {
      if (storage_->modified.load())
        throw DataError(fmt::format(
            "{}: tokens [{}, {}) are not the ones this run opened: the file was modified in place while the run reads it; "
            "replace a dataset by renaming a new file over it (prepare-data --overwrite does), never in place (cp onto "
            "it), and resume",
            path_, from, from + n));
      throw DataError(fmt::format("{}: tokens [{}, {}) do not match their checksum: the file is damaged (prepare it again)",
                                  path_, from, from + n));
    }
    const auto max_token = std::max_element(words.begin(), words.end());
    if (static_cast<int64_t>(*max_token) >= info_.vocab_size) {
      throw DataError(fmt::format("{}: token id {} (at {}) is outside the vocabulary (vocab_size {})", path_, *max_token,
                                  from + static_cast<size_t>(max_token - words.begin()), info_.vocab_size));
    }
    storage_->checked[b].store(true, std::memory_order_release);
  }
}

void TokenDataset::check_unchanged() const {
  if (!storage_ || storage_->fd < 0) return;  // read whole (format 1): the tokens are in memory
  struct stat now {};
  if (fstat(storage_->fd, &now) != 0) return;  // nothing known to have changed
  const struct stat& then = storage_->opened;
  // Another size: written in place (truncate, cp onto it): the mapping shows whatever is in the file now, and a page past
  // a shorter end kills the process with SIGBUS. Renaming a new file over it (prepare-data --overwrite) changes nothing
  // here: this file lives on until the run ends.
  if (now.st_size != then.st_size)
    throw DataError(fmt::format(
        "{}: the file was rewritten in place while this run reads it ({} bytes, now {}): its tokens are mapped from it, "
        "so the run would read other tokens or die of SIGBUS; replace a dataset by renaming a new file over it "
        "(prepare-data --overwrite does), never in place (cp onto it, truncate), and resume",
        path_, then.st_size, now.st_size));
  std::lock_guard lock(storage_->changes);
  timespec& seen = storage_->mtime_seen;
  if (now.st_mtim.tv_sec == seen.tv_sec && now.st_mtim.tv_nsec == seen.tv_nsec) return;
  // The same size, another modification time: rewritten in place (cp of a file as large), or only touched (a scratch
  // file system's purge policy, rsync -t), which must not stop a run. The tokens tell: every block is checked against
  // its checksum again before its next use, so other tokens stop the run there and the same ones go on.
  seen = now.st_mtim;
  storage_->modified.store(true);
  const size_t blocks = storage_->sums.size();
  for (size_t b = 0; b < blocks; ++b) storage_->checked[b].store(false, std::memory_order_release);
  if (log::config().rank == 0)
    log::warn(
        "{}: modified in place while this run reads it (its modification time changed, not its size): each block of its "
        "tokens is checked against its checksum again before it is used",
        path_);
}

std::span<const TokenId> TokenDataset::tokens() const {
  check_blocks(0, tokens_.size());
  return tokens_;
}

size_t TokenDataset::document_size(size_t d) const {
  if (d + 1 >= offsets_.size()) throw DataError(fmt::format("{}: document {} out of range ({})", path_, d, num_documents()));
  return static_cast<size_t>(offsets_[d + 1] - offsets_[d]);
}

std::span<const TokenId> TokenDataset::document(size_t d) const {
  const size_t n = document_size(d), at = static_cast<size_t>(offsets_[d]);
  check_blocks(at, at + n);
  return tokens_.subspan(at, n);
}

void TokenDataset::check_tokenizer(const Tokenizer& tokenizer) const {
  if (!same_tokenizer(tokenizer.hash(), tokenizer.encoding_hash(), info_.tokenizer_hash, info_.tokenizer_encoding_hash))
    throw DataError(fmt::format("{}: made with tokenizer {} ({}), but {} ({}) was given", path_, info_.tokenizer_name,
                                info_.tokenizer_hash, tokenizer.name(), tokenizer.hash()));
}

uint64_t verify_dataset(const TokenDataset& ds, bool show_progress) {
  ProgressBar bar({.label = "verify",
                   .total = ds.num_tokens() * sizeof(TokenId),
                   .unit = "MB",
                   .unit_scale = 1e-6,
                   .style = show_progress ? ProgressStyle::Auto : ProgressStyle::Off});
  for (size_t d = 0; d < ds.num_documents(); ++d) bar.advance(ds.document(d).size() * sizeof(TokenId));
  bar.finish();
  return (ds.num_tokens() + kChecksumBlockTokens - 1) / kChecksumBlockTokens;
}

}  // namespace shardtrain::data
