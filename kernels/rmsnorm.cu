// RMSNorm kernels: forward and the dh part of backward run one warp per row (fp32 warp sums, 16-byte accesses
// where the row length and alignment allow). The weight gradient is summed over rows in fixed 64-row parts,
// then over the parts in a fixed order: inside the dh kernel when a block's per-warp sums fit in shared memory
// (dim <= 12288), else by a second pass over dy and h.
#include "kernels/device_common.cuh"
#include "kernels/rmsnorm.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::load_floats;
using detail::round_to;
using detail::store_floats;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr int64_t kRowsPerPart = 64;
constexpr int kColThreads = 128;
constexpr int64_t kMaxBlocks = 1 << 20;
// The fused backward keeps one fp32 row of dweight sums per warp in shared memory: warps * dim * 4 bytes, at
// most the 48 KiB a block gets without an opt-in, so 8 warps up to dim 1536 and 1 up to dim 12288.
constexpr int64_t kFusedSmemBytes = 48 * 1024;
// The parts' sums: 32 columns a block, each summed by 16 groups of parts (group g: parts g, g + 16, ...),
// then the groups in order.
constexpr int kReduceCols = 32;
constexpr int kReduceGroups = 16;

int fused_warps(int64_t dim) {
  const int64_t w = kFusedSmemBytes / (dim * static_cast<int64_t>(sizeof(float)));
  return static_cast<int>(w < kThreads / 32 ? w : kThreads / 32);
}

int64_t parts_for(int64_t rows) { return (rows + kRowsPerPart - 1) / kRowsPerPart; }

// One warp per row (grid-stride over rows), K elements per access: K = 16 bytes of the wider of T and W when
// dim is a multiple of it and every array is 16-byte aligned, else 1. Sums of squares and dots are warp sums.
template <int K, typename T, typename W>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ weight, float eps,
                           int64_t rows, int64_t dim, T* __restrict__ h_out, T* __restrict__ y, float* __restrict__ rstd) {
  const int lane = simt::thread_x() % 32;
  const int64_t warps = int64_t(simt::grid_x()) * (kThreads / 32);
  for (int64_t r = int64_t(simt::block_x()) * (kThreads / 32) + simt::thread_x() / 32; r < rows; r += warps) {
    const int64_t row = r * dim;
    float ss = 0.0f;
    for (int64_t j = int64_t(lane) * K; j < dim; j += 32 * K) {
      float h[K];
      load_floats(x + row + j, h);
      if (residual != nullptr) {
        float res[K];
        load_floats(residual + row + j, res);
        for (int k = 0; k < K; ++k) h[k] = round_to<T>(h[k] + res[k]);
        store_floats(h_out + row + j, h);
      }
      for (int k = 0; k < K; ++k) ss += h[k] * h[k];
    }
    ss = detail::warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    if (lane == 0) rstd[r] = inv;
    // Each lane re-reads the elements it wrote itself above, so h_out needs no extra synchronization.
    const T* hsrc = residual != nullptr ? h_out : x;
    for (int64_t j = int64_t(lane) * K; j < dim; j += 32 * K) {
      float h[K], w[K];
      load_floats(hsrc + row + j, h);
      load_floats(weight + j, w);
      for (int k = 0; k < K; ++k) h[k] = h[k] * inv * w[k];
      store_floats(y + row + j, h);
    }
  }
}

// dh[r, :] = rstd * (weight * dy - h * rstd * c) + dh_extra, c = rstd * dot(weight * dy, h) / dim, for one row r
// by one warp (each lane its own K-wide columns); with sums != nullptr, also sums[j] += dy[r, j] * h[r, j] *
// rstd[r] over the lane's columns, from the same loads.
template <int K, typename T, typename W>
ST_DEV void backward_row(const T* __restrict__ dy, const T* __restrict__ h, const W* __restrict__ weight,
                         const float* __restrict__ rstd, const T* __restrict__ dh_extra, T* __restrict__ dh, int64_t r,
                         int64_t dim, int lane, float* __restrict__ sums) {
  const int64_t row = r * dim;
  const float inv = rstd[r];
  float dot = 0.0f;
  for (int64_t j = int64_t(lane) * K; j < dim; j += 32 * K) {
    float g[K], hv[K], w[K];
    load_floats(dy + row + j, g);
    load_floats(h + row + j, hv);
    load_floats(weight + j, w);
    for (int k = 0; k < K; ++k) dot += w[k] * g[k] * hv[k];
  }
  dot = detail::warp_sum(dot);
  const float c = dot * inv / static_cast<float>(dim);
  for (int64_t j = int64_t(lane) * K; j < dim; j += 32 * K) {
    float g[K], hv[K], w[K], e[K];
    load_floats(dy + row + j, g);
    load_floats(h + row + j, hv);
    load_floats(weight + j, w);
    if (dh_extra != nullptr) {
      load_floats(dh_extra + row + j, e);
    } else {
      for (int k = 0; k < K; ++k) e[k] = 0.0f;
    }
    if (sums != nullptr)
      for (int k = 0; k < K; ++k) sums[j + k] += g[k] * hv[k] * inv;
    for (int k = 0; k < K; ++k) g[k] = inv * (w[k] * g[k] - hv[k] * inv * c) + e[k];
    store_floats(dh + row + j, g);
  }
}

