// Tensor-core flash attention for bf16: the bodies of the forward kernel and of the backward's dk/dv and dq
// kernels, written against kernels/simt.cuh so the same source runs on the GPU (attention_mma.cu wraps each
// in a __global__) and under the SIMT emulator of the tests (tests/kernels/attention_mma_emulated_test.cpp).
// Semantics exactly as attention_fwd.cu / attention_bwd.cu (and Ops::attention_*): causal, grouped-query,
// document segments (-1 = padding: attends to nothing, is attended by nothing), lse = -inf for a row that sees
// nothing, whose out and dq are zero.
//
// A CTA is 4 warps; it owns kRows = 64 rows (queries; keys in the dk/dv kernel), 16 per warp, and steps over
// kCols = 64 columns at a time. Tiles are raw bf16 in shared memory, rows padded by 8 elements (16 bytes) so the
// fragment loads of a warp hit 32 different banks; Dh is zero-padded to DMAX (16, 32, 64, 96 or 128). Scores
// and gradients are mma.sync m16n8k16 (bf16 in, fp32 accumulate); the online softmax runs in registers on the
// accumulator fragments, in the log2 domain (exp2f of s * scale * log2 e); probabilities (and ds) are rounded to
// bf16 once, as the A operand of the next product, which takes them straight from the accumulator registers
// (the C layout of two adjacent n-tiles is the A layout of one k-step). Row max and row sum: the 4 lanes of a
// fragment row, two xor shuffles.
//
// Backward as FlashAttention-2, deterministic (every output row owned by one CTA, no atomics):
//   dk/dv kernel, per 64 keys of a kv head: over every query head of the group and 64-query steps from the
//     tile's first key, s^T = k q^T, dp^T = v dout^T, p^T = exp(s^T - lse), ds^T = p^T (dp^T - dvec);
//     dv += p^T dout, dk += ds^T q; dk scaled once at the end.
//   dq kernel, per 64 queries of a head: over key steps to the causal limit, s = q k^T, dp = dout v^T,
//     ds = p (dp - dvec); dq += ds k, scaled at the end.
// dvec (B, H, S) = rowsum(dout * out) comes from attention_bwd.cu's dot kernel.
//
// Faster later: ldmatrix(.trans) fragment loads, cp.async double-buffered K/V, wgmma on sm_90.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_rows.cuh"
#include "kernels/simt.cuh"

