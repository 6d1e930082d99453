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
ST_DEV void load_tile(float* tile, const T* __restrict__ src, int64_t stride, int first, const int* row_seg, int head_dim,
                      float mul) {
  constexpr int kLd = DMAX + 1;
  for (int e = simt::thread_x(); e < ROWS * DMAX; e += kThreads) {
    const int r = e / DMAX, c = e % DMAX;
    float x = 0.f;
    if (c < head_dim && row_seg[r] >= 0) x = detail::to_f32(src[int64_t(first + r) * stride + c]) * mul;
    tile[r * kLd + c] = x;
  }
}

// Two (RI x CJ) register tiles of dot products over DMAX at once, for the backward kernels: with row i the
// tile row ty + 16 i and column j the tile column tx + 16 j (tiles of leading dimension DMAX + 1),
//   s[i][j] = a0[row i] . b0[col j]   and   dp[i][j] = a1[row i] . b1[col j].
template <int DMAX, int RI, int CJ>
ST_DEV void dual_tile_products(const float* a0, const float* a1, const float* b0, const float* b1, int tx, int ty,
                               float (&s)[RI][CJ], float (&dp)[RI][CJ]) {
  constexpr int kLd = DMAX + 1;
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int j = 0; j < CJ; ++j) s[i][j] = dp[i][j] = 0.f;
#pragma unroll 8
  for (int c = 0; c < DMAX; ++c) {
    float x0[RI], x1[RI], y0[CJ], y1[CJ];
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      x0[i] = a0[(ty + 16 * i) * kLd + c];
      x1[i] = a1[(ty + 16 * i) * kLd + c];
    }
#pragma unroll
    for (int j = 0; j < CJ; ++j) {
      y0[j] = b0[(tx + 16 * j) * kLd + c];
      y1[j] = b1[(tx + 16 * j) * kLd + c];
    }
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        s[i][j] = fmaf(x0[i], y0[j], s[i][j]);
        dp[i][j] = fmaf(x1[i], y1[j], dp[i][j]);
      }
  }
}

// acc[i][d] += sum over the kCols columns c of p[row i][c] * m[c][tx + 16 d]: a (kRows, kCols) tile p of leading
// dimension kPLd (probabilities, or their gradients) times kCols rows of a (kCols, DMAX + 1) tile m.
template <int DMAX, int RI, int DJ>
ST_DEV void accumulate_tile(const float* p, const float* m, int tx, int ty, float (&acc)[RI][DJ]) {
  constexpr int kLd = DMAX + 1;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    float pa[RI], mb[DJ];
#pragma unroll
    for (int i = 0; i < RI; ++i) pa[i] = p[(ty + 16 * i) * kPLd + c];
#pragma unroll
    for (int d = 0; d < DJ; ++d) mb[d] = m[c * kLd + tx + 16 * d];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int d = 0; d < DJ; ++d) acc[i][d] = fmaf(pa[i], mb[d], acc[i][d]);
  }
}

// The shapes the kernels' grids and int indexing can take; head_dim at most 128 (the largest DMAX).
inline void check_dims(const AttentionDims& d, const char* op) {
  const bool ok = d.batch > 0 && d.seq > 0 && d.heads > 0 && d.kv_heads > 0 && d.head_dim > 0 && d.heads % d.kv_heads == 0 &&
                  d.batch <= 65535 && d.kv_heads <= 65535 && d.heads <= 65535 && d.seq <= INT_MAX - 2 * kRows;
  if (!ok)
    throw InternalError(std::string(op) + ": unsupported shape B=" + std::to_string(d.batch) +
                        " S=" + std::to_string(d.seq) + " H=" + std::to_string(d.heads) +
                        " Hkv=" + std::to_string(d.kv_heads) + " Dh=" + std::to_string(d.head_dim));
  if (d.head_dim > 128)
    throw InternalError(std::string(op) + ": head_dim " + std::to_string(d.head_dim) +
                        " is not supported by the CUDA attention kernels (at most 128)");
}

}  // namespace shardtrain::kernels::attention_tiles
