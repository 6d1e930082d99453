// A record of the first bad input a kernel met (a token id or target outside the vocabulary, a negative
// document id). Kernels cannot throw: they write this record in device memory and carry on with defined
// output; the host reads it at its next synchronization point and throws a DataError (src/ops/cuda).
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain::kernels {

enum class DataErrorCode : int32_t {
  None = 0,
  TokenId = 1,     // embedding: ids[index] = value is outside [0, bound)
  Target = 2,      // cross-entropy: targets[index] = value is outside [0, bound) and is not ignore_index (aux)
  DocumentId = 3,  // attention_segments: document_ids[index] = value < 0; bound = sequence length
  // attention_sequences (cuDNN's packed-documents layout): run `value` of documents, starting at token `index`,
  // is past the bound `bound` on runs the caller gave
  SequenceCount = 4,
  // attention_sequences: segment id `value` starts a second run in one row at token `index` (bound = sequence
  // length), which the packed-documents layout cannot express
  DocumentSplit = 5,
};

// Zeroed memory means "no error". Only the first error is kept (the thread that moves code away from 0
// writes the other fields).
struct DataErrorRecord {
  int32_t code = 0;
  int32_t value = 0;
  int64_t index = 0;
  int64_t bound = 0;
  int64_t aux = 0;
};

// Sets *record to "no error" (asynchronously, on the stream).
void data_error_reset(DataErrorRecord* record, StreamRef stream);

}  // namespace shardtrain::kernels
