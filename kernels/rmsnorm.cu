// RMSNorm kernels: forward and the dh part of backward run one block per row (fp32 block reductions);
// the weight gradient is summed over rows in fixed 64-row chunks, then over the chunks in order.
#include "kernels/device_common.cuh"
#include "kernels/rmsnorm.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::round_to;
using detail::to_f32;

constexpr int kThreads = 256;
constexpr int64_t kRowsPerPart = 64;
constexpr int kColThreads = 128;
constexpr int64_t kMaxBlocks = 1 << 20;

int64_t parts_for(int64_t rows) { return (rows + kRowsPerPart - 1) / kRowsPerPart; }

template <typename T, typename W>
ST_GLOBAL void forward_kernel(const T* __restrict__ x, const T* __restrict__ residual, const W* __restrict__ weight,
                              float eps, int64_t rows, int64_t dim, T* __restrict__ h_out, T* __restrict__ y,
                              float* __restrict__ rstd) {
  ST_SHARED(float, shared, 32);
  for (int64_t r = simt::block_x(); r < rows; r += simt::grid_x()) {
    const T* xr = x + r * dim;
    float ss = 0.0f;
    if (residual != nullptr) {
      const T* rr = residual + r * dim;
      T* hr = h_out + r * dim;
      for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x()) {
        const float h = round_to<T>(to_f32(xr[j]) + to_f32(rr[j]));
        hr[j] = from_f32<T>(h);
        ss += h * h;
      }
    } else {
      for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x()) {
        const float h = to_f32(xr[j]);
        ss += h * h;
      }
    }
    ss = detail::block_sum<kThreads>(ss, shared);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    if (simt::thread_x() == 0) rstd[r] = inv;
    // Each thread re-reads the elements it wrote itself above, so h_out needs no extra synchronization.
    const T* hsrc = residual != nullptr ? h_out + r * dim : xr;
    T* yr = y + r * dim;
    for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x())
      yr[j] = from_f32<T>(to_f32(hsrc[j]) * inv * to_f32(weight[j]));
  }
}

template <typename T, typename W>
ST_GLOBAL void backward_dh_kernel(const T* __restrict__ dy, const T* __restrict__ h, const W* __restrict__ weight,
                                  const float* __restrict__ rstd, const T* __restrict__ dh_extra, T* __restrict__ dh,
                                  int64_t rows, int64_t dim) {
  ST_SHARED(float, shared, 32);
  for (int64_t r = simt::block_x(); r < rows; r += simt::grid_x()) {
    const T* g = dy + r * dim;
    const T* hr = h + r * dim;
    const float inv = rstd[r];
    float dot = 0.0f;
    for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x())
      dot += to_f32(weight[j]) * to_f32(g[j]) * to_f32(hr[j]);
    dot = detail::block_sum<kThreads>(dot, shared);
    const float c = dot * inv / static_cast<float>(dim);
    T* o = dh + r * dim;
    const T* e = dh_extra != nullptr ? dh_extra + r * dim : nullptr;
    for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x()) {
      float v = inv * (to_f32(weight[j]) * to_f32(g[j]) - to_f32(hr[j]) * inv * c);
      if (e != nullptr) v += to_f32(e[j]);
      o[j] = from_f32<T>(v);
    }
  }
}

// partial[p, j] = sum over rows r in [64 p, 64 p + 64) of dy[r, j] * h[r, j] * rstd[r], rows in order.
// grid: (column blocks, parts).
template <typename T>
ST_GLOBAL void dweight_partial_kernel(const T* __restrict__ dy, const T* __restrict__ h, const float* __restrict__ rstd,
                                      int64_t rows, int64_t dim, float* __restrict__ partial) {
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

// dweight[j] += sum over parts p (in order) of partial[p, j].
template <typename D>
ST_GLOBAL void dweight_reduce_kernel(const float* __restrict__ partial, int64_t parts, int64_t dim,
                                     D* __restrict__ dweight) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t j = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); j < dim; j += stride) {
    float s = 0.0f;
    for (int64_t p = 0; p < parts; ++p) s += partial[p * dim + j];
    dweight[j] = from_f32<D>(to_f32(dweight[j]) + s);
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

void rmsnorm_forward(DType dtype, const void* x, const void* residual, DType weight_dtype, const void* weight, float eps,
                     int64_t rows, int64_t dim, void* h_out, void* y, float* rstd, StreamRef stream) {
  if (rows <= 0) return;
  detail::dispatch_float(dtype, "rmsnorm_forward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    detail::dispatch_float(weight_dtype, "rmsnorm_forward", [&](auto wtag) {
      using W = typename decltype(wtag)::type;
      simt::launch(forward_kernel<T, W>, row_grid(rows), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<const T*>(x), static_cast<const T*>(residual), static_cast<const W*>(weight), eps, rows,
                   dim, static_cast<T*>(h_out), static_cast<T*>(y), rstd);
      ST_CHECK_KERNEL("rmsnorm forward_kernel");
    });
  });
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return rows <= 0 || dim <= 0 ? 0 : static_cast<size_t>(parts_for(rows) * dim) * sizeof(float);
}

void rmsnorm_backward(DType dtype, const void* dy, const void* h, DType weight_dtype, const void* weight,
                      const float* rstd, const void* dh_extra, void* dh, int64_t rows, int64_t dim, DType dweight_dtype,
                      void* dweight, void* workspace, size_t workspace_bytes, StreamRef stream) {
  if (rows <= 0 || dim <= 0) return;
  if (workspace_bytes < rmsnorm_backward_workspace_bytes(rows, dim))
    throw InternalError("rmsnorm_backward: workspace of " + std::to_string(workspace_bytes) + " bytes is too small");
  cudaStream_t s = detail::cuda_stream(stream);
  auto* partial = static_cast<float*>(workspace);
  const int64_t parts = parts_for(rows);
  detail::dispatch_float(dtype, "rmsnorm_backward", [&](auto ttag) {
    using T = typename decltype(ttag)::type;
    detail::dispatch_float(weight_dtype, "rmsnorm_backward", [&](auto wtag) {
      using W = typename decltype(wtag)::type;
      simt::launch(backward_dh_kernel<T, W>, row_grid(rows), kThreads, 0, s, static_cast<const T*>(dy),
                   static_cast<const T*>(h), static_cast<const W*>(weight), rstd, static_cast<const T*>(dh_extra),
                   static_cast<T*>(dh), rows, dim);
      ST_CHECK_KERNEL("rmsnorm backward_dh_kernel");
    });
    const dim3 grid(static_cast<unsigned>((dim + kColThreads - 1) / kColThreads),
                    static_cast<unsigned>(parts < 65535 ? parts : 65535));
    simt::launch(dweight_partial_kernel<T>, grid, kColThreads, 0, s, static_cast<const T*>(dy),
                 static_cast<const T*>(h), rstd, rows, dim, partial);
    ST_CHECK_KERNEL("rmsnorm dweight_partial_kernel");
  });
  detail::dispatch_float(dweight_dtype, "rmsnorm_backward", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    simt::launch(dweight_reduce_kernel<D>, detail::grid_for(dim, 256), 256, 0, s, partial, parts, dim,
                 static_cast<D*>(dweight));
    ST_CHECK_KERNEL("rmsnorm dweight_reduce_kernel");
  });
}

}  // namespace shardtrain::kernels