namespace shardtrain::kernels::attention_mma {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // rows a CTA owns
constexpr int kCols = 64;           // columns per step
constexpr int kColTiles = kCols / 8;
static_assert(kRows == 64 && kCols == 64, "the row loaders move 64 rows (kRows == kCols)");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// bf16 tensors as raw bits: the kernels only move them, convert at the mma and round at the stores.
struct Args {
  const uint16_t* q;     // (B, S, H, Dh)
  const uint16_t* k;     // (B, S, Hkv, Dh)
  const uint16_t* v;     // (B, S, Hkv, Dh)
  const uint16_t* dout;  // (B, S, H, Dh), backward
  const int32_t* seg;    // (B, S) or nullptr
  const float* dvec;     // (B, H, S), backward
  const float* lse;      // (B, H, S), backward
  float* lse_out;        // (B, H, S), forward
  uint16_t* out;         // (B, S, H, Dh), forward
  uint16_t* dq;          // (B, S, H, Dh)
  uint16_t* dk;          // (B, S, Hkv, Dh)
  uint16_t* dv;          // (B, S, Hkv, Dh)
  int seq, heads, kv_heads, head_dim, group;
  float scale;  // 1 / sqrt(Dh)
  bool vec16;   // Dh % 8 == 0 and every tensor 16-byte aligned: tiles load 16 bytes at a time
};

template <int DMAX> constexpr int tile_ld() { return DMAX + 8; }
template <int DMAX> constexpr size_t tile_bytes(int rows) { return size_t(rows) * tile_ld<DMAX>() * sizeof(uint16_t); }

template <int DMAX> constexpr size_t forward_smem_bytes() {
  return tile_bytes<DMAX>(kRows) + 2 * tile_bytes<DMAX>(kCols) + sizeof(int) * (kRows + kCols);
}
template <int DMAX> constexpr size_t dkdv_smem_bytes() {
  return 2 * tile_bytes<DMAX>(kRows) + 2 * tile_bytes<DMAX>(kCols) + sizeof(int) * (kRows + 3 * kCols);
}
template <int DMAX> constexpr size_t dq_smem_bytes() {
  return 2 * tile_bytes<DMAX>(kRows) + 2 * tile_bytes<DMAX>(kCols) + sizeof(int) * (3 * kRows + kCols);
}


// Host side: calls f.template operator()<DMAX>() with the smallest padded head dim that holds Dh.
template <typename F> void with_dmax(int64_t head_dim, F&& f) {
  if (head_dim <= 16) f.template operator()<16>();
  else if (head_dim <= 32) f.template operator()<32>();
  else if (head_dim <= 64) f.template operator()<64>();
  else if (head_dim <= 96) f.template operator()<96>();
  else f.template operator()<128>();
}

// Tokens [first, first + 64) of a token-major bf16 tensor (stride elements between tokens) into a
// (64, DMAX + 8) tile; zeros past head_dim and in rows with a negative segment (padding values, NaN or not,
// never reach the arithmetic).
template <int DMAX>
ST_DEV void load_rows(uint16_t* tile, const uint16_t* src, int64_t stride, int first, const int* row_seg,
                      int head_dim, bool vec16) {
  constexpr int kLd = tile_ld<DMAX>(), kChunks = DMAX / 8;
  for (int e = simt::thread_x(); e < 64 * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    uint16_t* dst = tile + r * kLd + c;
    const bool live = row_seg[r] >= 0;
    if (live && vec16 && c + 8 <= head_dim) {
      simt::copy16(dst, src + int64_t(first + r) * stride + c);
    } else {
      for (int i = 0; i < 8; ++i) dst[i] = live && c + i < head_dim ? src[int64_t(first + r) * stride + c + i] : 0;
    }
  }
}

// Fragments (layouts in simt.cuh). tile: row-major bf16 with leading dimension ld.
// A = tile[r0 .. r0 + 16)[c0 .. c0 + 16).
ST_DEV void load_a(uint32_t a[4], const uint16_t* tile, int ld, int r0, int c0, int g, int t) {
  const uint16_t* p = tile + (r0 + g) * ld + c0 + 2 * t;
  a[0] = simt::load_u32(p);
  a[1] = simt::load_u32(p + 8 * ld);
  a[2] = simt::load_u32(p + 8);
  a[3] = simt::load_u32(p + 8 * ld + 8);
}
// B[k][n] = tile[n0 + n][k0 + k]: the tile holds B transposed (k contiguous), as k holds the keys of q k^T.
ST_DEV void load_b_t(uint32_t b[2], const uint16_t* tile, int ld, int n0, int k0, int g, int t) {
  const uint16_t* p = tile + (n0 + g) * ld + k0 + 2 * t;
  b[0] = simt::load_u32(p);
  b[1] = simt::load_u32(p + 8);
}
// B[k][n] = tile[k0 + k][n0 + n]: the tile holds B as is (n contiguous), as v holds it for p v.
ST_DEV void load_b(uint32_t b[2], const uint16_t* tile, int ld, int k0, int n0, int g, int t) {
  const uint16_t* p = tile + (k0 + 2 * t) * ld + n0 + g;
  b[0] = uint32_t(p[0]) | (uint32_t(p[ld]) << 16);
  b[1] = uint32_t(p[8 * ld]) | (uint32_t(p[9 * ld]) << 16);
}
// The A fragment of k-step j of a (16 x n) product held as accumulators: n-tiles 2j and 2j + 1, rounded to bf16.
ST_DEV void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = simt::pack_bf16(c0[0], c0[1]);
  a[1] = simt::pack_bf16(c0[2], c0[3]);
  a[2] = simt::pack_bf16(c1[0], c1[1]);
  a[3] = simt::pack_bf16(c1[2], c1[3]);
}