// One warp per row (grid-stride): dh only (dweight by a second pass, rmsnorm_dweight_partial_kernel).
template <int K, typename T, typename W>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    rmsnorm_backward_dh_kernel(const T* __restrict__ dy, const T* __restrict__ h, const W* __restrict__ weight,
                               const float* __restrict__ rstd, const T* __restrict__ dh_extra, T* __restrict__ dh,
                               int64_t rows, int64_t dim) {
  const int lane = simt::thread_x() % 32;
  const int64_t warps = int64_t(simt::grid_x()) * (kThreads / 32);
  for (int64_t r = int64_t(simt::block_x()) * (kThreads / 32) + simt::thread_x() / 32; r < rows; r += warps)
    backward_row<K>(dy, h, weight, rstd, dh_extra, dh, r, dim, lane, static_cast<float*>(nullptr));
}

// dh as rmsnorm_backward_dh_kernel computes it, and partial[p, j] = the sum over rows r in [64 p, 64 p + 64) of
// dy[r, j] * h[r, j] * rstd[r] from the same loads: one block per part (grid-stride), warp w of W takes rows
// 64 p + w, + W, ... in order into its own shared-memory row (each lane only its own columns, so no barrier
// inside a warp); the W rows are then added in order w = 0, 1, ... The order is fixed by dim alone.
template <int K, typename T, typename W>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    rmsnorm_backward_fused_kernel(const T* __restrict__ dy, const T* __restrict__ h, const W* __restrict__ weight,
                                  const float* __restrict__ rstd, const T* __restrict__ dh_extra, T* __restrict__ dh,
                                  int64_t rows, int64_t dim, float* __restrict__ partial) {
  float* const sums = reinterpret_cast<float*>(simt::dynamic_smem());
  const int lane = simt::thread_x() % 32, warp = simt::thread_x() / 32, warps = simt::block_dim_x() / 32;
  float* const mine = sums + int64_t(warp) * dim;
  for (int64_t p = simt::block_x(); p * kRowsPerPart < rows; p += simt::grid_x()) {
    for (int64_t j = int64_t(lane) * K; j < dim; j += 32 * K)
      for (int k = 0; k < K; ++k) mine[j + k] = 0.0f;
    const int64_t r1 = (p + 1) * kRowsPerPart < rows ? (p + 1) * kRowsPerPart : rows;
    for (int64_t r = p * kRowsPerPart + warp; r < r1; r += warps)
      backward_row<K>(dy, h, weight, rstd, dh_extra, dh, r, dim, lane, mine);
    simt::sync();
    for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x()) {
      float s = 0.0f;
      for (int w = 0; w < warps; ++w) s += sums[int64_t(w) * dim + j];
      partial[p * dim + j] = s;
    }
    simt::sync();  // before the next part zeroes the rows
  }
}

// partial[p, j] = sum over rows r in [64 p, 64 p + 64) of dy[r, j] * h[r, j] * rstd[r], rows in order.
// grid: (column blocks, parts).
template <typename T>
ST_GLOBAL void rmsnorm_dweight_partial_kernel(const T* __restrict__ dy, const T* __restrict__ h,
                                              const float* __restrict__ rstd, int64_t rows, int64_t dim,
                                              float* __restrict__ partial) {
  const int64_t j = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x();
  if (j >= dim) return;
  for (int64_t p = simt::block_y(); p * kRowsPerPart < rows; p += simt::grid_y()) {
    const int64_t r0 = p * kRowsPerPart;
    const int64_t r1 = r0 + kRowsPerPart < rows ? r0 + kRowsPerPart : rows;
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; ++r) acc += to_f32(dy[r * dim + j]) * to_f32(h[r * dim + j]) * rstd[r];
    partial[p * dim + j] = acc;
  }
}

// dweight[j] += the sum over parts p of partial[p, j]: group g sums parts g, g + 16, ... in order, then the 16
// groups' sums are added in order. A block per 32 columns, each warp one group (the loads of a warp coalesce).
template <typename D>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kReduceCols* kReduceGroups)
    rmsnorm_dweight_reduce_kernel(const float* __restrict__ partial, int64_t parts, int64_t dim, D* __restrict__ dweight) {
  ST_SHARED(float, group_sums, kReduceCols* kReduceGroups);
  const int c = simt::thread_x() % kReduceCols, g = simt::thread_x() / kReduceCols;
  const int64_t j = int64_t(simt::block_x()) * kReduceCols + c;
  float s = 0.0f;
  if (j < dim)
    for (int64_t p = g; p < parts; p += kReduceGroups) s += partial[p * dim + j];
  group_sums[g * kReduceCols + c] = s;
  simt::sync();
  if (g == 0 && j < dim) {
    float t = 0.0f;
    for (int q = 0; q < kReduceGroups; ++q) t += group_sums[q * kReduceCols + c];
    dweight[j] = from_f32<D>(to_f32(dweight[j]) + t);
  }
}

