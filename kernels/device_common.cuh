// Device-side helpers shared by the kernels in this folder; included only from .cu files (the .cuh
// launcher headers stay plain C++). Storage types are float and bf16_t (__nv_bfloat16 on the GPU,
// shardtrain::bf16 under the SIMT emulator), arithmetic is fp32, and bf16 stores round to nearest even, as
// the CPU's shardtrain::bf16 does. The SIMT primitives come from simt.cuh.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/data_error.cuh"
#include "kernels/simt.cuh"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::kernels::detail {

#if defined(__CUDACC__)
using bf16_t = __nv_bfloat16;
ST_DEV float to_f32(bf16_t v) { return __bfloat162float(v); }
#else
using bf16_t = ::shardtrain::bf16;
ST_DEV float to_f32(bf16_t v) { return static_cast<float>(v); }
#endif
ST_DEV float to_f32(float v) { return v; }

template <typename T>
ST_DEV T from_f32(float v);
template <>
ST_DEV float from_f32<float>(float v) {
  return v;
}
#if defined(__CUDACC__)
template <>
ST_DEV bf16_t from_f32<bf16_t>(float v) {
  return __float2bfloat16_rn(v);
}
#else
template <>
ST_DEV bf16_t from_f32<bf16_t>(float v) {
  return bf16_t(v);
}
#endif

// The value a store of v to T keeps, back in fp32 (what a later load would read).
template <typename T>
ST_DEV float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T the device storage type of a float dtype (f32 or bf16); anything else throws.
template <typename F>
void dispatch_float(DType t, const char* what, F&& f) {
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

// ---- Vector accesses. The memory-bound kernels move 16 bytes per load and store where their pointers allow:
// with one scalar bf16 per thread an SM keeps about 4 KB in flight per load (2048 threads x 2 bytes), where
// DRAM bandwidth needs tens of KB (bandwidth x latency, shared by the SMs); 16-byte accesses keep 8x more.

// K elements of T in one aligned access (K * sizeof(T) bytes, 2 to 16), converted to and from fp32.
template <int K, typename T>
ST_DEV void load_floats(const T* p, float (&out)[K]) {
  alignas(16) T raw[K];
  simt::copy_aligned<K* static_cast<int>(sizeof(T))>(raw, p);
  for (int k = 0; k < K; ++k) out[k] = to_f32(raw[k]);
}
template <int K, typename T>
ST_DEV void store_floats(T* p, const float (&in)[K]) {
  alignas(16) T raw[K];
  for (int k = 0; k < K; ++k) raw[k] = from_f32<T>(in[k]);
  simt::copy_aligned<K* static_cast<int>(sizeof(T))>(p, raw);
}

// Elements per vector access over arrays of these storage types: 16 bytes of the widest.
template <typename... T>
constexpr int vector_width() {
  size_t widest = 1;
  ((widest = sizeof(T) > widest ? sizeof(T) : widest), ...);
  return static_cast<int>(16 / widest);
}

template <int K>
struct Width {
  static constexpr int value = K;
};

// A grid-stride loop over [0, n) in vectors of K elements: body(i, Width<K>{}) for each whole vector at
// i = 0, K, 2K, ... (when `vec`: every array the body touches is 16-byte aligned), then body(i, Width<1>{})
// for each element left (all of them when !vec). The body reads Width's value as its element count.
template <int K, typename F>
ST_DEV void for_each_vector(int64_t n, bool vec, F&& body) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  const int64_t first = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x();
  const int64_t whole = vec ? n / K : 0;
  for (int64_t j = first; j < whole; j += stride) body(j * K, Width<K>{});
  for (int64_t i = whole * K + first; i < n; i += stride) body(i, Width<1>{});
}

// Host side: may a kernel use 16-byte accesses from each of these addresses? (Null, for an absent array: yes.)
template <typename... P>
bool aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// Host side, for kernels that walk rows of n elements: calls f(std::integral_constant<int, K>{}) with K =
// vector_width<A, B>() when n is a multiple of it and every array is 16-byte aligned (so every row start is),
// else K = 1.
template <typename A, typename B, typename F, typename... P>
void with_row_width(int64_t n, F&& f, const P*... arrays) {
  constexpr int kWide = vector_width<A, B>();
  if (n % kWide == 0 && aligned16(arrays...)) {
    f(std::integral_constant<int, kWide>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

// Threads for a for_each_vector loop: one per whole vector, or per element when !vec.
inline int64_t vector_items(int64_t n, int k, bool vec) { return vec ? (n + k - 1) / k : n; }

// Sum over the 32 lanes of a warp (butterfly: every lane gets the same value), float or double.
template <typename A>
ST_DEV A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += simt::shfl_xor(v, o);
  return v;
}

// Sum over a block of kThreads threads (a multiple of 32, at most 1024), returned to every thread.
// `shared` holds at least 32 values. The order is fixed, so results are reproducible. Every thread of
// the block must call it (it synchronizes).
template <int kThreads, typename A>
ST_DEV A block_sum(A v, A* shared) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
  constexpr int kWarps = kThreads / 32;
  const int lane = simt::thread_x() & 31, warp = simt::thread_x() >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  simt::sync();
  if (warp == 0) {
    A r = lane < kWarps ? shared[lane] : A(0);
    r = warp_sum(r);
    if (lane == 0) shared[0] = r;
  }
  simt::sync();
  const A r = shared[0];
  simt::sync();  // shared may be reused by the caller right away
  return r;
}

ST_DEV void record_data_error(DataErrorRecord* rec, DataErrorCode code, int32_t value, int64_t index, int64_t bound,
                              int64_t aux = 0) {
  if (rec == nullptr) return;
  if (simt::atomic_cas(reinterpret_cast<int*>(&rec->code), 0, static_cast<int>(code)) == 0) {
    rec->value = value;
    rec->index = index;
    rec->bound = bound;
    rec->aux = aux;
  }
}

}  // namespace shardtrain::kernels::detail
