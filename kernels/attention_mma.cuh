// Host launchers of the tensor-core attention kernels (attention_mma.cu); called by attention_fwd.cu and
// attention_bwd.cu when attention_uses_mma(dtype). Shapes are checked by the callers (check_dims).
#pragma once

#include <cstdint>

#include "kernels/attention.cuh"

namespace shardtrain::kernels {

// bf16 q, k, v, out; lse fp32 (B, H, S).
void attention_forward_mma(const AttentionDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           float scale, void* out, float* lse, StreamRef stream);

// The dk/dv and dq kernels; dvec (B, H, S) = rowsum(dout * out), zero for rows that saw nothing, computed first.
void attention_backward_mma(const AttentionDims& d, const void* q, const void* k, const void* v, const float* lse,
                            const void* dout, const int32_t* segments, float scale, const float* dvec, void* dq, void* dk,
                            void* dv, StreamRef stream);

}  // namespace shardtrain::kernels
