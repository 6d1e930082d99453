// The SIMT primitives the kernels of this folder use (thread and block indices, barriers, warp shuffles, an
// atomic, the bf16 mma.sync, shared memory, correctly rounded fp32 operations), and the kernel launch, behind
// one name each, so that a kernel written against them compiles twice:
//   - by nvcc, where each is the CUDA intrinsic, PTX instruction or <<<>>> launch it names;
//   - by the host compiler with SHARDTRAIN_SIMT_EMULATOR defined, where each is implemented by the SIMT
//     emulator of the tests (tests/emulator/simt_emulator.cpp): every thread of a block is a fiber, barriers
//     and warp collectives are rendezvous, and mma.sync is computed from the fragment layouts the PTX ISA
//     documents. That runs the kernels' own source, launchers, indexing and masking included, on a machine
//     with no GPU (tests/kernels/kernels_emulated_test.cpp, attention_mma_emulated_test.cpp).
//
// Kernels are declared `ST_GLOBAL void ST_LAUNCH_BOUNDS(n) name(...)`, device helpers `ST_DEV`, static shared
// arrays `ST_SHARED(type, name, count);` (used as name[i]), dynamic shared memory through dynamic_smem(), and
// launched with simt::launch(kernel, grid, block, smem_bytes, stream, args...).
//
// Fragment layout of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), lane = 4 g + t (g = groupID 0..7, t = threadID_in_group 0..3); a 32-bit register holds two
// bf16, the lower-indexed element in its low half:
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, +9]    a[3] = A[g+8][2t+8, +9]
//   B (16 x 8, "col"):      b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32):    c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
//
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 (PTX ISA, "Warp-level matrix load instruction: ldmatrix")
// reads four 8 x 8 b16 matrices from shared memory, one register of each per lane. Lane l gives the address of
// row l % 8 of matrix l / 8 (8 contiguous b16, 16-byte aligned). Register i of lane 4g + t then holds matrix
// i's row g, columns 2t and 2t+1 (an mma fragment register); with .trans, column g, rows 2t and 2t+1 (the
// fragment of the transposed matrix).
//
// cp.async.cg.shared.global (16 bytes) copies global to shared memory without registers, asynchronously:
// cp_async_commit closes the thread's current group of copies, cp_async_wait<N> waits until at most the N
// newest committed groups of this thread are still in flight. The bytes are this thread's to read after the
// wait and every thread's after a barrier that follows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define ST_DEV __device__ __forceinline__
#define ST_GLOBAL __global__
#define ST_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#define ST_SHARED(type, name, count) __shared__ type name[count]

namespace shardtrain::simt {

ST_DEV int thread_x() { return static_cast<int>(threadIdx.x); }
ST_DEV int block_x() { return static_cast<int>(blockIdx.x); }
ST_DEV int block_y() { return static_cast<int>(blockIdx.y); }
ST_DEV int block_z() { return static_cast<int>(blockIdx.z); }
ST_DEV int block_dim_x() { return static_cast<int>(blockDim.x); }
ST_DEV int grid_x() { return static_cast<int>(gridDim.x); }
ST_DEV int grid_y() { return static_cast<int>(gridDim.y); }

ST_DEV void sync() { __syncthreads(); }
ST_DEV bool sync_or(bool p) { return __syncthreads_or(p) != 0; }
// Full-warp shuffles (every lane of the warp takes part), of 4- or 8-byte arithmetic values.
template <typename T>
ST_DEV T shfl_xor(T v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
template <typename T>
ST_DEV T shfl_up(T v, int delta) {
  return __shfl_up_sync(0xffffffffu, v, delta);
}
ST_DEV int atomic_cas(int* p, int compare, int value) { return atomicCAS(p, compare, value); }

// fp32 operations rounded to nearest and never contracted into FMAs (bit-for-bit the CPU's -ffp-contract=off).
ST_DEV float fadd_rn(float a, float b) { return __fadd_rn(a, b); }
ST_DEV float fsub_rn(float a, float b) { return __fsub_rn(a, b); }
ST_DEV float fmul_rn(float a, float b) { return __fmul_rn(a, b); }
ST_DEV float fdiv_rn(float a, float b) { return __fdiv_rn(a, b); }
ST_DEV float fsqrt_rn(float a) { return __fsqrt_rn(a); }
// A load through the read-only (non-coherent) cache: only for data no thread writes during the kernel.
template <typename T>
ST_DEV T ldg(const T* p) {
  return __ldg(p);
}

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

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 (sm_80 and later; layouts above the includes).
ST_DEV void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  __trap();
#endif
}
ST_DEV void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#else
  __trap();
#endif
}
// cp.async.cg.shared.global, 16 bytes (both addresses 16-byte aligned), and its groups (layouts and rules above
// the includes).
ST_DEV void cp_async16(void* smem_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
#else
  __trap();
#endif
}
ST_DEV void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
ST_DEV void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