// The sum (or max) over the 4 lanes that hold one fragment row.
ST_DEV float quad_sum(float x) {
  x += simt::shfl_xor(x, 1);
  return x + simt::shfl_xor(x, 2);
}
ST_DEV float quad_max(float x) {
  x = fmaxf(x, simt::shfl_xor(x, 1));
  return fmaxf(x, simt::shfl_xor(x, 2));
}

// Bit (ri * 8 + n) * 2 + e: may fragment row ri (local row row0 + g + 8 ri) see column n * 8 + 2t + e of this
// step? Row r sees column c when both are in the same (non-negative) segment and c's token is not after r's.
// row_first/col_first are the tokens of local row/column 0; the same for both directions of the backward.
ST_DEV uint32_t visibility(const int* row_seg, const int* col_seg, int row0, int g, int t, int row_first,
                           int col_first, bool rows_are_keys) {
  uint32_t vis = 0;
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri, rs = row_seg[r];
    if (rs < 0) continue;
    for (int n = 0; n < kColTiles; ++n)
      for (int e = 0; e < 2; ++e) {
        const int c = n * 8 + 2 * t + e;
        const bool causal = rows_are_keys ? row_first + r <= col_first + c : col_first + c <= row_first + r;
        if (col_seg[c] == rs && causal) vis |= 1u << ((ri * kColTiles + n) * 2 + e);
      }
  }
  return vis;
}
ST_DEV bool visible(uint32_t vis, int n, int i) { return (vis >> ((i / 2 * kColTiles + n) * 2 + i % 2)) & 1u; }

