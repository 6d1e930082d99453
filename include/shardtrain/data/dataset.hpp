// Token datasets in HDF5 (docs/data.md): one file with every document's token ids, document offsets, a
// train/validation split by document, and attributes naming the tokenizer that made it.
//
//   /tokens            uint32 [T]     format 2: contiguous and unfiltered, so readers map it from the file
//                                     (format 1: chunked with Fletcher32, read whole)
//   /tokens_checksums  int64  [ceil(T / checksum_block_tokens)]   format 2: Fletcher-64 of each block of tokens
//   /doc_offsets       int64  [D+1]   document d is tokens[doc_offsets[d] : doc_offsets[d+1]]
//   /split/train       int64  [Dt]    ascending document indices
//   /split/validation  int64  [Dv]    ascending document indices; train and validation partition [0, D)
//   attributes on /: format, format_version, tokenizer_name, tokenizer_path, tokenizer_hash, tokenizer_format,
//     tokenizer_encoding_hash (since 2026-11-29: Tokenizer::encoding_hash, what a re-saved tokenizer.json keeps),
//     vocab_size, eot_id, bot_id, pad_id (-1: none), special_tokens (JSON), sources (JSON), num_documents,
//     num_tokens, validation_fraction_ppm, split_seed, split_by ("shuffle" or "content"; absent: shuffle),
//     checksum_block_tokens (format 2)
//   metadata_checksums on every object: a checksum of each attribute, layout and link (runtime/hdf5_checksum.hpp),
//     checked on opening; files prepared before 2026-11-27 have none and are read with a warning
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/data/output_file.hpp"  // ExistingOutput: what write_dataset does when `path` exists
#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {

enum class DatasetSplit { Train, Validation };

// How prepare-data picks the validation documents (docs/data.md, "The validation split"):
// - Shuffle: round(fraction x documents) of them by a seeded shuffle of their indices. Exact in count, but keyed by
//   position: prepared again from a corpus that grew or was reordered, documents change sides, and a model trained on
//   the first preparation is evaluated on some of its own training documents.
// - Content: each document by a seeded hash of its token ids, held out when the hash falls below the fraction. The
//   same document lands on the same side whatever else the corpus holds or in which order (so exact duplicates never
//   straddle the split); the count is the fraction of the documents only on average.
enum class SplitBy { Shuffle, Content };
SplitBy parse_split_by(const std::string& s);  // shuffle|content, throws UsageError
const char* split_by_name(SplitBy s);
DatasetSplit parse_dataset_split(const std::string& s);  // train|validation (val), throws UsageError
const char* dataset_split_name(DatasetSplit s);

inline constexpr const char* kDatasetFormat = "shardtrain-tokens";
inline constexpr int64_t kDatasetFormatVersion = 2;       // written; 1 and 2 are read
inline constexpr int64_t kChecksumBlockTokens = 1 << 20;  // tokens per checksum block (4 MiB)

struct DatasetInfo {
  std::string tokenizer_name, tokenizer_path, tokenizer_hash, tokenizer_format;
  std::string tokenizer_encoding_hash;  // Tokenizer::encoding_hash(); empty in a file prepared before it was recorded
  int64_t vocab_size = 0;
  std::optional<TokenId> eot_id, bot_id, pad_id;
  std::string special_tokens_json = "{}";  // {"<|endoftext|>": 50256, ...}
  std::vector<std::string> sources;
  double validation_fraction = 0;
  uint64_t split_seed = 0;
  SplitBy split_by = SplitBy::Shuffle;
};

DatasetInfo dataset_info_for(const Tokenizer& tokenizer);  // the tokenizer fields filled in

// Picks round(fraction * num_documents) validation documents (at least one when fraction > 0 and there
// are two or more documents), uniformly by a seeded shuffle; returns them ascending.
std::vector<int64_t> choose_validation_documents(size_t num_documents, double fraction, uint64_t seed);
// SplitBy::Content: the documents whose hash (document_content_hash) is below fraction x 2^64, ascending; at least
// one (the smallest hash) when fraction > 0 and there are two or more documents, and never all of them (the largest
// hash stays in train).
std::vector<int64_t> choose_validation_by_content(std::span<const uint64_t> hashes, double fraction);
// A document's content hash for SplitBy::Content: splitmix64's mixer over its token ids, started from the seed; the
// streaming form feeds ids one by one into `state` (begun with content_hash_start).
uint64_t content_hash_start(uint64_t seed);
uint64_t content_hash_add(uint64_t state, TokenId id);
uint64_t document_content_hash(std::span<const TokenId> ids, uint64_t seed);

