// Device-side helpers shared by the kernels in this folder; included only from .cu files (the .cuh
// launcher headers stay plain C++). Storage types are float and __nv_bfloat16, arithmetic is fp32,
// and bf16 stores round to nearest even, as the CPU's shardtrain::bf16 and kernels/cast.cu do.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::kernels::detail {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16_t v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float v) { return __float2bfloat16_rn(v); }

// The value a store of v to T keeps, back in fp32 (what a later load would read).
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_f32(from_f32<T>(v)); }

template <typename T> struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the device storage type of a float dtype (f32 or bf16); anything else throws.
template <typename F> void dispatch_float(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::F32: f(Tag<float>{}); return;
    case DType::BF16: f(Tag<bf16_t>{}); return;
    default: break;
  }
  throw InternalError(std::string(what) + ": dtype " + dtype_name(t) + " is not supported on the GPU (f32 or bf16)");
}

inline cudaStream_t cuda_stream(StreamRef s) { return static_cast<cudaStream_t>(s.handle); }

// Grid size for a grid-stride loop over n items with `threads` per block (at least 1 block).
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32, at most 1024), returned to every thread.
// `shared` holds at least 32 values. The order is fixed, so results are reproducible. Every thread of
// the block must call it (it synchronizes).
template <int kThreads, typename A> __device__ A block_sum(A v, A* shared) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
  constexpr int kWarps = kThreads / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A r = lane < kWarps ? shared[lane] : A(0);
    r = warp_sum(r);
    if (lane == 0) shared[0] = r;
  }
  __syncthreads();
  const A r = shared[0];
  __syncthreads();  // shared may be reused by the caller right away
  return r;
}

__device__ __forceinline__ void record_data_error(DataErrorRecord* rec, DataErrorCode code, int32_t value,
                                                  int64_t index, int64_t bound, int64_t aux = 0) {
  if (rec == nullptr) return;
  if (atomicCAS(reinterpret_cast<int*>(&rec->code), 0, static_cast<int>(code)) == 0) {
    rec->value = value;
    rec->index = index;
    rec->bound = bound;
    rec->aux = aux;
  }
}

}  // namespace shardtrain::kernels::detail
