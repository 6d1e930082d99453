// SwiGLU over rows of one storage dtype: out = silu(gate) * up, and its backward. Gate and up are read as `rows`
// rows of `cols` elements, row r of each at r * stride from its start, the output row r at r * cols: the model's
// (N, 2F) gate_up is N rows of F, stride 2F, up = gate + F; two (N, F) halves are one row of N F.
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

void swiglu_forward(DType dtype, const void* gate, const void* up, int64_t stride, void* out, int64_t rows, int64_t cols,
                    StreamRef stream);
// dup = dout * silu(gate); dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x); dgate and
// dup in gate's row layout (stride), dout in out's. dgate may be gate and dup may be up (in place).
void swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up, int64_t stride, void* dgate, void* dup,
                     int64_t rows, int64_t cols, StreamRef stream);

}  // namespace shardtrain::kernels
