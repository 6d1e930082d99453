// Element-wise casts between fp32 and bf16 (round to nearest even), one element per thread, grid-stride.
#include "kernels/cast.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::bf16_t;

constexpr int kThreads = 256;

ST_GLOBAL void f32_to_bf16_kernel(const float* __restrict__ in, bf16_t* __restrict__ out, size_t n) {
  const size_t stride = size_t(simt::grid_x()) * simt::block_dim_x();
  for (size_t i = size_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) {
    out[i] = detail::from_f32<bf16_t>(in[i]);
  }
}

ST_GLOBAL void bf16_to_f32_kernel(const bf16_t* __restrict__ in, float* __restrict__ out, size_t n) {
  const size_t stride = size_t(simt::grid_x()) * simt::block_dim_x();
  for (size_t i = size_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) {
    out[i] = detail::to_f32(in[i]);
  }
}

unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b == 0 ? 1 : b) : 65535 * 8);
}

}  // namespace

void cast_f32_to_bf16(const float* in, uint16_t* out, size_t n, StreamRef stream) {
  if (n == 0) return;
  simt::launch(f32_to_bf16_kernel, blocks_for(n), kThreads, 0, detail::cuda_stream(stream), in,
               reinterpret_cast<bf16_t*>(out), n);
  ST_CHECK_KERNEL("f32_to_bf16_kernel");
}

void cast_bf16_to_f32(const uint16_t* in, float* out, size_t n, StreamRef stream) {
  if (n == 0) return;
  simt::launch(bf16_to_f32_kernel, blocks_for(n), kThreads, 0, detail::cuda_stream(stream),
               reinterpret_cast<const bf16_t*>(in), out, n);
  ST_CHECK_KERNEL("bf16_to_f32_kernel");
}

}  // namespace shardtrain::kernels
