// Rotary position embedding in the rotate-half convention (Hugging Face Llama), in place on
// x (tokens, heads, head_dim) with positions (tokens) i32; Backward rotates by -angle (the transpose).
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

enum class RopeDirection { Forward, Backward };

// The most pairs a head may have: the frequencies travel to the kernel by value, as its parameter.
inline constexpr int64_t kRopeMaxPairs = 128;

// For i < head_dim / 2: angle = pos * inv_freq[i] (host memory, head_dim / 2 <= kRopeMaxPairs values, copied
// into the launch: ops/rope.hpp forms them, the same the CPU backend uses);
// (x_i, x_{i+half}) -> (x_i cos - x_{i+half} sin, x_{i+half} cos + x_i sin). head_dim must be even.
void rope(DType dtype, void* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          const float* inv_freq, RopeDirection direction, StreamRef stream);

}  // namespace shardtrain::kernels
