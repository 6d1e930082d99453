// SwiGLU on (n) elements of one storage dtype: out = silu(gate) * up, and its backward.
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

void swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t n, StreamRef stream);
// dup = dout * silu(gate); dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x).
// dgate may be gate and dup may be up (in place).
void swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
                     StreamRef stream);

}  // namespace shardtrain::kernels
