// Attention backward, FlashAttention-2 style and deterministic (no atomics), in three kernels:
//   1. dvec[b, h, i] = dout_i . out_i                       (B, H, S) fp32, in the caller's workspace (one
//      thread per row, 16-byte loads)
//   2. one CTA per (64-key tile, kv head, batch): over every query head of the group and every 32-query step
//      from the tile's first key to S, recompute p = exp(s - lse), ds = p (dp - dvec) with dp = dout v^T, and
//      accumulate dv += p^T dout, dk += ds^T (q * scale); dk, dv are written once, summed over the group.
//   3. one CTA per (64-query tile, head, batch): over 32-key steps up to the causal limit, recompute p and ds
//      and accumulate dq += ds k; dq = scale * that.
// Probabilities are thus recomputed twice, the price of owning every output row in exactly one CTA.
//
// Thread layout as in attention_fwd.cu: 256 threads as 16 x 16, (ty, tx) owns tile rows ty + 16 i (i < 4)
// and step columns tx + 16 j (j < 2), and head-dim columns tx + 16 j (j < DMAX/16) of its accumulators.
// fp32 shared tiles padded by one column; Dh zero-padded to DMAX in {16, 32, 64, 96, 128}.
//
// Kernels 2 and 3 here are the fp32-FMA versions (f32, or bf16 with SHARDTRAIN_ATTENTION_KERNEL=fma); bf16
// runs kernel 1 here and the tensor-core kernels of attention_mma.cu for 2 and 3. Faster later: merging
// kernels 2 and 3 with an atomic (or split-and-reduce) dq, as FlashAttention-2 does, saves the second
// recomputation of p.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_tiles.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::kernels {
namespace {

// kRows rows a CTA owns (keys in kernel 2, queries in kernel 3), kCols columns per step (queries in kernel 2,
// keys in kernel 3); kPLd is the leading dim of the (kRows, kCols) p / ds tiles.
using namespace attention_tiles;
using detail::from_f32;
using detail::to_f32;

template <typename T>
struct BackwardArgs {
  const T* q;          // (B, S, H, Dh)
  const T* k;          // (B, S, Hkv, Dh)
  const T* v;          // (B, S, Hkv, Dh)
  const T* out;        // (B, S, H, Dh)
  const float* lse;    // (B, H, S)
  const T* dout;       // (B, S, H, Dh)
  const int32_t* seg;  // (B, S) or nullptr
  float* dvec;         // (B, H, S) workspace
  T* dq;               // (B, S, H, Dh)
  T* dk;               // (B, S, Hkv, Dh)
  T* dv;               // (B, S, Hkv, Dh)
  int batch, seq, heads, kv_heads, head_dim, group;
  float scale;
};

// Kernel 1: one thread per (b, i, h) row of out, K elements per load (16 bytes when head_dim and the two
// pointers allow; a warp then reads 32 consecutive rows, whole cache lines).
constexpr int kDotThreads = 256;

template <int K, typename T>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kDotThreads) attention_backward_dot_kernel(BackwardArgs<T> a) {
  const int64_t rows = int64_t(a.batch) * a.seq * a.heads;
  const int64_t stride = int64_t(simt::grid_x()) * kDotThreads;
  for (int64_t row = int64_t(simt::block_x()) * kDotThreads + simt::thread_x(); row < rows; row += stride) {
    const int h = int(row % a.heads);
    const int64_t token = row / a.heads;  // b * S + i
    const int i = int(token % a.seq);
    const int b = int(token / a.seq);
    const T* o = a.out + row * a.head_dim;
    const T* dout = a.dout + row * a.head_dim;
    float acc = 0.f;
    for (int d = 0; d < a.head_dim; d += K) {
      float x[K], y[K];
      detail::load_floats(dout + d, x);
      detail::load_floats(o + d, y);
      for (int k = 0; k < K; ++k) acc = fmaf(x[k], y[k], acc);
    }
    const int64_t at = (int64_t(b) * a.heads + h) * a.seq + i;
    const bool dead = a.lse[at] == -INFINITY || (a.seg && a.seg[token] < 0);
    a.dvec[at] = dead ? 0.f : acc;
  }
}

