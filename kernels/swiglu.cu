// SwiGLU forward and backward: grid-stride loops in 16-byte vectors (8 bf16 or 4 fp32 per access) over rows of
// gate and up `stride` apart (the (N, 2F) gate_up of the fused gate/up GEMM, or one flat row), scalar where a
// pointer or the row stride is not 16-byte aligned, and for each row's tail; fp32 math with the accurate expf.
#include "kernels/device_common.cuh"
#include "kernels/swiglu.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::load_floats;
using detail::store_floats;
using detail::Width;

constexpr int kThreads = 256;

ST_DEV float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// body(g, o, Width<W>) for every vector of K elements (g: its offset in gate's rows, o: in the output's), then
// every element of each row's tail (cols % K) with W = 1. K > 1 only where every row start is 16-byte aligned.
template <int K, typename F>
ST_DEV void for_each_row_vector(int64_t rows, int64_t cols, int64_t stride, F&& body) {
  const int64_t step = int64_t(simt::grid_x()) * simt::block_dim_x();
  const int64_t first = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x();
  const int64_t per_row = cols / K, tail = cols - per_row * K;
  for (int64_t j = first; j < rows * per_row; j += step) {
    const int64_t r = j / per_row, c = (j - r * per_row) * K;
    body(r * stride + c, r * cols + c, Width<K>{});
  }
  for (int64_t j = first; j < rows * tail; j += step) {
    const int64_t r = j / tail, c = per_row * K + (j - r * tail);
    body(r * stride + c, r * cols + c, Width<1>{});
  }
}

template <typename T, int K>
ST_GLOBAL void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t stride,
                                     T* __restrict__ out, int64_t rows, int64_t cols) {
  for_each_row_vector<K>(rows, cols, stride, [&](int64_t g, int64_t oi, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W], u[W], o[W];
    load_floats(gate + g, x);
    load_floats(up + g, u);
    for (int k = 0; k < W; ++k) o[k] = x[k] * sigmoid(x[k]) * u[k];
    store_floats(out + oi, o);
  });
}

// dgate and dup may be gate and up (in place): each thread stores only elements it has already loaded.
template <typename T, int K>
ST_GLOBAL void swiglu_backward_kernel(const T* __restrict__ dout, const T* gate, const T* up, int64_t stride, T* dgate,
                                      T* dup, int64_t rows, int64_t cols) {
  for_each_row_vector<K>(rows, cols, stride, [&](int64_t g, int64_t oi, auto width) {
    constexpr int W = decltype(width)::value;
    float x[W], y[W], d[W], dg[W], du[W];
    load_floats(gate + g, x);
    load_floats(up + g, y);
    load_floats(dout + oi, d);
    for (int k = 0; k < W; ++k) {
      const float s = sigmoid(x[k]);
      const float silu = x[k] * s;
      du[k] = d[k] * silu;
      dg[k] = d[k] * y[k] * (s + silu * (1.0f - s));
    }
    store_floats(dup + g, du);
    store_floats(dgate + g, dg);
  });
}

// Calls f(std::integral_constant<int, K>{}): 16-byte vectors when every array and every row start is aligned
// (one row: any length, the tail goes scalar; several: a whole number of vectors per row), else K = 1.
template <typename T, typename F, typename... P>
void with_width(int64_t rows, int64_t cols, int64_t stride, F&& f, const P*... arrays) {
  constexpr int kWide = detail::vector_width<T>();
  const bool rows_aligned = rows == 1 || (cols % kWide == 0 && stride % kWide == 0);
  if (rows_aligned && detail::aligned16(arrays...)) {
    f(std::integral_constant<int, kWide>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace

void swiglu_forward(DType dtype, const void* gate, const void* up, int64_t stride, void* out, int64_t rows, int64_t cols,
                    StreamRef stream) {
  if (rows <= 0 || cols <= 0) return;
  detail::dispatch_float(dtype, "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width<T>(
        rows, cols, stride,
        [&](auto width) {
          constexpr int K = decltype(width)::value;
          const int64_t items = rows * (cols / K) + rows * (cols % K);
          simt::launch(swiglu_forward_kernel<T, K>, detail::grid_for(items, kThreads), kThreads, 0,
                       detail::cuda_stream(stream), static_cast<const T*>(gate), static_cast<const T*>(up), stride,
                       static_cast<T*>(out), rows, cols);
          ST_CHECK_KERNEL("swiglu_forward_kernel");
        },
        gate, up, out);
  });
}

void swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up, int64_t stride, void* dgate, void* dup,
                     int64_t rows, int64_t cols, StreamRef stream) {
  if (rows <= 0 || cols <= 0) return;
  detail::dispatch_float(dtype, "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width<T>(
        rows, cols, stride,
        [&](auto width) {
          constexpr int K = decltype(width)::value;
          const int64_t items = rows * (cols / K) + rows * (cols % K);
          simt::launch(swiglu_backward_kernel<T, K>, detail::grid_for(items, kThreads), kThreads, 0,
                       detail::cuda_stream(stream), static_cast<const T*>(dout), static_cast<const T*>(gate),
                       static_cast<const T*>(up), stride, static_cast<T*>(dgate), static_cast<T*>(dup), rows, cols);
          ST_CHECK_KERNEL("swiglu_backward_kernel");
        },
        dout, gate, up, dgate, dup);
  });
}

}  // namespace shardtrain::kernels