// Writes a format-2 dataset: into a temporary file beside `path`, flushed to disk and then renamed into place,
// so a reader never sees a half-written file (a kill leaves the old one, or none), and a job that has the old one
// mapped keeps reading the old one. With ExistingOutput::Refuse the rename never replaces a file that appeared
// meanwhile.
// Returns the number of validation documents (info.split_by decides which).
size_t write_dataset(const std::string& path, std::span<const TokenId> tokens, std::span<const int64_t> doc_offsets,
                     const DatasetInfo& info, ExistingOutput existing = ExistingOutput::Replace);
// The same with tokens that are not in memory: `fill(offset, out)` writes tokens [offset, offset + out.size())
// into out, called with consecutive pieces from offset 0 to num_tokens (prepare-data streams them from disk).
using TokenFill = std::function<void(size_t offset, std::span<TokenId> out)>;
size_t write_dataset(const std::string& path, size_t num_tokens, const TokenFill& fill, std::span<const int64_t> doc_offsets,
                     const DatasetInfo& info, ExistingOutput existing = ExistingOutput::Replace);

// Writes the attributes write_dataset would give a dataset of `info` into a file in memory: a DataError naming `path`
// when one cannot be stored, found before the tokenization instead of after it.
void check_dataset_metadata_fits(const std::string& path, const DatasetInfo& info);

// Fletcher-64 over 32-bit words (two running sums modulo 2^32 - 1; the second in the high half).
uint64_t fletcher64(std::span<const uint32_t> words);

namespace detail {
struct TokenStorage;  // the tokens' memory: a vector, or a read-only mapping of the file (dataset.cpp)
}

class TokenDataset {
 public:
  // Opens and validates a dataset file; throws DataError naming the file and the dataset or attribute that is
  // missing, inconsistent, or does not match its metadata checksum. Format 2: the tokens are mapped from the file, not read (the page cache holds one
  // copy per node, however many ranks map it, and only what is touched is read); each block of
  // kChecksumBlockTokens is checked (checksum, ids inside the vocabulary) the first time a document in it is
  // used, and a damaged block throws DataError then. Format 1: read whole and checked at once.
  static TokenDataset open(const std::string& path);

  const std::string& path() const { return path_; }
  const DatasetInfo& info() const { return info_; }
  size_t num_documents() const { return offsets_.size() - 1; }
  size_t num_tokens() const { return tokens_.size(); }
  bool mapped() const;                      // the tokens are mapped from the file (format 2), not held in memory
  std::span<const TokenId> tokens() const;  // every token, every block checked first
  std::span<const int64_t> doc_offsets() const { return offsets_; }
  std::span<const TokenId> document(size_t d) const;  // its blocks checked first
  size_t document_size(size_t d) const;               // from the offsets alone
  std::span<const int64_t> split_documents(DatasetSplit s) const { return s == DatasetSplit::Train ? train_ : validation_; }
  // Whether the file's metadata had checksums to check (false: prepared before they existed), and how many
  // attributes, layouts and links they covered.
  bool metadata_recorded() const { return metadata_recorded_; }
  int64_t metadata_entries() const { return metadata_entries_; }
  // What the file holds, in a line that two ranks compare (docs/cluster.md): its size and a checksum of its
  // metadata record, document offsets, split, and token checksums (format 1: the tokens), with nothing read
  // beyond what open() read.
  std::string identity() const;

  // Throws DataError naming the file when the mapped file's size changed since open() (truncated or rewritten in place:
  // the mapping would show other tokens, or kill the process with SIGBUS past a shorter end). Its modification time
  // alone changed (rewritten at the same size, or only touched): every checksum block is checked again before its next
  // use, so that other tokens throw there, with a warning. A new file renamed over the path is no change: this one is
  // still read. One fstat; the loader calls it before each micro-batch.
  void check_unchanged() const;

  // Checks that `tokenizer` is the one that made the dataset (hash), throwing DataError otherwise.
  void check_tokenizer(const Tokenizer& tokenizer) const;

 private:
  void check_blocks(size_t begin, size_t end) const;  // the blocks holding tokens [begin, end)

  std::string path_;
  DatasetInfo info_;
  std::shared_ptr<detail::TokenStorage> storage_;
  std::span<const TokenId> tokens_;
  std::vector<int64_t> offsets_, train_, validation_;
  bool metadata_recorded_ = false;
  int64_t metadata_entries_ = 0;
  std::string metadata_record_;  // the root's record, "" without one
};

// Reads every token now, so that each block's checksum and ids are checked before a run depends on them
// (a damaged block throws DataError naming the file). A progress bar on a terminal when show_progress.
// Returns the number of checksum blocks read.
uint64_t verify_dataset(const TokenDataset& ds, bool show_progress);

}  // namespace shardtrain::data