template <int DMAX>
constexpr size_t dkdv_smem_bytes() {
  return sizeof(float) *
             (2 * size_t(kRows) * (DMAX + 1) + 2 * size_t(kCols) * (DMAX + 1) + 2 * size_t(kRows) * kPLd + 2 * kCols) +
         sizeof(int) * (kRows + kCols);
}

// Kernel 2: dk, dv for 64 keys of one kv head.
template <typename T, int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads) attention_backward_dkdv_kernel(BackwardArgs<T> a) {
  constexpr int kLd = DMAX + 1, RI = kRowsPerThread, CJ = kColsPerThread, DJ = DMAX / 16;
  float* const smem = reinterpret_cast<float*>(simt::dynamic_smem());
  float* k_s = smem;                                        // (kRows, kLd) keys
  float* v_s = k_s + kRows * kLd;                           // (kRows, kLd)
  float* q_s = v_s + kRows * kLd;                           // (kCols, kLd) q * scale of this step's queries
  float* do_s = q_s + kCols * kLd;                          // (kCols, kLd) dout
  float* pt_s = do_s + kCols * kLd;                         // (kRows, kPLd) p^T: key x query
  float* dst_s = pt_s + kRows * kPLd;                       // (kRows, kPLd) ds^T
  float* col_lse = dst_s + kRows * kPLd;                    // (kCols)
  float* col_dvec = col_lse + kCols;                        // (kCols)
  int* row_seg = reinterpret_cast<int*>(col_dvec + kCols);  // (kRows) keys
  int* col_seg = row_seg + kRows;                           // (kCols) queries

  const int tx = simt::thread_x() % 16, ty = simt::thread_x() / 16;
  const int k0 = int(simt::block_x()) * kRows;  // the first tiles see the most queries and start first
  const int g = simt::block_y(), b = simt::block_z();
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const int64_t kv_off = int64_t(b) * a.seq * kv_stride + int64_t(g) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;

  attention_rows::load_segments<kThreads>(row_seg, seg, k0, kRows, a.seq);
  simt::sync();
  load_tile<DMAX, kRows>(k_s, a.k + kv_off, kv_stride, k0, row_seg, a.head_dim, 1.f);  // read after a barrier
  load_tile<DMAX, kRows>(v_s, a.v + kv_off, kv_stride, k0, row_seg, a.head_dim, 1.f);

  float dk[RI][DJ], dv[RI][DJ];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int d = 0; d < DJ; ++d) dk[i][d] = dv[i][d] = 0.f;

  for (int h = g * a.group; h < (g + 1) * a.group; ++h) {
    const int64_t q_off = int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
    const float* lse = a.lse + (int64_t(b) * a.heads + h) * a.seq;
    const float* dvec = a.dvec + (int64_t(b) * a.heads + h) * a.seq;
    for (int c0 = k0; c0 < a.seq; c0 += kCols) {  // causal: queries before the tile's first key see none of it
      attention_rows::load_query_stats<kThreads>(col_seg, col_lse, col_dvec, seg, lse, dvec, c0, kCols, a.seq, 1.f);
      simt::sync();
      unsigned vis = 0;  // bit i * CJ + j: query tx + 16 j sees key ty + 16 i
#pragma unroll
      for (int i = 0; i < RI; ++i) {
        const int r = ty + 16 * i, rs = row_seg[r];
#pragma unroll
        for (int j = 0; j < CJ; ++j) {
          const int c = tx + 16 * j, cs = col_seg[c];
          if (cs >= 0 && cs == rs && k0 + r <= c0 + c) vis |= 1u << (i * CJ + j);
        }
      }
      if (!simt::sync_or(vis != 0)) continue;  // also the barrier before col_* are rewritten

      load_tile<DMAX, kCols>(q_s, a.q + q_off, q_stride, c0, col_seg, a.head_dim, a.scale);
      load_tile<DMAX, kCols>(do_s, a.dout + q_off, q_stride, c0, col_seg, a.head_dim, 1.f);
      simt::sync();

      // s^T = k (q * scale)^T and dp^T = v dout^T for this thread's (RI x CJ) entries.
      float s[RI][CJ], dp[RI][CJ];
      dual_tile_products<DMAX>(k_s, v_s, q_s, do_s, tx, ty, s, dp);
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < CJ; ++j) {
          const int c = tx + 16 * j;
          float p = 0.f, ds = 0.f;
          if ((vis >> (i * CJ + j)) & 1u) {
            p = expf(s[i][j] - col_lse[c]);
            ds = p * (dp[i][j] - col_dvec[c]);
          }
          pt_s[(ty + 16 * i) * kPLd + c] = p;
          dst_s[(ty + 16 * i) * kPLd + c] = ds;
        }
      simt::sync();

      // dv += p^T dout, dk += ds^T (q * scale)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float pa[RI], sa[RI], db[DJ], qb[DJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) {
          pa[i] = pt_s[(ty + 16 * i) * kPLd + c];
          sa[i] = dst_s[(ty + 16 * i) * kPLd + c];
        }
