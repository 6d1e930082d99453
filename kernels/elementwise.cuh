// Element-wise ops on flat float arrays (f32 or bf16 storage, fp32 arithmetic): fill, copy with a cast,
// y += x and in-place scaling (cuBLASLt's beta when K = 0). n counts elements; the dtypes name the storage.
#pragma once

#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

// out[i] = value (rounded once to the storage type).
void elementwise_fill(DType dtype, void* out, int64_t n, float value, StreamRef stream);
// dst[i] = src[i]; a device-to-device memcpy when the dtypes match.
void elementwise_copy(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, StreamRef stream);
// y[i] += x[i].
void elementwise_add(DType x_dtype, const void* x, DType y_dtype, void* y, int64_t n, StreamRef stream);
// x[i] *= factor.
void elementwise_scale(DType dtype, void* x, int64_t n, float factor, StreamRef stream);

}  // namespace shardtrain::kernels