ST_DEV unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char shardtrain_simt_smem[];
  return shardtrain_simt_smem;
}

// Two adjacent bf16 (4-byte aligned), the first in the low half.
ST_DEV uint32_t load_u32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// B bytes (2, 4, 8 or 16) in one access, both addresses B-byte aligned (a misaligned one faults).
template <int B>
ST_DEV void copy_aligned(void* dst, const void* src) {
  static_assert(B == 2 || B == 4 || B == 8 || B == 16, "one access moves 2, 4, 8 or 16 bytes");
  if constexpr (B == 16) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  if constexpr (B == 8) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
  if constexpr (B == 4) *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
  if constexpr (B == 2) *reinterpret_cast<uint16_t*>(dst) = *reinterpret_cast<const uint16_t*>(src);
}
ST_DEV void copy16(void* dst, const void* src) { copy_aligned<16>(dst, src); }
// Round to nearest even, as shardtrain::bf16.
ST_DEV uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
ST_DEV uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
}

// Host side: kernel<<<grid, block, smem_bytes, stream>>>(args...) (a pointer to a __global__ function taken in
// host code launches it).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
}

}  // namespace shardtrain::simt

#elif defined(SHARDTRAIN_SIMT_EMULATOR)

#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>

#include "shardtrain/runtime/dtype.hpp"

#define ST_DEV inline
#define ST_GLOBAL inline
#define ST_LAUNCH_BOUNDS(threads)
// Per block, per call site (a static's address is the key); starts as 0xFF bytes like dynamic_smem().
#define ST_SHARED(type, name, count) \
  static char name##_shared_site_;   \
  type* const name = static_cast<type*>(::shardtrain::simt::static_smem(&name##_shared_site_, sizeof(type) * (count)))

// What the launchers use of the CUDA runtime, on host memory: launch configurations, streams (ignored: the
// emulator runs every launch to completion, in call order), float4, memset/memcpy and the function attribute
// that allows more than 48 KiB of dynamic shared memory (the emulator enforces it, as the GPU does). In
// namespace shardtrain, where the kernels' unqualified uses find them, so they never meet CUDA's own.
namespace shardtrain {
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
  float x, y, z, w;
};
using cudaStream_t = struct CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
namespace simt {
// Where a launch or an asynchronous copy goes: run at once (the kernel tests), or queued on its stream by the
// CUDA runtime emulator (tests/emulator/cuda_runtime.cpp, SHARDTRAIN_CUDA=EMULATED), which also checks that
// every pointer handed to the device is device memory.
void submit(void* stream, std::function<void()> work, const char* what);
void check_device_range(const void* p, size_t bytes, const char* what);
}  // namespace simt
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr) {
  simt::check_device_range(p, bytes, "cudaMemsetAsync (a launcher's)");
  simt::submit(
      stream, [=] { std::memset(p, value, bytes); }, "cudaMemsetAsync");
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream = nullptr) {
  simt::check_device_range(dst, bytes, "cudaMemcpyAsync destination (a launcher's)");
  simt::check_device_range(src, bytes, "cudaMemcpyAsync source (a launcher's)");
  simt::submit(
      stream, [=] { std::memmove(dst, src, bytes); }, "cudaMemcpyAsync");
  return cudaSuccess;
}
}  // namespace shardtrain