#pragma unroll
        for (int d = 0; d < DJ; ++d) {
          db[d] = do_s[c * kLd + tx + 16 * d];
          qb[d] = q_s[c * kLd + tx + 16 * d];
        }
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
          for (int d = 0; d < DJ; ++d) {
            dv[i][d] = fmaf(pa[i], db[d], dv[i][d]);
            dk[i][d] = fmaf(sa[i], qb[d], dk[i][d]);
          }
      }
      simt::sync();  // step boundary (redundant with the next step's first barrier; kept for clarity)
    }
  }

#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int r = k0 + ty + 16 * i;
    if (r >= a.seq) continue;
    T* dk_row = a.dk + int64_t(r) * kv_stride + kv_off;
    T* dv_row = a.dv + int64_t(r) * kv_stride + kv_off;
#pragma unroll
    for (int d = 0; d < DJ; ++d) {
      const int c = tx + 16 * d;
      if (c < a.head_dim) {
        dk_row[c] = from_f32<T>(dk[i][d]);
        dv_row[c] = from_f32<T>(dv[i][d]);
      }
    }
  }
}

template <int DMAX>
constexpr size_t dq_smem_bytes() {
  return sizeof(float) *
             (2 * size_t(kRows) * (DMAX + 1) + 2 * size_t(kCols) * (DMAX + 1) + size_t(kRows) * kPLd + 2 * kRows) +
         sizeof(int) * (kRows + kCols);
}