// ---------------------------------------------------------------------------------------------------------
// Forward: one CTA per (64 queries, head, batch). Grid (ceil(S / 64), H, B).
template <int DMAX> ST_DEV void forward_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd)
  uint16_t* k_s = q_s + kRows * kLd;                                     // (kCols, kLd)
  uint16_t* v_s = k_s + kCols * kLd;                                     // (kCols, kLd)
  int* row_seg = reinterpret_cast<int*>(v_s + kCols * kLd);              // (kRows)
  int* col_seg = row_seg + kRows;                                        // (kCols)

  const int lane = simt::thread_x() % 32, warp = simt::thread_x() / 32, g = lane / 4, t = lane % 4;
  const int row0 = 16 * warp;
  const int q0 = (simt::grid_x() - 1 - simt::block_x()) * kRows;  // the last tiles see the most keys: first
  const int h = simt::block_y(), b = simt::block_z(), kvh = h / a.group;
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const uint16_t* q = a.q + int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
  const uint16_t* k = a.k + int64_t(b) * a.seq * kv_stride + int64_t(kvh) * a.head_dim;
  const uint16_t* v = a.v + int64_t(b) * a.seq * kv_stride + int64_t(kvh) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;
  const float scale2 = a.scale * kLog2e;

  attention_rows::load_segments<kThreads>(row_seg, seg, q0, kRows, a.seq);
  simt::sync();
  load_rows<DMAX>(q_s, q, q_stride, q0, row_seg, a.head_dim, a.vec16);
  simt::sync();
  uint32_t qa[KD][4];  // this warp's 16 query rows as A fragments, for the whole kernel
  for (int kk = 0; kk < KD; ++kk) load_a(qa[kk], q_s, kLd, row0, 16 * kk, g, t);

  float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) o[d][i] = 0.f;

  const int kv_end = simt::imin(a.seq, q0 + kRows);  // causal: no key past the tile's last query
  for (int k0 = 0; k0 < kv_end; k0 += kCols) {
    attention_rows::load_segments<kThreads>(col_seg, seg, k0, kCols, a.seq);
    simt::sync();
    const uint32_t vis = visibility(row_seg, col_seg, row0, g, t, q0, k0, false);
    // Skip a step no pair of which is visible (other documents, padding); a barrier too: after it col_seg is
    // read only by the tile loads below, which end before the next step's first barrier.
    if (!simt::sync_or(vis != 0)) continue;
    load_rows<DMAX>(k_s, k, kv_stride, k0, col_seg, a.head_dim, a.vec16);
    load_rows<DMAX>(v_s, v, kv_stride, k0, col_seg, a.head_dim, a.vec16);
    simt::sync();

    float s[kColTiles][4];
    for (int n = 0; n < kColTiles; ++n)
      for (int i = 0; i < 4; ++i) s[n][i] = 0.f;
    for (int kk = 0; kk < KD; ++kk)
      for (int n = 0; n < kColTiles; ++n) {
        uint32_t kb[2];
        load_b_t(kb, k_s, kLd, 8 * n, 16 * kk, g, t);
        simt::mma_bf16_16816(s[n], qa[kk], kb);
      }

    // Online softmax in the log2 domain. A row with nothing visible yet keeps m = -inf; m_use = 0 then keeps
    // every exp2 at exp2(-inf) = 0 instead of NaN.
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kColTiles; ++n)
      for (int i = 0; i < 4; ++i) {
        s[n][i] = visible(vis, n, i) ? s[n][i] * scale2 : -INFINITY;
        mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
      }
    float m_use[2];
    for (int ri = 0; ri < 2; ++ri) {
      const float m_new = fmaxf(m[ri], quad_max(mx[ri]));
      m_use[ri] = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m[ri] - m_use[ri]);
      m[ri] = m_new;
      l[ri] *= alpha;
      for (int d = 0; d < ND; ++d) {
        o[d][2 * ri] *= alpha;
        o[d][2 * ri + 1] *= alpha;
      }
    }
    for (int n = 0; n < kColTiles; ++n)
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(s[n][i] - m_use[i / 2]);
        s[n][i] = p;
        l[i / 2] += p;  // this lane's columns; summed over the quad at the end
      }

    // o += p v
    for (int j = 0; j < kCols / 16; ++j) {
      uint32_t pa[4];
      acc_to_a(pa, s[2 * j], s[2 * j + 1]);
      for (int d = 0; d < ND; ++d) {
        uint32_t vb[2];
        load_b(vb, v_s, kLd, 16 * j, 8 * d, g, t);
        simt::mma_bf16_16816(o[d], pa, vb);
      }
    }
    // No barrier here: k_s and v_s are rewritten only after the next step's sync_or.
  }

  const float l_row[2] = {quad_sum(l[0]), quad_sum(l[1])};  // every lane takes part in the shuffles
  for (int ri = 0; ri < 2; ++ri) {
    const int r = q0 + row0 + g + 8 * ri;
    if (r >= a.seq) continue;
    const bool live = l_row[ri] > 0.f;  // false exactly when no key was visible (padding)
    const float inv_l = live ? 1.f / l_row[ri] : 0.f;
    uint16_t* o_row = a.out + (int64_t(b) * a.seq + r) * q_stride + int64_t(h) * a.head_dim;
    for (int d = 0; d < ND; ++d)
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * d + 2 * t + e;
        if (c < a.head_dim) o_row[c] = simt::bf16_bits(o[d][2 * ri + e] * inv_l);
      }
    if (t == 0) a.lse_out[(int64_t(b) * a.heads + h) * a.seq + r] = live ? (m[ri] + log2f(l_row[ri])) * kLn2 : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Backward, dk and dv: one CTA per (64 keys, kv head, batch). Grid (ceil(S / 64), Hkv, B).
