// `shardtrain prepare-data`: text, JSONL, Parquet or Arrow inputs -> tokenized HDF5 dataset (dataset.hpp), on all
// cores; or inputs already tokenized (DocumentOptions::token_field) -> the same dataset of their ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/documents.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace shardtrain::data {

struct PrepareOptions {
  std::string tokenizer;            // path for Tokenizer::load
  std::vector<std::string> inputs;  // files or folders (expanded, sorted)
  std::string output;               // data/NAME.h5
  // An output that exists is refused before anything is read (UsageError), unless Replace (--overwrite); either
  // way it is replaced only by a whole new file (dataset.hpp, write_dataset).
  ExistingOutput existing = ExistingOutput::Refuse;
  DocumentOptions documents;
  double validation_fraction = 0.01;
  uint64_t seed = 0;                    // validation choice
  SplitBy split_by = SplitBy::Shuffle;  // how the validation documents are picked (dataset.hpp)
  int threads = 0;                      // 0: every core this process may use (usable_cores: its CPU affinity)
  // Documents are read, tokenized and written in batches of this much text, so memory does not grow with the
  // corpus (the tokens wait in a temporary file beside the output until the dataset is written).
  size_t batch_bytes = size_t{64} << 20;
  ProgressStyle progress = ProgressStyle::Auto;
};

struct PrepareSummary {
  size_t files = 0, documents = 0, empty_documents_skipped = 0;
  int threads = 0;  // tokenizing threads used
  size_t train_documents = 0, validation_documents = 0;
  uint64_t tokens = 0, bytes = 0;
  double seconds = 0, tokenize_seconds = 0;
  double mb_per_second() const { return tokenize_seconds > 0 ? static_cast<double>(bytes) / 1e6 / tokenize_seconds : 0; }
};

PrepareSummary prepare_dataset(const PrepareOptions& options);

}  // namespace shardtrain::data