// Kernel 3: dq for 64 queries of one head.
template <typename T, int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads) attention_backward_dq_kernel(BackwardArgs<T> a) {
  constexpr int kLd = DMAX + 1, RI = kRowsPerThread, CJ = kColsPerThread, DJ = DMAX / 16;
  float* const smem = reinterpret_cast<float*>(simt::dynamic_smem());
  float* q_s = smem;                                        // (kRows, kLd) q * scale
  float* do_s = q_s + kRows * kLd;                          // (kRows, kLd) dout
  float* k_s = do_s + kRows * kLd;                          // (kCols, kLd) this step's keys
  float* v_s = k_s + kCols * kLd;                           // (kCols, kLd)
  float* ds_s = v_s + kCols * kLd;                          // (kRows, kPLd) ds: query x key
  float* row_lse = ds_s + kRows * kPLd;                     // (kRows)
  float* row_dvec = row_lse + kRows;                        // (kRows)
  int* row_seg = reinterpret_cast<int*>(row_dvec + kRows);  // (kRows) queries
  int* col_seg = row_seg + kRows;                           // (kCols) keys

  const int tx = simt::thread_x() % 16, ty = simt::thread_x() / 16;
  const int q0 = int(simt::grid_x() - 1 - simt::block_x()) * kRows;  // the last tiles see the most keys: start them first
  const int h = simt::block_y(), b = simt::block_z(), g = h / a.group;
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const int64_t q_off = int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
  const int64_t kv_off = int64_t(b) * a.seq * kv_stride + int64_t(g) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;
  const int64_t stats_off = (int64_t(b) * a.heads + h) * a.seq;

  attention_rows::load_query_stats<kThreads>(row_seg, row_lse, row_dvec, seg, a.lse + stats_off, a.dvec + stats_off, q0,
                                             kRows, a.seq, 1.f);
  simt::sync();
  load_tile<DMAX, kRows>(q_s, a.q + q_off, q_stride, q0, row_seg, a.head_dim, a.scale);  // read after a barrier
  load_tile<DMAX, kRows>(do_s, a.dout + q_off, q_stride, q0, row_seg, a.head_dim, 1.f);

  float dq[RI][DJ];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int d = 0; d < DJ; ++d) dq[i][d] = 0.f;

  const int kv_end = simt::imin(a.seq, q0 + kRows);
  for (int k0 = 0; k0 < kv_end; k0 += kCols) {
    attention_rows::load_segments<kThreads>(col_seg, seg, k0, kCols, a.seq);
    simt::sync();
    unsigned vis = 0;  // bit i * CJ + j: query ty + 16 i sees key tx + 16 j
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const int r = ty + 16 * i, rs = row_seg[r];
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        const int c = tx + 16 * j;
        if (rs >= 0 && rs == col_seg[c] && k0 + c <= q0 + r) vis |= 1u << (i * CJ + j);
      }
    }
    if (!simt::sync_or(vis != 0)) continue;

    load_tile<DMAX, kCols>(k_s, a.k + kv_off, kv_stride, k0, col_seg, a.head_dim, 1.f);
    load_tile<DMAX, kCols>(v_s, a.v + kv_off, kv_stride, k0, col_seg, a.head_dim, 1.f);
    simt::sync();

    // s = (q * scale) k^T and dp = dout v^T for this thread's (RI x CJ) entries.
    float s[RI][CJ], dp[RI][CJ];
    dual_tile_products<DMAX>(q_s, do_s, k_s, v_s, tx, ty, s, dp);
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const int r = ty + 16 * i;
#pragma unroll
      for (int j = 0; j < CJ; ++j) {
        float ds = 0.f;
        if ((vis >> (i * CJ + j)) & 1u) ds = expf(s[i][j] - row_lse[r]) * (dp[i][j] - row_dvec[r]);
        ds_s[r * kPLd + tx + 16 * j] = ds;
      }
    }
    simt::sync();

    accumulate_tile<DMAX>(ds_s, k_s, tx, ty, dq);  // dq += ds k
    simt::sync();  // step boundary (redundant with the next step's first barrier; kept for clarity)
  }

#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int r = ty + 16 * i;
    if (q0 + r >= a.seq) continue;
    const float mul = row_seg[r] >= 0 ? a.scale : 0.f;  // padding rows: exactly zero
    T* dq_row = a.dq + int64_t(q0 + r) * q_stride + q_off;
#pragma unroll
    for (int d = 0; d < DJ; ++d) {
      const int c = tx + 16 * d;
      if (c < a.head_dim) dq_row[c] = from_f32<T>(dq[i][d] * mul);
    }
  }
}

template <typename T>
void launch_dot(const BackwardArgs<T>& a, cudaStream_t stream) {
  const int64_t rows = int64_t(a.batch) * a.seq * a.heads;
  const unsigned blocks = detail::grid_for(rows, kDotThreads);
  detail::with_row_width<T, T>(
      a.head_dim,
      [&](auto width) {
        simt::launch(attention_backward_dot_kernel<decltype(width)::value, T>, blocks, kDotThreads, 0, stream, a);
        ST_CHECK_KERNEL("attention_backward_dot_kernel");
      },
      a.out, a.dout);
}

