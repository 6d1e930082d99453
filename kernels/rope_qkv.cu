// RoPE of q and k and the split of v, in one launch between the packed q/k/v projection and the three tensors
// attention takes (rope_qkv.cuh). One thread per (token, vector of K pairs): it forms the K angles once (the
// accurate sincosf, as rope.cu) and applies them to its K pairs in every q and k head, and copies the same
// columns of every v head; 16-byte accesses (8 bf16 or 4 fp32 pairs) where half a head is a whole number of
// vectors and every array is 16-byte aligned, one pair per thread otherwise.
#include "kernels/device_common.cuh"
#include "kernels/rope_qkv.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::load_floats;
using detail::store_floats;

constexpr int kThreads = 256;

struct InvFreq {  // by value: 512 bytes of kernel parameters, read from the constant bank
  float v[kRopeMaxPairs];
};

// Columns [i, i + K) and [half + i, half + i + K) of one head, rotated from `in` into `out`.
template <int K, typename T>
ST_DEV void rotate(const T* in, T* out, int64_t half, const float (&c)[K], const float (&s)[K]) {
  float x1[K], x2[K], y1[K], y2[K];
  load_floats(in, x1);
  load_floats(in + half, x2);
  for (int k = 0; k < K; ++k) {
    y1[k] = x1[k] * c[k] - x2[k] * s[k];
    y2[k] = x2[k] * c[k] + x1[k] * s[k];
  }
  store_floats(out, y1);
  store_floats(out + half, y2);
}

template <int K, typename T>
ST_DEV void copy_pairs(const T* in, T* out, int64_t half) {
  float a[K], b[K];
  load_floats(in, a);
  load_floats(in + half, b);
  store_floats(out, a);
  store_floats(out + half, b);
}

// forward: packed -> q, k, v; else q, k, v -> packed (sign -1: the transposed rotation). The four arrays never
// overlap (the op checks), so the loads of the next head need not wait for this head's stores.
template <typename T, int K>
ST_GLOBAL void rope_qkv_kernel(T* __restrict__ packed, T* __restrict__ q, T* __restrict__ k, T* __restrict__ v,
                               const int32_t* __restrict__ positions, int64_t tokens, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, InvFreq freq, float sign, bool forward) {
  const int64_t half = head_dim / 2, per_token = half / K, width = (heads + 2 * kv_heads) * head_dim;
  const int64_t total = tokens * per_token;
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t idx = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); idx < total; idx += stride) {
    const int64_t t = idx / per_token, i = (idx - t * per_token) * K;
    const float p = static_cast<float>(positions[t]);
    float c[K], s[K];
    for (int j = 0; j < K; ++j) {
      sincosf(p * freq.v[i + j], &s[j], &c[j]);
      s[j] *= sign;
    }
    T* row = packed + t * width + i;
    T* qt = q + t * heads * head_dim + i;
    T* kt = k + t * kv_heads * head_dim + i;
    T* vt = v + t * kv_heads * head_dim + i;
    for (int64_t h = 0; h < heads; ++h) {
      if (forward) rotate<K>(row + h * head_dim, qt + h * head_dim, half, c, s);
      else rotate<K>(qt + h * head_dim, row + h * head_dim, half, c, s);
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      T* packed_k = row + (heads + h) * head_dim;
      if (forward) rotate<K>(packed_k, kt + h * head_dim, half, c, s);
      else rotate<K>(kt + h * head_dim, packed_k, half, c, s);
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      T* packed_v = row + (heads + kv_heads + h) * head_dim;
      if (forward) copy_pairs<K>(packed_v, vt + h * head_dim, half);
      else copy_pairs<K>(vt + h * head_dim, packed_v, half);
    }
  }
}

}  // namespace

void rope_qkv(DType dtype, void* packed, void* q, void* k, void* v, const int32_t* positions, int64_t tokens, int64_t heads,
              int64_t kv_heads, int64_t head_dim, const float* inv_freq, RopeDirection direction, StreamRef stream) {
  if (head_dim % 2 != 0) throw InternalError("rope_qkv: head_dim " + std::to_string(head_dim) + " is odd");
  if (head_dim / 2 > kRopeMaxPairs)
    throw InternalError("rope_qkv: head_dim " + std::to_string(head_dim) + " above " + std::to_string(2 * kRopeMaxPairs));
  if (tokens <= 0 || heads <= 0 || head_dim <= 0) return;
  const bool forward = direction == RopeDirection::Forward;
  InvFreq freq{};
  for (int64_t i = 0; i < head_dim / 2; ++i) freq.v[i] = inv_freq[i];
  detail::dispatch_float(dtype, "rope_qkv", [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto run = [&](auto width) {
      constexpr int K = decltype(width)::value;
      const int64_t total = tokens * (head_dim / 2 / K);
      simt::launch(rope_qkv_kernel<T, K>, detail::grid_for(total, kThreads), kThreads, 0, detail::cuda_stream(stream),
                   static_cast<T*>(packed), static_cast<T*>(q), static_cast<T*>(k), static_cast<T*>(v), positions, tokens,
                   heads, kv_heads, head_dim, freq, forward ? 1.0f : -1.0f, forward);
      ST_CHECK_KERNEL("rope_qkv_kernel");
    };
    // Every access starts at a multiple of half a head's K-vectors from an array start: whole vectors per half.
    constexpr int kWide = detail::vector_width<T>();
    if ((head_dim / 2) % kWide == 0 && detail::aligned16(packed, q, k, v)) {
      run(std::integral_constant<int, kWide>{});
    } else {
      run(std::integral_constant<int, 1>{});
    }
  });
}

}  // namespace shardtrain::kernels
