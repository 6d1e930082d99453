// Token datasets in HDF5 (docs/data.md): one file with every document's token ids, document offsets, a
// train/validation split by document, and attributes naming the tokenizer that made it.
//
//   /tokens            uint32 [T]     chunked, Fletcher32; documents back to back, no special tokens added
//   /doc_offsets       int64  [D+1]   document d is tokens[doc_offsets[d] : doc_offsets[d+1]]
//   /split/train       int64  [Dt]    ascending document indices
//   /split/validation  int64  [Dv]    ascending document indices; train and validation partition [0, D)
//   attributes on /: format, format_version, tokenizer_name, tokenizer_path, tokenizer_hash, tokenizer_format,
//     vocab_size, eot_id, bot_id, pad_id (-1: none), special_tokens (JSON), sources (JSON), num_documents,
//     num_tokens, validation_fraction_ppm, split_seed
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {

enum class DatasetSplit { Train, Validation };
DatasetSplit parse_dataset_split(const std::string& s);  // train|validation (val), throws UsageError
const char* dataset_split_name(DatasetSplit s);

inline constexpr const char* kDatasetFormat = "shardtrain-tokens";
inline constexpr int64_t kDatasetFormatVersion = 1;

struct DatasetInfo {
  std::string tokenizer_name, tokenizer_path, tokenizer_hash, tokenizer_format;
  int64_t vocab_size = 0;
  std::optional<TokenId> eot_id, bot_id, pad_id;
  std::string special_tokens_json = "{}";  // {"<|endoftext|>": 50256, ...}
  std::vector<std::string> sources;
  double validation_fraction = 0;
  uint64_t split_seed = 0;
};

DatasetInfo dataset_info_for(const Tokenizer& tokenizer);  // the tokenizer fields filled in

// Picks round(fraction * num_documents) validation documents (at least one when fraction > 0 and there
// are two or more documents), uniformly by a seeded shuffle; returns them ascending.
std::vector<int64_t> choose_validation_documents(size_t num_documents, double fraction, uint64_t seed);

void write_dataset(const std::string& path, std::span<const TokenId> tokens, std::span<const int64_t> doc_offsets,
                   const DatasetInfo& info);

class TokenDataset {
 public:
  // Reads and validates the whole file (tokens are held in memory). Throws DataError naming the file
  // and the dataset or attribute that is missing or inconsistent.
  static TokenDataset open(const std::string& path);

  const std::string& path() const { return path_; }
  const DatasetInfo& info() const { return info_; }
  size_t num_documents() const { return offsets_.size() - 1; }
  size_t num_tokens() const { return tokens_.size(); }
  std::span<const TokenId> tokens() const { return tokens_; }
  std::span<const int64_t> doc_offsets() const { return offsets_; }
  std::span<const TokenId> document(size_t d) const;
  std::span<const int64_t> split_documents(DatasetSplit s) const { return s == DatasetSplit::Train ? train_ : validation_; }

  // Checks that `tokenizer` is the one that made the dataset (hash), throwing DataError otherwise.
  void check_tokenizer(const Tokenizer& tokenizer) const;

 private:
  std::string path_;
  DatasetInfo info_;
  std::vector<TokenId> tokens_;
  std::vector<int64_t> offsets_, train_, validation_;
};

}  // namespace shardtrain::data
