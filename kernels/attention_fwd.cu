// Attention forward, flash style: one CTA per (64-query tile, head, batch) streams 32-key tiles of its
// key/value head through shared memory and keeps a running softmax (max m, sum l) per query row, so the
// (S, S) scores never leave the CTA. Writes out (B, S, H, Dh) and lse = m + log(l) (B, H, S).
//
// Layout of a CTA: 256 threads as 16 x 16; thread (ty, tx) owns query rows ty + 16 i (i < 4) and, per key
// step, key columns tx + 16 j (j < 2) of the score tile and head-dim columns tx + 16 j (j < DMAX/16) of the
// output. A row's 16 owners are 16 consecutive lanes of one warp, so row max/sum are half-warp shuffles.
// Plain fp32 FMAs on fp32 shared tiles (padded by one column against bank conflicts); Dh is zero-padded up
// to DMAX (16, 32, 64, 96 or 128).
//
// These run f32 (and bf16 when SHARDTRAIN_ATTENTION_KERNEL=fma); bf16 goes to the tensor-core kernels of
// attention_mma.cu by default.
#include <cmath>

#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using namespace attention_tiles;  // kRows query rows per CTA, kCols keys per step
using detail::from_f32;

template <typename T>
struct ForwardArgs {
  const T* q;          // (B, S, H, Dh)
  const T* k;          // (B, S, Hkv, Dh)
  const T* v;          // (B, S, Hkv, Dh)
  const int32_t* seg;  // (B, S) or nullptr
  T* out;              // (B, S, H, Dh)
  float* lse;          // (B, H, S)
  int seq, heads, kv_heads, head_dim, group;
  float scale;
};

// The 16 lanes that own one row (xor offsets below 16 stay inside a half warp).
ST_DEV float half_warp_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x = fmaxf(x, simt::shfl_xor(x, off));
  return x;
}
ST_DEV float half_warp_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) x += simt::shfl_xor(x, off);
  return x;
}

template <int DMAX>
constexpr size_t forward_smem_bytes() {
  return sizeof(float) * (size_t(kRows) * (DMAX + 1) + 2 * size_t(kCols) * (DMAX + 1) + size_t(kRows) * kPLd) +
         sizeof(int) * (kRows + kCols);
}

template <typename T, int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads) attention_forward_kernel(ForwardArgs<T> a) {
  constexpr int kLd = DMAX + 1, kDimsPerThread = DMAX / 16;
  constexpr int RI = kRowsPerThread, CJ = kColsPerThread, DJ = kDimsPerThread;
  float* const smem = reinterpret_cast<float*>(simt::dynamic_smem());
  float* q_s = smem;                                          // (kRows, kLd) q * scale
  float* k_s = q_s + kRows * kLd;                             // (kCols, kLd)
  float* v_s = k_s + kCols * kLd;                             // (kCols, kLd)
  float* p_s = v_s + kCols * kLd;                             // (kRows, kPLd) this step's probabilities
  int* row_seg = reinterpret_cast<int*>(p_s + kRows * kPLd);  // (kRows)
  int* col_seg = row_seg + kRows;                             // (kCols)

  const int tx = simt::thread_x() % 16, ty = simt::thread_x() / 16;
  const int q0 = int(simt::grid_x() - 1 - simt::block_x()) * kRows;  // the last tiles see the most keys: start them first
  const int h = simt::block_y(), b = simt::block_z(), g = h / a.group;
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const T* q = a.q + int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
  const T* k = a.k + int64_t(b) * a.seq * kv_stride + int64_t(g) * a.head_dim;
  const T* v = a.v + int64_t(b) * a.seq * kv_stride + int64_t(g) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;

  attention_rows::load_segments<kThreads>(row_seg, seg, q0, kRows, a.seq);
  simt::sync();
  load_tile<DMAX, kRows>(q_s, q, q_stride, q0, row_seg, a.head_dim, a.scale);  // read after the loop's barrier

  float o[RI][DJ], m[RI], l[RI];
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int d = 0; d < DJ; ++d) o[i][d] = 0.f;
  }

  const int kv_end = simt::imin(a.seq, q0 + kRows);  // causal: no key past the tile's last query
  for (int k0 = 0; k0 < kv_end; k0 += kCols) {
    attention_rows::load_segments<kThreads>(col_seg, seg, k0, kCols, a.seq);
    simt::sync();      // col_seg (and, the first time, q_s) visible
    unsigned vis = 0;  // bit i * CJ + j: query row ty + 16 i may see key tx + 16 j
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const int r = ty + 16 * i, rs = row_seg[r];
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const int c = tx + 16 * j;
        if (rs >= 0 && rs == col_seg[c] && k0 + c <= q0 + r) vis |= 1u << (i * CJ + j);
      }
    }
    // Skip a step no pair of which is visible (other documents, padding); also a barrier, after which
    // col_seg may be rewritten.
    if (!simt::sync_or(vis != 0)) continue;

    load_tile<DMAX, kCols>(k_s, k, kv_stride, k0, col_seg, a.head_dim, 1.f);
    load_tile<DMAX, kCols>(v_s, v, kv_stride, k0, col_seg, a.head_dim, 1.f);
    simt::sync();

    // s = (q * scale) k^T for this thread's (RI x CJ) scores.
    float s[RI][CJ];
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < CJ; ++j) s[i][j] = 0.f;
#pragma unroll 8
    for (int c = 0; c < DMAX; ++c) {
      float qa[RI], kb[CJ];
#pragma unroll
      for (int i = 0; i < RI; ++i) qa[i] = q_s[(ty + 16 * i) * kLd + c];
#pragma unroll
      for (int j = 0; j < CJ; ++j) kb[j] = k_s[(tx + 16 * j) * kLd + c];
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < CJ; ++j) s[i][j] = fmaf(qa[i], kb[j], s[i][j]);
    }

    // Online softmax. A row with nothing visible yet keeps m = -inf; m_use = 0 then keeps every exp at
    // exp(-inf) = 0 instead of exp(-inf - -inf) = NaN.
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        if (!((vis >> (i * CJ + j)) & 1u)) s[i][j] = -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = half_warp_max(mx);
      const float m_new = fmaxf(m[i], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = expf(m[i] - m_use);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int d = 0; d < DJ; ++d) o[i][d] *= alpha;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const float p = expf(s[i][j] - m_use);
        l[i] += p;  // this thread's columns only; summed over the half warp at the end
        p_s[(ty + 16 * i) * kPLd + tx + 16 * j] = p;
      }
    }
    simt::sync();

    accumulate_tile<DMAX>(p_s, v_s, tx, ty, o);  // o += p v
    // The next step rewrites k_s, v_s, p_s only after its first barrier, so this one is not strictly
    // needed; it keeps each step self-contained (one barrier per step, cheap beside the tile math).
    simt::sync();
  }

