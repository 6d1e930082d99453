// SwiGLU forward and backward: grid-stride element loops, fp32 math with the accurate expf.
#include "kernels/device_common.cuh"
#include "kernels/swiglu.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

ST_DEV float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
ST_GLOBAL void forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out, int64_t n) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) {
    const float x = to_f32(gate[i]);
    out[i] = from_f32<T>(x * sigmoid(x) * to_f32(up[i]));
  }
}

template <typename T>
ST_GLOBAL void backward_kernel(const T* __restrict__ dout, const T* __restrict__ gate, const T* __restrict__ up,
                               T* __restrict__ dgate, T* __restrict__ dup, int64_t n) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) {
    const float x = to_f32(gate[i]), y = to_f32(up[i]), d = to_f32(dout[i]);
    const float s = sigmoid(x);
    const float silu = x * s;
    dup[i] = from_f32<T>(d * silu);
    dgate[i] = from_f32<T>(d * y * (s + silu * (1.0f - s)));
  }
}

}  // namespace

void swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t n, StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "swiglu_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(forward_kernel<T>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
    ST_CHECK_KERNEL("swiglu forward_kernel");
  });
}

void swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
                     StreamRef stream) {
  if (n <= 0) return;
  detail::dispatch_float(dtype, "swiglu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(backward_kernel<T>, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<const T*>(dout), static_cast<const T*>(gate), static_cast<const T*>(up),
                 static_cast<T*>(dgate), static_cast<T*>(dup), n);
    ST_CHECK_KERNEL("swiglu backward_kernel");
  });
}

}  // namespace shardtrain::kernels