template <typename T, int DMAX>
void launch_backward(const BackwardArgs<T>& a, cudaStream_t stream) {
  launch_dot(a, stream);
  const unsigned tiles = unsigned((a.seq + kRows - 1) / kRows);
  constexpr size_t dkdv_smem = dkdv_smem_bytes<DMAX>();
  ST_CHECK_CUDA(cudaFuncSetAttribute(attention_backward_dkdv_kernel<T, DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(dkdv_smem)));
  simt::launch(attention_backward_dkdv_kernel<T, DMAX>, dim3(tiles, unsigned(a.kv_heads), unsigned(a.batch)), kThreads,
               dkdv_smem, stream, a);
  ST_CHECK_KERNEL("attention_backward_dkdv_kernel");

  constexpr size_t dq_smem = dq_smem_bytes<DMAX>();
  ST_CHECK_CUDA(cudaFuncSetAttribute(attention_backward_dq_kernel<T, DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(dq_smem)));
  simt::launch(attention_backward_dq_kernel<T, DMAX>, dim3(tiles, unsigned(a.heads), unsigned(a.batch)), kThreads, dq_smem,
               stream, a);
  ST_CHECK_KERNEL("attention_backward_dq_kernel");
}

template <typename T>
void backward_for_dtype(const AttentionDims& d, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, const void* dout, const int32_t* segments, float scale, void* dq, void* dk,
                        void* dv, void* workspace, cudaStream_t stream) {
  const BackwardArgs<T> a{static_cast<const T*>(q),
                          static_cast<const T*>(k),
                          static_cast<const T*>(v),
                          static_cast<const T*>(out),
                          lse,
                          static_cast<const T*>(dout),
                          segments,
                          static_cast<float*>(workspace),
                          static_cast<T*>(dq),
                          static_cast<T*>(dk),
                          static_cast<T*>(dv),
                          int(d.batch),
                          int(d.seq),
                          int(d.heads),
                          int(d.kv_heads),
                          int(d.head_dim),
                          int(d.heads / d.kv_heads),
                          scale};
  if (std::is_same_v<T, detail::bf16_t> && attention_uses_mma(DType::BF16)) {  // the dot here, the rest on tensor cores
    launch_dot(a, stream);
    attention_backward_mma(d, q, k, v, lse, dout, segments, scale, a.dvec, dq, dk, dv, StreamRef{stream});
    return;
  }
  if (d.head_dim <= 16) launch_backward<T, 16>(a, stream);
  else if (d.head_dim <= 32) launch_backward<T, 32>(a, stream);
  else if (d.head_dim <= 64) launch_backward<T, 64>(a, stream);
  else if (d.head_dim <= 96) launch_backward<T, 96>(a, stream);
  else launch_backward<T, 128>(a, stream);
}

}  // namespace

size_t attention_backward_workspace_bytes(const AttentionDims& d) {
  return sizeof(float) * static_cast<size_t>(d.batch * d.heads * d.seq);
}

void attention_backward(DType dtype, const AttentionDims& d, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, const void* dout, const int32_t* segments, float scale, void* dq, void* dk,
                        void* dv, void* workspace, StreamRef stream) {
  check_dims(d, "attention_backward");
  if (!workspace)
    throw InternalError("attention_backward: no workspace (attention_backward_workspace_bytes = " +
                        std::to_string(attention_backward_workspace_bytes(d)) + ")");
  detail::dispatch_float(dtype, "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_for_dtype<T>(d, q, k, v, out, lse, dout, segments, scale, dq, dk, dv, workspace, detail::cuda_stream(stream));
  });
}

}  // namespace shardtrain::kernels
