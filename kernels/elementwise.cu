// Fill, cast-copy, add and scale: grid-stride loops in 16-byte vectors (scalar where a pointer is not 16-byte
// aligned, and for the tail).
#include "kernels/device_common.cuh"
#include "kernels/elementwise.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::load_floats;
using detail::store_floats;

constexpr int kThreads = 256;

template <typename T>
ST_GLOBAL void fill_kernel(T* __restrict__ out, int64_t n, float value, bool vec) {
  detail::for_each_vector<detail::vector_width<T>()>(n, vec, [&](int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float v[K];
    for (int k = 0; k < K; ++k) v[k] = value;
    store_floats(out + i, v);
  });
}

template <typename S, typename T>
ST_GLOBAL void copy_kernel(const S* __restrict__ in, T* __restrict__ out, int64_t n, bool vec) {
  detail::for_each_vector<detail::vector_width<S, T>()>(n, vec, [&](int64_t i, auto width) {
    float v[decltype(width)::value];
    load_floats(in + i, v);
    store_floats(out + i, v);
  });
}

// x and y never alias (y += x with x == y would be 2y, which no caller asks for), but no __restrict__ on
// purpose: correctness does not depend on it.
template <typename X, typename Y>
ST_GLOBAL void add_kernel(const X* x, Y* y, int64_t n, bool vec) {
  detail::for_each_vector<detail::vector_width<X, Y>()>(n, vec, [&](int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float a[K], b[K];
    load_floats(x + i, a);
    load_floats(y + i, b);
    for (int k = 0; k < K; ++k) b[k] += a[k];
    store_floats(y + i, b);
  });
}

template <typename T>
ST_GLOBAL void scale_kernel(T* x, int64_t n, float factor, bool vec) {
  detail::for_each_vector<detail::vector_width<T>()>(n, vec, [&](int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float v[K];
    load_floats(x + i, v);
    for (int k = 0; k < K; ++k) v[k] *= factor;
    store_floats(x + i, v);
  });
}

// Blocks for n elements moved k at a time.
unsigned blocks(int64_t n, int k, bool vec) { return detail::grid_for(detail::vector_items(n, k, vec), kThreads); }

}  // namespace

void elementwise_fill(DType dtype, void* out, int64_t n, float value, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "elementwise_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = detail::aligned16(out);
    simt::launch(fill_kernel<T>, blocks(n, detail::vector_width<T>(), vec), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<T*>(out), n, value, vec);
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
      const bool vec = detail::aligned16(src, dst);
      simt::launch(copy_kernel<S, T>, blocks(n, detail::vector_width<S, T>(), vec), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<const S*>(src), static_cast<T*>(dst), n, vec);
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
      const bool vec = detail::aligned16(x, y);
      simt::launch(add_kernel<X, Y>, blocks(n, detail::vector_width<X, Y>(), vec), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<const X*>(x), static_cast<Y*>(y), n, vec);
      ST_CHECK_KERNEL("add_kernel");
    });
  });
}

void elementwise_scale(DType dtype, void* x, int64_t n, float factor, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "elementwise_scale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = detail::aligned16(x);
    simt::launch(scale_kernel<T>, blocks(n, detail::vector_width<T>(), vec), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<T*>(x), n, factor, vec);
    ST_CHECK_KERNEL("scale_kernel");
  });
}

}  // namespace shardtrain::kernels