namespace shardtrain::simt {

// Implemented by tests/emulator/simt_emulator.cpp for the fiber that calls them.
int thread_x();
int block_x();
int block_y();
int block_z();
int block_dim_x();
int grid_x();
int grid_y();
void sync();
bool sync_or(bool p);
void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
void ldmatrix(uint32_t* r, int matrices, bool trans, const uint16_t* row);
inline void ldmatrix_x4(uint32_t r[4], const uint16_t* row) { ldmatrix(r, 4, false, row); }
inline void ldmatrix_x4_trans(uint32_t r[4], const uint16_t* row) { ldmatrix(r, 4, true, row); }
// The copy's source is read now; its destination is written now or when a cp_async_wait completes its group,
// the two ends of what the GPU allows (which one: tests/emulator/simt_emulator.hpp).
void cp_async16(void* smem_dst, const void* global_src);
void cp_async_commit();
void cp_async_wait_group(int n);
template <int N>
void cp_async_wait() {
  cp_async_wait_group(N);
}
unsigned char* dynamic_smem();
void* static_smem(const void* site, size_t bytes);
enum class ShuffleKind { Xor, Up };
// Exchanges the `bytes` at `value` (at most 8) with the lane the kind and operand name, across the whole warp.
void shuffle(void* value, size_t bytes, ShuffleKind kind, int operand);
void set_max_dynamic_smem(const void* kernel, int bytes);
// A B-byte access at an address not B-byte aligned: the GPU's misaligned-address fault (stops the process).
[[noreturn]] void misaligned_access(const void* dst, const void* src, int bytes);
void count_access16();  // for simt_emulator::last_stats()
// Throws what the GPU would refuse (grid limits, dynamic shared memory past the kernel's attribute).
void check_launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes);
void launch_emulated(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body);

template <typename T>
T shfl_xor(T v, int lane_mask) {
  static_assert(std::is_arithmetic_v<T> && sizeof(T) <= 8);
  shuffle(&v, sizeof v, ShuffleKind::Xor, lane_mask);
  return v;
}
template <typename T>
T shfl_up(T v, int delta) {
  static_assert(std::is_arithmetic_v<T> && sizeof(T) <= 8);
  shuffle(&v, sizeof v, ShuffleKind::Up, delta);
  return v;
}
// Fibers switch only at barriers and warp collectives, so a plain compare-and-swap is atomic here.
inline int atomic_cas(int* p, int compare, int value) {
  const int old = *p;
  if (old == compare) *p = value;
  return old;
}
// IEEE single-precision operations, each rounded (the tests' host code is compiled without FMA contraction).
inline float fadd_rn(float a, float b) { return a + b; }
inline float fsub_rn(float a, float b) { return a - b; }
inline float fmul_rn(float a, float b) { return a * b; }
inline float fdiv_rn(float a, float b) { return a / b; }
inline float fsqrt_rn(float a) { return std::sqrt(a); }
template <typename T>
T ldg(const T* p) {
  return *p;
}

// A pointer argument must be device memory (one byte of it, at least: kernels take base pointers).
template <typename T>
void check_argument(const T& value) {
  if constexpr (std::is_pointer_v<T>) check_device_range(value, 0, "a kernel's pointer argument");
}

// The launch is checked now, as the GPU checks it; the kernel runs when the stream gets to it, with copies of
// its arguments (a queued launch outlives the caller's variables, as on the GPU).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, Args&&... args) {
  check_launch(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes);
  (check_argument(args), ...);
  submit(
      stream,
      [kernel, grid, block, smem_bytes, ... a = std::decay_t<Args>(std::forward<Args>(args))]() mutable {
        launch_emulated(reinterpret_cast<const void*>(kernel), grid, block, smem_bytes, [&] { kernel(a...); });
      },
      "kernel launch");
}

inline uint32_t load_u32(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int B>
void copy_aligned(void* dst, const void* src) {
  static_assert(B == 2 || B == 4 || B == 8 || B == 16, "one access moves 2, 4, 8 or 16 bytes");
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % B != 0) misaligned_access(dst, src, B);
  if constexpr (B == 16) count_access16();
  std::memcpy(dst, src, B);
}
inline void copy16(void* dst, const void* src) { copy_aligned<16>(dst, src); }
inline uint16_t bf16_bits(float v) { return bf16_bits_from_float(v); }
inline uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
}

template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute, int bytes) {
  set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
  return cudaSuccess;
}

}  // namespace shardtrain::simt

namespace shardtrain {
using simt::cudaFuncSetAttribute;
}  // namespace shardtrain

#else
#error "kernels/simt.cuh is device code: compile it with nvcc, or on the host with SHARDTRAIN_SIMT_EMULATOR"
#endif

namespace shardtrain::simt {
ST_DEV int imin(int a, int b) { return a < b ? a : b; }
}  // namespace shardtrain::simt