#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const float l_row = half_warp_sum(l[i]);  // every lane of the warp takes part
    const int r = q0 + ty + 16 * i;
    if (r >= a.seq) continue;
    const bool live = l_row > 0.f;  // false exactly when no key was visible (padding)
    const float inv_l = live ? 1.f / l_row : 0.f;
    T* o_row = a.out + (int64_t(b) * a.seq + r) * q_stride + int64_t(h) * a.head_dim;
#pragma unroll
    for (int d = 0; d < DJ; ++d) {
      const int c = tx + 16 * d;
      if (c < a.head_dim) o_row[c] = from_f32<T>(o[i][d] * inv_l);
    }
    if (tx == 0) a.lse[(int64_t(b) * a.heads + h) * a.seq + r] = live ? m[i] + logf(l_row) : -INFINITY;
  }
}

template <typename T, int DMAX>
void launch_forward(const AttentionDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                    float scale, void* out, float* lse, cudaStream_t stream) {
  const ForwardArgs<T> a{static_cast<const T*>(q),
                         static_cast<const T*>(k),
                         static_cast<const T*>(v),
                         segments,
                         static_cast<T*>(out),
                         lse,
                         int(d.seq),
                         int(d.heads),
                         int(d.kv_heads),
                         int(d.head_dim),
                         int(d.heads / d.kv_heads),
                         scale};
  constexpr size_t smem = forward_smem_bytes<DMAX>();
  ST_CHECK_CUDA(
      cudaFuncSetAttribute(attention_forward_kernel<T, DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((d.seq + kRows - 1) / kRows), unsigned(d.heads), unsigned(d.batch));
  simt::launch(attention_forward_kernel<T, DMAX>, grid, kThreads, smem, stream, a);
  ST_CHECK_KERNEL("attention_forward_kernel");
}

template <typename T>
void forward_for_dtype(const AttentionDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                       float scale, void* out, float* lse, cudaStream_t stream) {
  // The smallest padded head dim that holds Dh: the exact sizes 16/32/64/96/128 waste nothing.
  if (d.head_dim <= 16) launch_forward<T, 16>(d, q, k, v, segments, scale, out, lse, stream);
  else if (d.head_dim <= 32) launch_forward<T, 32>(d, q, k, v, segments, scale, out, lse, stream);
  else if (d.head_dim <= 64) launch_forward<T, 64>(d, q, k, v, segments, scale, out, lse, stream);
  else if (d.head_dim <= 96) launch_forward<T, 96>(d, q, k, v, segments, scale, out, lse, stream);
  else launch_forward<T, 128>(d, q, k, v, segments, scale, out, lse, stream);
}

}  // namespace

void attention_forward(DType dtype, const AttentionDims& d, const void* q, const void* k, const void* v,
                       const int32_t* segments, float scale, void* out, float* lse, StreamRef stream) {
  check_dims(d, "attention_forward");
  if (attention_uses_mma(dtype)) {
    attention_forward_mma(d, q, k, v, segments, scale, out, lse, stream);
    return;
  }
  detail::dispatch_float(dtype, "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_for_dtype<T>(d, q, k, v, segments, scale, out, lse, detail::cuda_stream(stream));
  });
}

}  // namespace shardtrain::kernels