template <int DMAX> ST_DEV void dkdv_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* k_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd) keys
  uint16_t* v_s = k_s + kRows * kLd;                                     // (kRows, kLd)
  uint16_t* q_s = v_s + kRows * kLd;                                     // (kCols, kLd) this step's queries
  uint16_t* do_s = q_s + kCols * kLd;                                    // (kCols, kLd) their dout
  int* row_seg = reinterpret_cast<int*>(do_s + kCols * kLd);             // (kRows) keys
  int* col_seg = row_seg + kRows;                                        // (kCols) queries
  float* col_lse2 = reinterpret_cast<float*>(col_seg + kCols);           // (kCols)
  float* col_dvec = col_lse2 + kCols;                                    // (kCols)

  const int lane = simt::thread_x() % 32, warp = simt::thread_x() / 32, g = lane / 4, t = lane % 4;
  const int row0 = 16 * warp;
  const int k0 = simt::block_x() * kRows;  // the first tiles see the most queries and start first
  const int kvh = simt::block_y(), b = simt::block_z();
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const int64_t kv_off = int64_t(b) * a.seq * kv_stride + int64_t(kvh) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;
  const float scale2 = a.scale * kLog2e;

  attention_rows::load_segments<kThreads>(row_seg, seg, k0, kRows, a.seq);
  simt::sync();
  load_rows<DMAX>(k_s, a.k + kv_off, kv_stride, k0, row_seg, a.head_dim, a.vec16);  // read after a barrier
  load_rows<DMAX>(v_s, a.v + kv_off, kv_stride, k0, row_seg, a.head_dim, a.vec16);

  float dk[ND][4], dv[ND][4];
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) dk[d][i] = dv[d][i] = 0.f;

  for (int h = kvh * a.group; h < (kvh + 1) * a.group; ++h) {
    const int64_t q_off = int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
    const int64_t stats_off = (int64_t(b) * a.heads + h) * a.seq;
    for (int c0 = k0; c0 < a.seq; c0 += kCols) {  // causal: queries before the tile's first key see none of it
      attention_rows::load_query_stats<kThreads>(col_seg, col_lse2, col_dvec, seg, a.lse + stats_off,
                                                 a.dvec + stats_off, c0, kCols, a.seq, kLog2e);
      simt::sync();
      const uint32_t vis = visibility(row_seg, col_seg, row0, g, t, k0, c0, true);
      if (!simt::sync_or(vis != 0)) continue;
      load_rows<DMAX>(q_s, a.q + q_off, q_stride, c0, col_seg, a.head_dim, a.vec16);
      load_rows<DMAX>(do_s, a.dout + q_off, q_stride, c0, col_seg, a.head_dim, a.vec16);
      simt::sync();

      // s^T = k q^T and dp^T = v dout^T for this warp's 16 keys x 64 queries.
      float st[kColTiles][4], dpt[kColTiles][4];
      for (int n = 0; n < kColTiles; ++n)
        for (int i = 0; i < 4; ++i) st[n][i] = dpt[n][i] = 0.f;
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t ka[4], va[4];
        load_a(ka, k_s, kLd, row0, 16 * kk, g, t);
        load_a(va, v_s, kLd, row0, 16 * kk, g, t);
        for (int n = 0; n < kColTiles; ++n) {
          uint32_t qb[2], db[2];
          load_b_t(qb, q_s, kLd, 8 * n, 16 * kk, g, t);
          load_b_t(db, do_s, kLd, 8 * n, 16 * kk, g, t);
          simt::mma_bf16_16816(st[n], ka, qb);
          simt::mma_bf16_16816(dpt[n], va, db);
        }
      }
      // p^T and ds^T in place of s^T and dp^T.
      for (int n = 0; n < kColTiles; ++n)
        for (int i = 0; i < 4; ++i) {
          const int c = 8 * n + 2 * t + i % 2;
          float p = 0.f, ds = 0.f;
          if (visible(vis, n, i)) {
            p = exp2f(st[n][i] * scale2 - col_lse2[c]);
            ds = p * (dpt[n][i] - col_dvec[c]);
          }
          st[n][i] = p;
          dpt[n][i] = ds;
        }
      // dv += p^T dout, dk += ds^T q (k-steps over the step's queries).
      for (int j = 0; j < kCols / 16; ++j) {
        uint32_t pa[4], sa[4];
        acc_to_a(pa, st[2 * j], st[2 * j + 1]);
        acc_to_a(sa, dpt[2 * j], dpt[2 * j + 1]);
        for (int d = 0; d < ND; ++d) {
          uint32_t db[2], qb[2];
          load_b(db, do_s, kLd, 16 * j, 8 * d, g, t);
          load_b(qb, q_s, kLd, 16 * j, 8 * d, g, t);
          simt::mma_bf16_16816(dv[d], pa, db);
          simt::mma_bf16_16816(dk[d], sa, qb);
        }
      }
      simt::sync();  // col_lse2 / col_dvec were read above; the next step rewrites them before its barrier
    }
  }

  for (int ri = 0; ri < 2; ++ri) {
    const int r = k0 + row0 + g + 8 * ri;
    if (r >= a.seq) continue;
    uint16_t* dk_row = a.dk + int64_t(r) * kv_stride + kv_off;
    uint16_t* dv_row = a.dv + int64_t(r) * kv_stride + kv_off;
    for (int d = 0; d < ND; ++d)
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * d + 2 * t + e;
        if (c >= a.head_dim) continue;
        dk_row[c] = simt::bf16_bits(dk[d][2 * ri + e] * a.scale);
        dv_row[c] = simt::bf16_bits(dv[d][2 * ri + e]);
      }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Backward, dq: one CTA per (64 queries, head, batch). Grid (ceil(S / 64), H, B).
