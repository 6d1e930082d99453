// Trains a byte-level BPE on text files and writes it as a Hugging Face tokenizer.json that
// Tokenizer::load (and the tokenizers library) read back: special tokens first, then the 256 bytes,
// then one token per merge; pre-tokenized by a split regex (Llama 3's by default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/documents.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace shardtrain::data {

struct BpeTrainOptions {
  size_t vocab_size = 8192;                                               // special tokens + 256 bytes + merges
  std::vector<std::string> special_tokens = {"[BOT]", "[EOT]", "[PAD]"};  // the seed's, ids 0, 1, 2
  std::string split_pattern;                                              // empty: llama3_split_pattern()
  uint64_t min_frequency = 2;                                             // stop when the best pair occurs fewer times
  int threads = 0;  // 0: every core this process may use (its CPU affinity)
  DocumentOptions documents;
  ProgressStyle progress = ProgressStyle::Auto;
};

struct BpeTrainResult {
  std::string tokenizer_json;  // the file's contents
  size_t vocab_size = 0;
  size_t merges = 0;
  size_t unique_words = 0;
  uint64_t input_bytes = 0;
  double seconds = 0;
};

BpeTrainResult train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& options);

}  // namespace shardtrain::data
