// RoPE fused with the split of one q/k/v projection: between the packed (tokens, (heads + 2 kv_heads) * head_dim)
// output of the GEMM with [Wq; Wk; Wv] (row t = q_t, k_t, v_t) and the contiguous q (tokens, heads, head_dim),
// k and v (tokens, kv_heads, head_dim) that attention takes. Forward: packed -> q, k rotated, v copied. Backward:
// dq, dk rotated back (by -angle), dv copied -> packed. The rotation is kernels/rope.cuh's.
#pragma once

#include <cstdint>

#include "kernels/rope.cuh"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

// inv_freq: head_dim / 2 <= kRopeMaxPairs values in host memory (ops/rope.hpp forms them), copied into the launch.
// packed does not overlap q, k or v.
void rope_qkv(DType dtype, void* packed, void* q, void* k, void* v, const int32_t* positions, int64_t tokens, int64_t heads,
              int64_t kv_heads, int64_t head_dim, const float* inv_freq, RopeDirection direction, StreamRef stream);

}  // namespace shardtrain::kernels
