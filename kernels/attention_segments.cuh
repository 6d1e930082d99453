// The attention mask input and RoPE positions of a batch: segments (B, S) and positions (B, S), i32.
#pragma once

#include <cstdint>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::kernels {

// segment = document id (0 when document_ids is null), or -1 where input_ids == pad_token_id
// (pad_token_id < 0: no padding); positions restart at 0 at each document start when document_ids is
// given, else 0..S-1. A negative document id is recorded in `error` (DataErrorCode::DocumentId, bound = S)
// and that token becomes padding (segment -1).
void attention_segments(const int32_t* input_ids, int32_t pad_token_id, const int32_t* document_ids, int64_t batch,
                        int64_t seq, int32_t* segments, int32_t* positions, DataErrorRecord* error, StreamRef stream);

}  // namespace shardtrain::kernels
