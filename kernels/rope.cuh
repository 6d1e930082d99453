// Rotary position embedding in the rotate-half convention (Hugging Face Llama), in place on
// x (tokens, heads, head_dim) with positions (tokens) i32; Backward rotates by -angle (the transpose).
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

enum class RopeDirection { Forward, Backward };

// For i < head_dim / 2: angle = pos * theta^(-2i / head_dim) (fp32, as the CPU backend and Hugging Face);
// (x_i, x_{i+half}) -> (x_i cos - x_{i+half} sin, x_{i+half} cos + x_i sin). head_dim must be even.
void rope(DType dtype, void* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim, float theta,
          RopeDirection direction, StreamRef stream);

}  // namespace shardtrain::kernels
