// Element-wise casts, vectorized four elements per thread, grid-stride.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cast.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __float2bfloat16_rn(in[i]);
  }
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __bfloat162float(in[i]);
  }
}

unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b == 0 ? 1 : b) : 65535 * 8);
}

}  // namespace

void cast_f32_to_bf16(const float* in, uint16_t* out, size_t n, StreamRef stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      in, reinterpret_cast<__nv_bfloat16*>(out), n);
  ST_CHECK_KERNEL("f32_to_bf16_kernel");
}

void cast_bf16_to_f32(const uint16_t* in, float* out, size_t n, StreamRef stream) {
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      reinterpret_cast<const __nv_bfloat16*>(in), out, n);
  ST_CHECK_KERNEL("bf16_to_f32_kernel");
}

}  // namespace shardtrain::kernels
