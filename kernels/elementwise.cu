// Fill, cast-copy, add and scale: grid-stride loops, one element per thread per step.
#include "kernels/device_common.cuh"
#include "kernels/elementwise.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

template <typename T>
ST_GLOBAL void fill_kernel(T* __restrict__ out, int64_t n, float value) {
  const T v = from_f32<T>(value);
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) out[i] = v;
}

template <typename S, typename T>
ST_GLOBAL void copy_kernel(const S* __restrict__ in, T* __restrict__ out, int64_t n) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride)
    out[i] = from_f32<T>(to_f32(in[i]));
}

// x and y never alias (y += x with x == y would be 2y, which no caller asks for), but no __restrict__ on
// purpose: correctness does not depend on it.
template <typename X, typename Y>
ST_GLOBAL void add_kernel(const X* x, Y* y, int64_t n) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride)
    y[i] = from_f32<Y>(to_f32(y[i]) + to_f32(x[i]));
}

template <typename T>
ST_GLOBAL void scale_kernel(T* x, int64_t n, float factor) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride)
    x[i] = from_f32<T>(to_f32(x[i]) * factor);
}

}  // namespace

void elementwise_fill(DType dtype, void* out, int64_t n, float value, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "elementwise_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(fill_kernel<T>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<T*>(out), n, value);
    ST_CHECK_KERNEL("fill_kernel");
  });
}

void elementwise_copy(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n, StreamRef stream) {
  if (n <= 0) return;
  if (src_dtype == dst_dtype) {
    ST_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(src_dtype), cudaMemcpyDeviceToDevice,
                                  detail::cuda_stream(stream)));
    return;
  }
  detail::dispatch_float(src_dtype, "elementwise_copy", [&](auto stag) {
    using S = typename decltype(stag)::type;
    detail::dispatch_float(dst_dtype, "elementwise_copy", [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      simt::launch(copy_kernel<S, T>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<const S*>(src), static_cast<T*>(dst), n);
      ST_CHECK_KERNEL("copy_kernel");
    });
  });
}

void elementwise_add(DType x_dtype, const void* x, DType y_dtype, void* y, int64_t n, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(x_dtype, "elementwise_add", [&](auto xtag) {
    using X = typename decltype(xtag)::type;
    detail::dispatch_float(y_dtype, "elementwise_add", [&](auto ytag) {
      using Y = typename decltype(ytag)::type;
      simt::launch(add_kernel<X, Y>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<const X*>(x), static_cast<Y*>(y), n);
      ST_CHECK_KERNEL("add_kernel");
    });
  });
}

void elementwise_scale(DType dtype, void* x, int64_t n, float factor, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "elementwise_scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(scale_kernel<T>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<T*>(x), n, factor);
    ST_CHECK_KERNEL("scale_kernel");
  });
}

}  // namespace shardtrain::kernels
