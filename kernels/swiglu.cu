// SwiGLU forward and backward: grid-stride loops in 16-byte vectors (8 bf16 or 4 fp32 per access, scalar where
// a pointer is not 16-byte aligned and for the tail), fp32 math with the accurate expf.
#include "kernels/device_common.cuh"
#include "kernels/swiglu.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::load_floats;
using detail::store_floats;

constexpr int kThreads = 256;

ST_DEV float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
ST_GLOBAL void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                     int64_t n, bool vec) {
  detail::for_each_vector<detail::vector_width<T>()>(n, vec, [&](int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float g[K], u[K], o[K];
    load_floats(gate + i, g);
    load_floats(up + i, u);
    for (int k = 0; k < K; ++k) o[k] = g[k] * sigmoid(g[k]) * u[k];
    store_floats(out + i, o);
  });
}

// dgate and dup may be gate and up (in place): each thread stores only elements it has already loaded.
template <typename T>
ST_GLOBAL void swiglu_backward_kernel(const T* __restrict__ dout, const T* gate, const T* up, T* dgate, T* dup,
                                      int64_t n, bool vec) {
  detail::for_each_vector<detail::vector_width<T>()>(n, vec, [&](int64_t i, auto width) {
    constexpr int K = decltype(width)::value;
    float x[K], y[K], d[K], dg[K], du[K];
    load_floats(gate + i, x);
    load_floats(up + i, y);
    load_floats(dout + i, d);
    for (int k = 0; k < K; ++k) {
      const float s = sigmoid(x[k]);
      const float silu = x[k] * s;
      du[k] = d[k] * silu;
      dg[k] = d[k] * y[k] * (s + silu * (1.0f - s));
    }
    store_floats(dup + i, du);
    store_floats(dgate + i, dg);
  });
}

}  // namespace

void swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t n, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = detail::aligned16(gate, up, out);
    const int64_t items = detail::vector_items(n, detail::vector_width<T>(), vec);
    simt::launch(swiglu_forward_kernel<T>, detail::grid_for(items, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n, vec);
    ST_CHECK_KERNEL("swiglu_forward_kernel");
  });
}

void swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
                     StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = detail::aligned16(dout, gate, up, dgate, dup);
    const int64_t items = detail::vector_items(n, detail::vector_width<T>(), vec);
    simt::launch(swiglu_backward_kernel<T>, detail::grid_for(items, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<const T*>(dout), static_cast<const T*>(gate), static_cast<const T*>(up),
                 static_cast<T*>(dgate), static_cast<T*>(dup), n, vec);
    ST_CHECK_KERNEL("swiglu_backward_kernel");
  });
}

}  // namespace shardtrain::kernels
