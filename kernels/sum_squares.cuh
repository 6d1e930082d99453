// The sum of squares of a flat float array, in double, reduced in a fixed order (the same bits every run
// for a given n): the local half of the global gradient norm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

enum class ReduceInto { Overwrite, Accumulate };

// Workspace for the per-block partial sums (a fixed, small size).
size_t sum_squares_workspace_bytes();

// *out = sum x[i]^2 (Overwrite) or *out += sum x[i]^2 (Accumulate); out is one double in device memory.
void sum_squares(DType dtype, const void* x, int64_t n, double* out, ReduceInto mode, void* workspace,
                 size_t workspace_bytes, StreamRef stream);

}  // namespace shardtrain::kernels