// Blocks for one warp per row.
unsigned row_grid(int64_t rows) {
  const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace

void rmsnorm_forward(DType dtype, const void* x, const void* residual, DType weight_dtype, const void* weight, float eps,
                     int64_t rows, int64_t dim, void* h_out, void* y, float* rstd, StreamRef stream) {
  if (rows <= 0) return;
  detail::dispatch_float(dtype, "rmsnorm_forward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    detail::dispatch_float(weight_dtype, "rmsnorm_forward", [&](auto wtag) {
      using W = typename decltype(wtag)::type;
      detail::with_row_width<T, W>(
          dim,
          [&](auto width) {
            simt::launch(rmsnorm_forward_kernel<decltype(width)::value, T, W>, row_grid(rows), kThreads, 0,
                         detail::cuda_stream(stream), static_cast<const T*>(x), static_cast<const T*>(residual),
                         static_cast<const W*>(weight), eps, rows, dim, static_cast<T*>(h_out), static_cast<T*>(y), rstd);
            ST_CHECK_KERNEL("rmsnorm_forward_kernel");
          },
          x, residual, weight, h_out, y);
    });
  });
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return rows <= 0 || dim <= 0 ? 0 : static_cast<size_t>(parts_for(rows) * dim) * sizeof(float);
}

void rmsnorm_backward(DType dtype, const void* dy, const void* h, DType weight_dtype, const void* weight, const float* rstd,
                      const void* dh_extra, void* dh, int64_t rows, int64_t dim, DType dweight_dtype, void* dweight,
                      void* workspace, size_t workspace_bytes, StreamRef stream) {
  if (rows <= 0 || dim <= 0) return;
  if (workspace_bytes < rmsnorm_backward_workspace_bytes(rows, dim))
    throw InternalError("rmsnorm_backward: workspace of " + std::to_string(workspace_bytes) + " bytes is too small");
  cudaStream_t s = detail::cuda_stream(stream);
  auto* partial = static_cast<float*>(workspace);
  const int64_t parts = parts_for(rows);
  const int warps = fused_warps(dim);
  detail::dispatch_float(dtype, "rmsnorm_backward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    detail::dispatch_float(weight_dtype, "rmsnorm_backward", [&](auto wtag) {
      using W = typename decltype(wtag)::type;
      detail::with_row_width<T, W>(
          dim,
          [&](auto width) {
            constexpr int K = decltype(width)::value;
            if (warps > 0) {
              simt::launch(rmsnorm_backward_fused_kernel<K, T, W>,
                           static_cast<unsigned>(parts < kMaxBlocks ? parts : kMaxBlocks), warps * 32,
                           static_cast<size_t>(warps * dim) * sizeof(float), s, static_cast<const T*>(dy),
                           static_cast<const T*>(h), static_cast<const W*>(weight), rstd, static_cast<const T*>(dh_extra),
                           static_cast<T*>(dh), rows, dim, partial);
              ST_CHECK_KERNEL("rmsnorm_backward_fused_kernel");
            } else {
              simt::launch(rmsnorm_backward_dh_kernel<K, T, W>, row_grid(rows), kThreads, 0, s, static_cast<const T*>(dy),
                           static_cast<const T*>(h), static_cast<const W*>(weight), rstd, static_cast<const T*>(dh_extra),
                           static_cast<T*>(dh), rows, dim);
              ST_CHECK_KERNEL("rmsnorm_backward_dh_kernel");
            }
          },
          dy, h, weight, dh_extra, dh);
    });
    if (warps == 0) {
      const dim3 grid(static_cast<unsigned>((dim + kColThreads - 1) / kColThreads),
                      static_cast<unsigned>(parts < 65535 ? parts : 65535));
      simt::launch(rmsnorm_dweight_partial_kernel<T>, grid, kColThreads, 0, s, static_cast<const T*>(dy),
                   static_cast<const T*>(h), rstd, rows, dim, partial);
      ST_CHECK_KERNEL("rmsnorm_dweight_partial_kernel");
    }
  });
  detail::dispatch_float(dweight_dtype, "rmsnorm_backward", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    simt::launch(rmsnorm_dweight_reduce_kernel<D>, static_cast<unsigned>((dim + kReduceCols - 1) / kReduceCols),
                 kReduceCols * kReduceGroups, 0, s, partial, parts, dim, static_cast<D*>(dweight));
    ST_CHECK_KERNEL("rmsnorm_dweight_reduce_kernel");
  });
}

}  // namespace shardtrain::kernels
