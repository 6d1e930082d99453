// The tile geometry and shared-memory loaders of the flash attention kernels (attention_fwd.cu,
// attention_bwd.cu); device code, included only from those two files. attention.cuh is the host API.
//
// A CTA is 256 threads as 16 x 16 and owns kRows rows (queries, or keys in the backward's dk/dv kernel),
// stepping over kCols columns at a time; tiles are fp32 in shared memory, padded by one column against bank
// conflicts, with Dh zero-padded to DMAX.
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "kernels/attention.cuh"
#include "kernels/attention_rows.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::kernels::attention_tiles {

constexpr int kThreads = 256;  // 16 x 16
constexpr int kRows = 64;      // rows a CTA owns
constexpr int kCols = 32;      // columns per step
constexpr int kRowsPerThread = kRows / 16;
constexpr int kColsPerThread = kCols / 16;
constexpr int kPLd = kCols + 1;  // leading dim of a (kRows, kCols) probability tile

// Tokens [first, first + ROWS) of a token-major tensor (stride elements between tokens) into a (ROWS, DMAX + 1)
// fp32 tile times mul; columns past head_dim and rows with a negative segment are zeros, so padding never
// reaches the arithmetic even if its values are not finite.
template <int DMAX, int ROWS, typename T>
ST_DEV void load_tile(float* tile, const T* __restrict__ src, int64_t stride, int first, const int* row_seg,
                      int head_dim, float mul) {
  constexpr int kLd = DMAX + 1;
  for (int e = simt::thread_x(); e < ROWS * DMAX; e += kThreads) {
    const int r = e / DMAX, c = e % DMAX;
    float x = 0.f;
    if (c < head_dim && row_seg[r] >= 0) x = detail::to_f32(src[int64_t(first + r) * stride + c]) * mul;
    tile[r * kLd + c] = x;
  }
}

// The shapes the kernels' grids and int indexing can take; head_dim at most 128 (the largest DMAX).
inline void check_dims(const AttentionDims& d, const char* op) {
  const bool ok = d.batch > 0 && d.seq > 0 && d.heads > 0 && d.kv_heads > 0 && d.head_dim > 0 &&
                  d.heads % d.kv_heads == 0 && d.batch <= 65535 && d.kv_heads <= 65535 && d.heads <= 65535 &&
                  d.seq <= INT_MAX - 2 * kRows;
  if (!ok)
    throw InternalError(std::string(op) + ": unsupported shape B=" + std::to_string(d.batch) + " S=" +
                        std::to_string(d.seq) + " H=" + std::to_string(d.heads) + " Hkv=" + std::to_string(d.kv_heads) +
                        " Dh=" + std::to_string(d.head_dim));
  if (d.head_dim > 128)
    throw InternalError(std::string(op) + ": head_dim " + std::to_string(d.head_dim) +
                        " is not supported by the CUDA attention kernels (at most 128)");
}

}  // namespace shardtrain::kernels::attention_tiles
