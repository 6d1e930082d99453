// The packed-documents layout of cuDNN's fused attention (ragged "THD" tensors), derived on the device from the
// attention segments, and the conversion of its token-major softmax statistics to and from our lse layout.
// Used by src/ops/cuda/cudnn_attention.cpp; no host synchronization anywhere.
#pragma once

#include <cstdint>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::kernels {

// Device arrays describing `count` sequences of the flattened (B * S) token batch. Any pointer may be null
// (that array is not written).
struct AttentionSequences {
  int32_t* lengths = nullptr;        // (count) tokens of sequence i; 0 past the last run
  int64_t* q_offsets = nullptr;      // (count + 1) element offset of sequence i in q, out, dout, dq: start_i * H * Dh
  int64_t* kv_offsets = nullptr;     // (count + 1) in k, v, dk, dv: start_i * Hkv * Dh
  int64_t* stats_offsets = nullptr;  // (count + 1) in token-major stats (B * S, H): start_i * H
};

struct AttentionSequenceDims {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t count;  // sequences the arrays hold (cuDNN's batch dimension)
};

// segments (B, S) int32: every maximal run of one segment id >= 0 inside a row is one sequence, numbered in
// row-major order; start_i is the index of its first token in the flattened batch (row * S + position). The
// entries past the last run have length 0 and offsets at the end (B * S tokens); entry `count` of each offset
// array is the end as well. Segment -1 (padding) belongs to no sequence.
// segments == nullptr (plain causal): sequence i < B is row i (length S); count must be >= B.
// Recorded in `error` (the first only), the arrays staying well formed:
//   DataErrorCode::SequenceCount  more runs than `count` (value = the first run past it, index = its token,
//                                 bound = count); the runs past `count` are left out;
//   DataErrorCode::DocumentSplit  a segment id that already had a run earlier in the same row (value = the id,
//                                 index = the token that starts the later run, bound = S): the op's semantics
//                                 would join the two runs, which one sequence each cannot express.
// One block: the work is O(B * S) plus, per row, O(runs^2) id comparisons.
void attention_sequences(const int32_t* segments, const AttentionSequenceDims& d, const AttentionSequences& out,
                         DataErrorRecord* error, StreamRef stream);

// lse (B, H, S) from token-major stats (B * S, H): lse[b, h, t] = stats[(b * S + t) * H + h] where
// segments[b, t] >= 0, and -inf at padding (segments < 0) whatever stats holds there.
void attention_stats_from_tokens(const float* stats, const int32_t* segments, int64_t batch, int64_t seq, int64_t heads,
                                 float* lse, StreamRef stream);

// Token-major stats (B * S, H) from lse (B, H, S): the inverse layout change (every element copied).
void attention_stats_to_tokens(const float* lse, int64_t batch, int64_t seq, int64_t heads, float* stats, StreamRef stream);

// Zeroes the rows of x (tokens, row) whose segment is negative (padding): x holds `row` 2-byte elements (bf16) per
// token. cuDNN's packed layout leaves the rows of tokens outside every sequence as they were.
void attention_zero_padding_rows(const int32_t* segments, int64_t tokens, int64_t row, uint16_t* x, StreamRef stream);

}  // namespace shardtrain::kernels