template <int DMAX> ST_DEV void dq_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd)
  uint16_t* do_s = q_s + kRows * kLd;                                    // (kRows, kLd)
  uint16_t* k_s = do_s + kRows * kLd;                                    // (kCols, kLd) this step's keys
  uint16_t* v_s = k_s + kCols * kLd;                                     // (kCols, kLd)
  int* row_seg = reinterpret_cast<int*>(v_s + kCols * kLd);              // (kRows) queries
  float* row_lse2 = reinterpret_cast<float*>(row_seg + kRows);           // (kRows)
  float* row_dvec = row_lse2 + kRows;                                    // (kRows)
  int* col_seg = reinterpret_cast<int*>(row_dvec + kRows);               // (kCols) keys

  const int lane = simt::thread_x() % 32, warp = simt::thread_x() / 32, g = lane / 4, t = lane % 4;
  const int row0 = 16 * warp;
  const int q0 = (simt::grid_x() - 1 - simt::block_x()) * kRows;
  const int h = simt::block_y(), b = simt::block_z(), kvh = h / a.group;
  const int64_t q_stride = int64_t(a.heads) * a.head_dim, kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const int64_t q_off = int64_t(b) * a.seq * q_stride + int64_t(h) * a.head_dim;
  const int64_t kv_off = int64_t(b) * a.seq * kv_stride + int64_t(kvh) * a.head_dim;
  const int32_t* seg = a.seg ? a.seg + int64_t(b) * a.seq : nullptr;
  const int64_t stats_off = (int64_t(b) * a.heads + h) * a.seq;
  const float scale2 = a.scale * kLog2e;

  attention_rows::load_query_stats<kThreads>(row_seg, row_lse2, row_dvec, seg, a.lse + stats_off, a.dvec + stats_off,
                                             q0, kRows, a.seq, kLog2e);
  simt::sync();
  load_rows<DMAX>(q_s, a.q + q_off, q_stride, q0, row_seg, a.head_dim, a.vec16);
  load_rows<DMAX>(do_s, a.dout + q_off, q_stride, q0, row_seg, a.head_dim, a.vec16);
  simt::sync();
  uint32_t qa[KD][4], da[KD][4];
  for (int kk = 0; kk < KD; ++kk) {
    load_a(qa[kk], q_s, kLd, row0, 16 * kk, g, t);
    load_a(da[kk], do_s, kLd, row0, 16 * kk, g, t);
  }
  float lse2[2], dvec[2];
  for (int ri = 0; ri < 2; ++ri) {
    lse2[ri] = row_lse2[row0 + g + 8 * ri];
    dvec[ri] = row_dvec[row0 + g + 8 * ri];
  }

  float dq[ND][4];
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) dq[d][i] = 0.f;

  const int kv_end = simt::imin(a.seq, q0 + kRows);
  for (int k0 = 0; k0 < kv_end; k0 += kCols) {
    attention_rows::load_segments<kThreads>(col_seg, seg, k0, kCols, a.seq);
    simt::sync();
    const uint32_t vis = visibility(row_seg, col_seg, row0, g, t, q0, k0, false);
    if (!simt::sync_or(vis != 0)) continue;
    load_rows<DMAX>(k_s, a.k + kv_off, kv_stride, k0, col_seg, a.head_dim, a.vec16);
    load_rows<DMAX>(v_s, a.v + kv_off, kv_stride, k0, col_seg, a.head_dim, a.vec16);
    simt::sync();

    float s[kColTiles][4], dp[kColTiles][4];
    for (int n = 0; n < kColTiles; ++n)
      for (int i = 0; i < 4; ++i) s[n][i] = dp[n][i] = 0.f;
    for (int kk = 0; kk < KD; ++kk)
      for (int n = 0; n < kColTiles; ++n) {
        uint32_t kb[2], vb[2];
        load_b_t(kb, k_s, kLd, 8 * n, 16 * kk, g, t);
        load_b_t(vb, v_s, kLd, 8 * n, 16 * kk, g, t);
        simt::mma_bf16_16816(s[n], qa[kk], kb);
        simt::mma_bf16_16816(dp[n], da[kk], vb);
      }
    for (int n = 0; n < kColTiles; ++n)
      for (int i = 0; i < 4; ++i)
        s[n][i] = visible(vis, n, i) ? exp2f(s[n][i] * scale2 - lse2[i / 2]) * (dp[n][i] - dvec[i / 2]) : 0.f;
    // dq += ds k
    for (int j = 0; j < kCols / 16; ++j) {
      uint32_t sa[4];
      acc_to_a(sa, s[2 * j], s[2 * j + 1]);
      for (int d = 0; d < ND; ++d) {
        uint32_t kb[2];
        load_b(kb, k_s, kLd, 16 * j, 8 * d, g, t);
        simt::mma_bf16_16816(dq[d], sa, kb);
      }
    }
    // No barrier here: k_s and v_s are rewritten only after the next step's sync_or.
  }

  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri;
    if (q0 + r >= a.seq) continue;
    const float mul = row_seg[r] >= 0 ? a.scale : 0.f;  // padding rows: exactly zero
    uint16_t* dq_row = a.dq + int64_t(q0 + r) * q_stride + q_off;
    for (int d = 0; d < ND; ++d)
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * d + 2 * t + e;
        if (c < a.head_dim) dq_row[c] = simt::bf16_bits(dq[d][2 * ri + e] * mul);
      }
  }
}

// ---------------------------------------------------------------------------------------------------------
// One warp multiplies a (16 x 16) by b (16 x 8) through the fragment loaders and one mma: d (16 x 8) fp32,
// row-major. a row-major; bt = b transposed, (8 x 16) row-major. On the GPU this checks the fragment layouts
// of simt.cuh against the hardware.
ST_DEV void mma_probe_body(const uint16_t* a16x16, const uint16_t* bt8x16, float* d16x8) {
  const int lane = simt::thread_x() % 32, g = lane / 4, t = lane % 4;
  uint32_t af[4], bf[2];
  load_a(af, a16x16, 16, 0, 0, g, t);
  load_b_t(bf, bt8x16, 16, 0, 0, g, t);
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  simt::mma_bf16_16816(d, af, bf);
  for (int i = 0; i < 4; ++i) d16x8[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

}  // namespace shardtrain::kernels::attention_mma
