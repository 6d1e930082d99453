// The fused AdamW update (torch.optim.AdamW, decoupled weight decay) over every flat shard of a rank in
// one launch: a chunk table in device memory lists equal pieces of the shards' parameter ranges, one
// block per chunk, so padding is never touched and blocks get equal work whatever the ranges' sizes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain::kernels {

// Elements per chunk at most. A multiple of 4, so the chunks of one range share its 16-byte alignment.
inline constexpr int64_t kAdamWChunkElements = 32768;

// One piece of a parameter range: n consecutive elements of the four fp32 arrays (device memory).
struct AdamWChunk {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n = 0;      // 1 .. kAdamWChunkElements
  int32_t decay = 0;  // 1: the range takes weight decay (param *= decay_factor first)
  int32_t unused = 0;
};

// Appends the chunks of one range: n elements of the four arrays from the given pointers.
inline void append_adamw_chunks(std::vector<AdamWChunk>& table, float* param, const float* grad, float* exp_avg,
                                float* exp_avg_sq, int64_t n, bool decay) {
  for (int64_t at = 0; at < n; at += kAdamWChunkElements) {
    AdamWChunk c;
    c.param = param + at;
    c.grad = grad + at;
    c.exp_avg = exp_avg + at;
    c.exp_avg_sq = exp_avg_sq + at;
    c.n = std::min(kAdamWChunkElements, n - at);
    c.decay = decay ? 1 : 0;
    table.push_back(c);
  }
}

// Per-step scalars, computed on the host exactly as the CPU update computes them.
struct AdamWScalars {
  float beta1 = 0, beta2 = 0;
  float step_size = 0;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^t)
  float eps = 0;
  float grad_scale = 1;    // gradients are multiplied by this first (clipping)
  float decay_factor = 1;  // 1 - lr * weight_decay, for chunks with decay
};

// For every element k of every chunk, with g = grad[k] * grad_scale and d = decay_factor or 1:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  p = p d - step_size m / (sqrt(v) inv_sqrt_bc2 + eps)
// in fp32 without FMA contraction (the same operations in the same order as the CPU loop).
// `chunks` is a device array of `num_chunks` entries; asynchronous on `stream`.
void adamw_step(const AdamWChunk* chunks, int64_t num_chunks, const AdamWScalars& scalars, StreamRef stream);

}  // namespace shardtrain::kernels
