// RMSNorm with the residual add fused, forward and backward. Activations (rows, dim) share one storage
// dtype; weight and dweight (dim) have their own; rstd (rows) is fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

// h = x + residual (stored to h_out, and the stored, rounded value is what gets normalized) or h = x when
// residual is null; rstd = 1 / sqrt(mean(h^2) + eps); y = h * rstd * weight. One warp per row (rmsnorm.cu).
void rmsnorm_forward(DType dtype, const void* x, const void* residual, DType weight_dtype, const void* weight, float eps,
                     int64_t rows, int64_t dim, void* h_out, void* y, float* rstd, StreamRef stream);

// fp32 partial sums for the weight gradient: ceil(rows / 64) x dim.
size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t dim);

// dh = rstd * (w * dy - h * rstd * mean(w * dy * h * rstd)) + dh_extra (dh_extra may be null);
// dweight += sum over rows of dy * h * rstd, reduced deterministically: fixed 64-row partial sums into the
// workspace, then one pass adding them in order.
void rmsnorm_backward(DType dtype, const void* dy, const void* h, DType weight_dtype, const void* weight, const float* rstd,
                      const void* dh_extra, void* dh, int64_t rows, int64_t dim, DType dweight_dtype, void* dweight,
                      void* workspace, size_t workspace_bytes, StreamRef stream);

}  // namespace shardtrain::kernels
