// The few SIMT primitives the tensor-core kernels use (thread and block indices, barriers, warp shuffles,
// the bf16 mma.sync, shared memory, bf16 packing), behind one name each, so that a kernel body written
// against them compiles twice:
//   - by nvcc, where each is the CUDA intrinsic or PTX instruction it names;
//   - by the host compiler with SHARDTRAIN_SIMT_EMULATOR defined, where each is implemented by the SIMT
//     emulator of the tests (tests/kernels/simt_emulator.cpp): every thread of a block is a fiber, barriers
//     and warp collectives are rendezvous, and mma.sync is computed from the fragment layouts the PTX ISA
//     documents. That runs the kernels' own source, indexing and masking included, on a machine with no GPU.
//
// Fragment layout of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), lane = 4 g + t (g = groupID 0..7, t = threadID_in_group 0..3); a 32-bit register holds two
// bf16, the lower-indexed element in its low half:
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, +9]    a[3] = A[g+8][2t+8, +9]
//   B (16 x 8, "col"):      b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32):    c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
#pragma once

#include <cstdint>

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define ST_DEV __device__ __forceinline__

namespace shardtrain::simt {

ST_DEV int thread_x() { return static_cast<int>(threadIdx.x); }
ST_DEV int block_x() { return static_cast<int>(blockIdx.x); }
ST_DEV int block_y() { return static_cast<int>(blockIdx.y); }
ST_DEV int block_z() { return static_cast<int>(blockIdx.z); }
ST_DEV int grid_x() { return static_cast<int>(gridDim.x); }

ST_DEV void sync() { __syncthreads(); }
ST_DEV bool sync_or(bool p) { return __syncthreads_or(p) != 0; }
ST_DEV float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }

// d += a b for one 16 x 8 x 16 tile, fp32 accumulation (sm_80 and later; shardtrain builds for 80 and 90).
ST_DEV void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

ST_DEV unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char shardtrain_simt_smem[];
  return shardtrain_simt_smem;
}

// Two adjacent bf16 (4-byte aligned), the first in the low half.
ST_DEV uint32_t load_u32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// 16 bytes, both addresses 16-byte aligned.
ST_DEV void copy16(void* dst, const void* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}
// Round to nearest even, as shardtrain::bf16.
ST_DEV uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
ST_DEV uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
}

}  // namespace shardtrain::simt

#elif defined(SHARDTRAIN_SIMT_EMULATOR)

#include <cstring>

#include "shardtrain/runtime/dtype.hpp"

#define ST_DEV inline

namespace shardtrain::simt {

// Implemented by tests/kernels/simt_emulator.cpp for the fiber that calls them.
int thread_x();
int block_x();
int block_y();
int block_z();
int grid_x();
void sync();
bool sync_or(bool p);
float shfl_xor(float v, int lane_mask);
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
unsigned char* dynamic_smem();

inline uint32_t load_u32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void copy16(void* dst, const void* src) { std::memcpy(dst, src, 16); }
inline uint16_t bf16_bits(float v) { return bf16_bits_from_float(v); }
inline uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
}

}  // namespace shardtrain::simt

#else
#error "kernels/simt.cuh is device code: compile it with nvcc, or on the host with SHARDTRAIN_SIMT_EMULATOR"
#endif
