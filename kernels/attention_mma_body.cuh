// Tensor-core flash attention for bf16: the bodies of the forward kernel and of the backward's dk/dv and dq
// kernels, written against kernels/simt.cuh so the same source runs on the GPU (attention_mma.cu wraps each
// in a __global__) and under the SIMT emulator of the tests (tests/kernels/attention_mma_emulated_test.cpp).
// Semantics exactly as attention_fwd.cu / attention_bwd.cu (and Ops::attention_*): causal, grouped-query,
// document segments (-1 = padding: attends to nothing, is attended by nothing), lse = -inf for a row that sees
// nothing, whose out and dq are zero.
//
// A CTA is 4 warps; it owns kRows = 64 rows (queries; keys in the dk/dv kernel), 16 per warp, and steps over
// kCols = 64 columns at a time. Tiles are raw bf16 in shared memory, copied from global memory by cp.async
// (16 bytes at a time, no registers), rows padded by 8 elements (16 bytes) so that the 8 row reads of an
// ldmatrix hit 8 different 16-byte bank groups; Dh is zero-padded to DMAX (16, 32, 64, 96 or 128). Every
// fragment comes from shared memory by ldmatrix.x4 (B operands held n-contiguous by ldmatrix.x4.trans), two
// mma's worth of registers per instruction. The column steps are software-pipelined (pipelined_steps): step
// i + 1's tiles are in flight while step i computes. Scores
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
// Faster later: wgmma on sm_90 (warpgroup mma from shared memory), larger CTAs for Dh <= 64.
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

template <int DMAX>
constexpr int tile_ld() {
  return DMAX + 8;
}
template <int DMAX>
constexpr size_t tile_bytes(int rows) {
  return size_t(rows) * tile_ld<DMAX>() * sizeof(uint16_t);
}

// Shared memory: the row tiles, two buffers of the two column tiles of a step, and per-row and per-column data
// (three buffers of the latter; see pipelined_steps).
template <int DMAX>
constexpr size_t forward_smem_bytes() {
  return tile_bytes<DMAX>(kRows) + 4 * tile_bytes<DMAX>(kCols) + sizeof(int) * (kRows + 3 * kCols);
}
template <int DMAX>
constexpr size_t dkdv_smem_bytes() {
  return 2 * tile_bytes<DMAX>(kRows) + 4 * tile_bytes<DMAX>(kCols) + sizeof(int) * (kRows + 3 * 3 * kCols);
}
template <int DMAX>
constexpr size_t dq_smem_bytes() {
  return 2 * tile_bytes<DMAX>(kRows) + 4 * tile_bytes<DMAX>(kCols) + sizeof(int) * (3 * kRows + 3 * kCols);
}

// Host side: calls f.template operator()<DMAX>() with the smallest padded head dim that holds Dh.
template <typename F>
void with_dmax(int64_t head_dim, F&& f) {
  if (head_dim <= 16) f.template operator()<16>();
  else if (head_dim <= 32) f.template operator()<32>();
  else if (head_dim <= 64) f.template operator()<64>();
  else if (head_dim <= 96) f.template operator()<96>();
  else f.template operator()<128>();
}

// Starts copying tokens [first, first + 64) of a token-major bf16 tensor (stride elements between tokens) into a
// (64, DMAX + 8) tile: cp.async 16 bytes at a time when vec16; zeros (plain stores) past head_dim and in rows
// with a negative segment, so padding values, NaN or not, never reach the arithmetic; element by element
// otherwise. The tile is complete after the caller's cp_async_commit, cp_async_wait and a barrier.
template <int DMAX>
ST_DEV void issue_rows(uint16_t* tile, const uint16_t* src, int64_t stride, int first, const int* row_seg, int head_dim,
                       bool vec16) {
  constexpr int kLd = tile_ld<DMAX>(), kChunks = DMAX / 8;
  for (int e = simt::thread_x(); e < 64 * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    uint16_t* dst = tile + r * kLd + c;
    const bool live = row_seg[r] >= 0;
    if (live && vec16 && c + 8 <= head_dim) {
      simt::cp_async16(dst, src + int64_t(first + r) * stride + c);
    } else {
      for (int i = 0; i < 8; ++i) dst[i] = live && c + i < head_dim ? src[int64_t(first + r) * stride + c + i] : 0;
    }
  }
}
// issue_rows for a tile read right after: all of this thread's copies waited for, then a barrier.
template <int DMAX>
ST_DEV void load_rows(uint16_t* tile, const uint16_t* src, int64_t stride, int first, const int* row_seg, int head_dim,
                      bool vec16) {
  issue_rows<DMAX>(tile, src, stride, first, row_seg, head_dim, vec16);
  simt::cp_async_commit();
  simt::cp_async_wait<0>();
  simt::sync();
}

// Fragments (layouts in simt.cuh), four registers per ldmatrix.x4, from a row-major bf16 tile in shared memory
// whose leading dimension ld is a multiple of 8 (every row starts 16-byte aligned; the 8 rows of one matrix,
// ld * 2 bytes apart with ld = DMAX + 8, fall in 8 different 16-byte bank groups).
// A = tile[r0 .. r0 + 16)[c0 .. c0 + 16); matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
ST_DEV void load_a(uint32_t a[4], const uint16_t* tile, int ld, int r0, int c0, int lane) {
  simt::ldmatrix_x4(a, tile + (r0 + lane % 16) * ld + c0 + 8 * (lane / 16));
}
// The B fragments of two adjacent n-tiles of B[k][n] = tile[n0 + n][k0 + k] (the tile holds B transposed, k
// contiguous, as k holds the keys of q k^T): b[0], b[1] for columns n0 .. n0 + 8 and b[2], b[3] for the next 8.
ST_DEV void load_b_t2(uint32_t b[4], const uint16_t* tile, int ld, int n0, int k0, int lane) {
  const int m = lane / 8;
  simt::ldmatrix_x4(b, tile + (n0 + lane % 8 + 8 * (m / 2)) * ld + k0 + 8 * (m % 2));
}
// The same for B[k][n] = tile[k0 + k][n0 + n] (the tile holds B as is, n contiguous, as v holds it for p v),
// transposed by ldmatrix.trans.
ST_DEV void load_b2(uint32_t b[4], const uint16_t* tile, int ld, int k0, int n0, int lane) {
  const int m = lane / 8;
  simt::ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + 8 * (m % 2)) * ld + n0 + 8 * (m / 2));
}
// The A fragment of k-step j of a (16 x n) product held as accumulators: n-tiles 2j and 2j + 1, rounded to bf16.
ST_DEV void acc_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = simt::pack_bf16(c0[0], c0[1]);
  a[1] = simt::pack_bf16(c0[2], c0[3]);
  a[2] = simt::pack_bf16(c1[0], c1[1]);
  a[3] = simt::pack_bf16(c1[2], c1[3]);
}

// out (16 x DMAX, ND = DMAX / 8 accumulator tiles) += acc (16 x kCols, accumulators rounded to bf16 as the A
// operand) times tile (kCols x DMAX, row-major in shared memory: B held n-contiguous), as o += p v.
template <int ND>
ST_DEV void acc_times_tile(float out[][4], const float acc[][4], const uint16_t* tile, int ld, int lane) {
  for (int j = 0; j < kCols / 16; ++j) {
    uint32_t a[4];
    acc_to_a(a, acc[2 * j], acc[2 * j + 1]);
    for (int d = 0; d < ND; d += 2) {
      uint32_t b[4];
      load_b2(b, tile, ld, 16 * j, 8 * d, lane);
      simt::mma_bf16_16816(out[d], a, b);
      simt::mma_bf16_16816(out[d + 1], a, b + 2);
    }
  }
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
// When the step's columns are all in one segment (`uniform`, a CTA-wide fact from the barrier after they were
// loaded), a row in another segment sees none of them, and one in it sees all of them unless the step crosses
// its causal limit: only those diagonal steps, and steps whose columns span several segments, test pair by
// pair (a shared-memory read and two compares a pair: about as many instructions as the step's mma and
// softmax work together).
ST_DEV uint32_t visibility(const int* row_seg, const int* col_seg, bool uniform, int row0, int g, int t, int row_first,
                           int col_first, bool rows_are_keys) {
  uint32_t vis = 0;
  const int col_seg0 = col_seg[0];
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + g + 8 * ri, rs = row_seg[r];
    if (rs < 0 || (uniform && rs != col_seg0)) continue;
    const int row_tok = row_first + r;
    if (uniform && (rows_are_keys ? row_tok <= col_first : col_first + kCols - 1 <= row_tok)) {
      vis |= 0xffffu << (16 * ri);  // bits (ri * 8 + n) * 2 + e for every n and e
      continue;
    }
    for (int n = 0; n < kColTiles; ++n)
      for (int e = 0; e < 2; ++e) {
        const int c = n * 8 + 2 * t + e;
        const bool causal = rows_are_keys ? row_tok <= col_first + c : col_first + c <= row_tok;
        if (causal && (uniform || col_seg[c] == rs)) vis |= 1u << ((ri * kColTiles + n) * 2 + e);
      }
  }
  return vis;
}
static_assert(kColTiles == 8, "visibility: a fragment row's bits are 16 consecutive ones");
ST_DEV bool visible(uint32_t vis, int n, int i) { return (vis >> ((i / 2 * kColTiles + n) * 2 + i % 2)) & 1u; }
// Sets the fragment entries whose pair is not visible to `masked`. Lanes whose 32 pairs are all visible (every
// step below the diagonal of one document) skip the test: it costs a bit test and a select per entry, about
// what the entry's softmax costs.
ST_DEV void mask_scores(float x[kColTiles][4], uint32_t vis, float masked) {
  if (vis == 0xffffffffu) return;
  for (int n = 0; n < kColTiles; ++n)
    for (int e = 0; e < 4; ++e)
      if (!visible(vis, n, e)) x[n][e] = masked;
}

// A CTA's main loop over `steps` column steps, software-pipelined: step i + 1's per-column data is loaded, its
// visibility found and its tile copies started (cp.async) before step i computes, so the copies run under step
// i's mma work. Per-column data lives in three buffers (step i in i % 3) and the tiles in two (i % 2), so that
// step i + 1's writes meet no read of steps i and i - 1 that a barrier does not already order. Three barriers a
// step, as with the loads in series. A step no pair of which is visible (other documents, padding) copies and
// computes nothing; the decision is CTA-wide (sync_or), so every thread takes the same barriers.
//   meta(i):             step i's per-column data into buffer i % 3 (plain stores); returns whether this
//                        thread stored a segment that differs from the step's first
//   vis_of(i, uniform):  this lane's visibility bits of step i (after meta's barrier, which tells whether the
//                        step's columns are all in one segment)
//   issue(i):            step i's tile copies into buffer i % 2
//   compute(i, vis):     step i (its tiles complete and visible)
template <typename Meta, typename Vis, typename Issue, typename Compute>
ST_DEV void pipelined_steps(int steps, const Meta& meta, const Vis& vis_of, const Issue& issue, const Compute& compute) {
  // Step i's data, visibility and copies (two barriers); whether any pair of it is visible.
  const auto prepare = [&](int i, uint32_t& vis) {
    const bool uniform = !simt::sync_or(meta(i));
    vis = vis_of(i, uniform);
    const bool any = simt::sync_or(vis != 0);
    if (any) issue(i);
    return any;
  };
  uint32_t vis = 0;
  bool any = steps > 0 && prepare(0, vis);
  simt::cp_async_commit();
  for (int i = 0; i < steps; ++i) {
    uint32_t vis_next = 0;
    // Buffer (i + 1) % 3 was last read by step i - 2, before the barriers of step i - 1; after prepare's second
    // barrier every thread is past step i - 1's compute, so its tiles, buffer (i + 1) % 2, are free.
    const bool any_next = i + 1 < steps && prepare(i + 1, vis_next);
    simt::cp_async_commit();  // step i + 1's group, empty or not
    if (any) {
      simt::cp_async_wait<1>();  // every group but step i + 1's
      simt::sync();
      compute(i, vis);
    }
    vis = vis_next;
    any = any_next;
  }
  simt::cp_async_wait<0>();  // the last groups are empty; nothing may stay in flight past the kernel
}

// The key steps of a CTA's 64 queries (forward, dq): tiles of 64 keys of one kv head (k and v point at the
// batch row and head) from the first key to the causal limit, through pipelined_steps; compute(k_s, v_s,
// vis) runs each step that has something visible. col_segs: three buffers of (kCols); kv_s: two buffers of a
// k tile then a v tile, (kCols, DMAX + 8) each.
template <int DMAX, typename Compute>
ST_DEV void over_key_steps(const Args& a, const uint16_t* k, const uint16_t* v, const int32_t* seg, int q0,
                           const int* row_seg, int* col_segs, uint16_t* kv_s, int row0, int g, int t,
                           const Compute& compute) {
  constexpr int kLd = tile_ld<DMAX>();
  const int64_t kv_stride = int64_t(a.kv_heads) * a.head_dim;
  const int kv_end = simt::imin(a.seq, q0 + kRows);  // causal: no key past the tile's last query
  const auto col_seg = [&](int i) { return col_segs + (i % 3) * kCols; };
  const auto k_tile = [&](int i) { return kv_s + (i % 2) * 2 * kCols * kLd; };
  pipelined_steps(
      (kv_end + kCols - 1) / kCols,
      [&](int i) { return attention_rows::load_segments<kThreads>(col_seg(i), seg, i * kCols, kCols, a.seq); },
      [&](int i, bool uniform) { return visibility(row_seg, col_seg(i), uniform, row0, g, t, q0, i * kCols, false); },
      [&](int i) {
        issue_rows<DMAX>(k_tile(i), k, kv_stride, i * kCols, col_seg(i), a.head_dim, a.vec16);
        issue_rows<DMAX>(k_tile(i) + kCols * kLd, v, kv_stride, i * kCols, col_seg(i), a.head_dim, a.vec16);
      },
      [&](int i, uint32_t vis) { compute(k_tile(i), k_tile(i) + kCols * kLd, vis); });
}

// ---------------------------------------------------------------------------------------------------------
// Forward: one CTA per (64 queries, head, batch). Grid (ceil(S / 64), H, B).
template <int DMAX>
ST_DEV void forward_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd)
  uint16_t* kv_s = q_s + kRows * kLd;                             // two buffers of a k tile then a v tile, (kCols, kLd) each
  int* row_seg = reinterpret_cast<int*>(kv_s + 4 * kCols * kLd);  // (kRows)
  int* col_segs = row_seg + kRows;                                // three buffers of (kCols)

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
  uint32_t qa[KD][4];  // this warp's 16 query rows as A fragments, for the whole kernel
  for (int kk = 0; kk < KD; ++kk) load_a(qa[kk], q_s, kLd, row0, 16 * kk, lane);

  float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) o[d][i] = 0.f;

  over_key_steps<DMAX>(
      a, k, v, seg, q0, row_seg, col_segs, kv_s, row0, g, t, [&](const uint16_t* k_s, const uint16_t* v_s, uint32_t vis) {
        float s[kColTiles][4];
        for (int n = 0; n < kColTiles; ++n)
          for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
        for (int kk = 0; kk < KD; ++kk)
          for (int n = 0; n < kColTiles; n += 2) {
            uint32_t kb[4];
            load_b_t2(kb, k_s, kLd, 8 * n, 16 * kk, lane);
            simt::mma_bf16_16816(s[n], qa[kk], kb);
            simt::mma_bf16_16816(s[n + 1], qa[kk], kb + 2);
          }

        // Online softmax in the log2 domain, FlashAttention-2's way: the row max is taken over the raw scores
        // (scale2 > 0 keeps their order, and rounding keeps it too: max(s) * scale2 == max(s * scale2)), and each
        // probability is one FFMA and one exp2, exp2(s * scale2 - m). A row with nothing visible yet keeps
        // m = -inf; m_use = 0 then keeps every exp2 at exp2(-inf) = 0 instead of NaN.
        mask_scores(s, vis, -INFINITY);
        float mx[2] = {-INFINITY, -INFINITY};
        for (int n = 0; n < kColTiles; ++n)
          for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
        float neg_m[2];
        for (int ri = 0; ri < 2; ++ri) {
          const float m_new = fmaxf(m[ri], quad_max(mx[ri]) * scale2);
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float alpha = exp2f(m[ri] - m_use);
          neg_m[ri] = -m_use;
          m[ri] = m_new;
          l[ri] *= alpha;
          for (int d = 0; d < ND; ++d) {
            o[d][2 * ri] *= alpha;
            o[d][2 * ri + 1] *= alpha;
          }
        }
        for (int n = 0; n < kColTiles; ++n)
          for (int e = 0; e < 4; ++e) {
            const float p = exp2f(fmaf(s[n][e], scale2, neg_m[e / 2]));
            s[n][e] = p;
            l[e / 2] += p;  // this lane's columns; summed over the quad at the end
          }

        acc_times_tile<ND>(o, s, v_s, kLd, lane);  // o += p v
      });

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
// Backward, dk and dv: one CTA per (64 keys, kv head, batch). Grid (ceil(S / 64), Hkv, B). Its steps run over
// every query head of the group and, per head, the 64-query steps from the tile's first key (causal: queries
// before it see none of the tile).
template <int DMAX>
ST_DEV void dkdv_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* k_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd) keys
  uint16_t* v_s = k_s + kRows * kLd;                                  // (kRows, kLd)
  uint16_t* qdo_s = v_s + kRows * kLd;  // two buffers of the step's queries then their dout, (kCols, kLd) each
  int* row_seg = reinterpret_cast<int*>(qdo_s + 4 * kCols * kLd);     // (kRows) keys
  int* col_segs = row_seg + kRows;                                    // three buffers of (kCols) queries
  float* col_lse2s = reinterpret_cast<float*>(col_segs + 3 * kCols);  // three of (kCols)
  float* col_dvecs = col_lse2s + 3 * kCols;                           // three of (kCols)

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
  // Complete at the first computed step's wait and barrier (the groups finish in order).
  issue_rows<DMAX>(k_s, a.k + kv_off, kv_stride, k0, row_seg, a.head_dim, a.vec16);
  issue_rows<DMAX>(v_s, a.v + kv_off, kv_stride, k0, row_seg, a.head_dim, a.vec16);
  simt::cp_async_commit();

  float dk[ND][4], dv[ND][4];
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) dk[d][i] = dv[d][i] = 0.f;

  const int col_steps = (a.seq - k0 + kCols - 1) / kCols;
  const auto head = [&](int i) { return kvh * a.group + i / col_steps; };
  const auto c0 = [&](int i) { return k0 + (i % col_steps) * kCols; };
  const auto q_off = [&](int i) { return int64_t(b) * a.seq * q_stride + int64_t(head(i)) * a.head_dim; };
  const auto q_tile = [&](int i) { return qdo_s + (i % 2) * 2 * kCols * kLd; };
  pipelined_steps(
      a.group * col_steps,
      [&](int i) {
        const int64_t stats_off = (int64_t(b) * a.heads + head(i)) * a.seq;
        const int mb = (i % 3) * kCols;
        return attention_rows::load_query_stats<kThreads>(col_segs + mb, col_lse2s + mb, col_dvecs + mb, seg,
                                                          a.lse + stats_off, a.dvec + stats_off, c0(i), kCols, a.seq,
                                                          kLog2e);
      },
      [&](int i, bool uniform) {
        return visibility(row_seg, col_segs + (i % 3) * kCols, uniform, row0, g, t, k0, c0(i), true);
      },
      [&](int i) {
        const int* col_seg = col_segs + (i % 3) * kCols;
        issue_rows<DMAX>(q_tile(i), a.q + q_off(i), q_stride, c0(i), col_seg, a.head_dim, a.vec16);
        issue_rows<DMAX>(q_tile(i) + kCols * kLd, a.dout + q_off(i), q_stride, c0(i), col_seg, a.head_dim, a.vec16);
      },
      [&](int i, uint32_t vis) {
        const uint16_t* q_s = q_tile(i);
        const uint16_t* do_s = q_s + kCols * kLd;
        const float* col_lse2 = col_lse2s + (i % 3) * kCols;
        const float* col_dvec = col_dvecs + (i % 3) * kCols;
        // s^T = k q^T and dp^T = v dout^T for this warp's 16 keys x 64 queries.
        float st[kColTiles][4], dpt[kColTiles][4];
        for (int n = 0; n < kColTiles; ++n)
          for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
        for (int kk = 0; kk < KD; ++kk) {
          uint32_t ka[4], va[4];
          load_a(ka, k_s, kLd, row0, 16 * kk, lane);
          load_a(va, v_s, kLd, row0, 16 * kk, lane);
          for (int n = 0; n < kColTiles; n += 2) {
            uint32_t qb[4], db[4];
            load_b_t2(qb, q_s, kLd, 8 * n, 16 * kk, lane);
            load_b_t2(db, do_s, kLd, 8 * n, 16 * kk, lane);
            simt::mma_bf16_16816(st[n], ka, qb);
            simt::mma_bf16_16816(st[n + 1], ka, qb + 2);
            simt::mma_bf16_16816(dpt[n], va, db);
            simt::mma_bf16_16816(dpt[n + 1], va, db + 2);
          }
        }
        // p^T and ds^T in place of s^T and dp^T; a masked score is -inf, so its p and ds are 0 (every column's lse
        // here is finite, and dp is: padding rows of the tiles are zeros).
        mask_scores(st, vis, -INFINITY);
        for (int n = 0; n < kColTiles; ++n)
          for (int e = 0; e < 4; ++e) {
            const int c = 8 * n + 2 * t + e % 2;
            const float p = exp2f(fmaf(st[n][e], scale2, -col_lse2[c]));
            st[n][e] = p;
            dpt[n][e] = p * (dpt[n][e] - col_dvec[c]);
          }
        // dv += p^T dout, dk += ds^T q (acc_times_tile twice, interleaved: 187 registers at Dh = 64 where two
        // calls one after the other take 231).
        for (int j = 0; j < kCols / 16; ++j) {
          uint32_t pa[4], sa[4];
          acc_to_a(pa, st[2 * j], st[2 * j + 1]);
          acc_to_a(sa, dpt[2 * j], dpt[2 * j + 1]);
          for (int d = 0; d < ND; d += 2) {
            uint32_t db[4], qb[4];
            load_b2(db, do_s, kLd, 16 * j, 8 * d, lane);
            load_b2(qb, q_s, kLd, 16 * j, 8 * d, lane);
            simt::mma_bf16_16816(dv[d], pa, db);
            simt::mma_bf16_16816(dv[d + 1], pa, db + 2);
            simt::mma_bf16_16816(dk[d], sa, qb);
            simt::mma_bf16_16816(dk[d + 1], sa, qb + 2);
          }
        }
      });

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
template <int DMAX>
ST_DEV void dq_body(const Args& a) {
  constexpr int kLd = tile_ld<DMAX>(), KD = DMAX / 16, ND = DMAX / 8;
  uint16_t* q_s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (kRows, kLd)
  uint16_t* do_s = q_s + kRows * kLd;                                 // (kRows, kLd)
  uint16_t* kv_s = do_s + kRows * kLd;                            // two buffers of a k tile then a v tile, (kCols, kLd) each
  int* row_seg = reinterpret_cast<int*>(kv_s + 4 * kCols * kLd);  // (kRows) queries
  float* row_lse2 = reinterpret_cast<float*>(row_seg + kRows);    // (kRows)
  float* row_dvec = row_lse2 + kRows;                             // (kRows)
  int* col_segs = reinterpret_cast<int*>(row_dvec + kRows);       // three buffers of (kCols) keys

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

  attention_rows::load_query_stats<kThreads>(row_seg, row_lse2, row_dvec, seg, a.lse + stats_off, a.dvec + stats_off, q0,
                                             kRows, a.seq, kLog2e);
  simt::sync();
  issue_rows<DMAX>(q_s, a.q + q_off, q_stride, q0, row_seg, a.head_dim, a.vec16);
  load_rows<DMAX>(do_s, a.dout + q_off, q_stride, q0, row_seg, a.head_dim, a.vec16);  // waits for both
  uint32_t qa[KD][4], da[KD][4];
  for (int kk = 0; kk < KD; ++kk) {
    load_a(qa[kk], q_s, kLd, row0, 16 * kk, lane);
    load_a(da[kk], do_s, kLd, row0, 16 * kk, lane);
  }
  float neg_lse2[2], dvec[2];
  for (int ri = 0; ri < 2; ++ri) {
    neg_lse2[ri] = -row_lse2[row0 + g + 8 * ri];
    dvec[ri] = row_dvec[row0 + g + 8 * ri];
  }

  float dq[ND][4];
  for (int d = 0; d < ND; ++d)
    for (int i = 0; i < 4; ++i) dq[d][i] = 0.f;

  over_key_steps<DMAX>(a, a.k + kv_off, a.v + kv_off, seg, q0, row_seg, col_segs, kv_s, row0, g, t,
                       [&](const uint16_t* k_s, const uint16_t* v_s, uint32_t vis) {
                         float s[kColTiles][4], dp[kColTiles][4];
                         for (int n = 0; n < kColTiles; ++n)
                           for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
                         for (int kk = 0; kk < KD; ++kk)
                           for (int n = 0; n < kColTiles; n += 2) {
                             uint32_t kb[4], vb[4];
                             load_b_t2(kb, k_s, kLd, 8 * n, 16 * kk, lane);
                             load_b_t2(vb, v_s, kLd, 8 * n, 16 * kk, lane);
                             simt::mma_bf16_16816(s[n], qa[kk], kb);
                             simt::mma_bf16_16816(s[n + 1], qa[kk], kb + 2);
                             simt::mma_bf16_16816(dp[n], da[kk], vb);
                             simt::mma_bf16_16816(dp[n + 1], da[kk], vb + 2);
                           }
                         // ds = p (dp - dvec); a masked score is -inf, so its p and ds are 0 (lse is finite in every row).
                         mask_scores(s, vis, -INFINITY);
                         for (int n = 0; n < kColTiles; ++n)
                           for (int e = 0; e < 4; ++e)
                             s[n][e] = exp2f(fmaf(s[n][e], scale2, neg_lse2[e / 2])) * (dp[n][e] - dvec[e / 2]);
                         acc_times_tile<ND>(dq, s, k_s, kLd, lane);  // dq += ds k
                       });

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
// The fragment-layout probe: d = a b for a (16 x 16) and b (16 x 16), fp32 (16 x 16) row-major, three ways, by
// one warp. d[0]: fragments read from global memory register by register, in the layouts simt.cuh documents
// (checks the mma); d[1]: the kernels' ldmatrix loaders on a and on bt = b^T (checks ldmatrix); d[2]: on a and
// on b as is (checks ldmatrix.trans). a, b, bt row-major; smem holds a, bt and b, (16, 24) each (the kernels'
// padding of 8 elements).
ST_DEV void mma_probe_body(const uint16_t* a16, const uint16_t* b16, const uint16_t* bt16, float* d) {
  const int lane = simt::thread_x() % 32, g = lane / 4, t = lane % 4;
  constexpr int kLd = 24;
  uint16_t* s = reinterpret_cast<uint16_t*>(simt::dynamic_smem());
  for (int i = lane; i < 16 * 16; i += 32) {
    s[(i / 16) * kLd + i % 16] = a16[i];
    s[16 * kLd + (i / 16) * kLd + i % 16] = bt16[i];
    s[32 * kLd + (i / 16) * kLd + i % 16] = b16[i];
  }
  simt::sync();
  const auto store = [&](float* out, int n0, const float c[4]) {
    for (int i = 0; i < 4; ++i) out[(g + 8 * (i / 2)) * 16 + n0 + 2 * t + i % 2] = c[i];
  };
  {
    uint32_t af[4];
    const uint16_t* p = a16 + g * 16 + 2 * t;
    af[0] = simt::load_u32(p);
    af[1] = simt::load_u32(p + 8 * 16);
    af[2] = simt::load_u32(p + 8);
    af[3] = simt::load_u32(p + 8 * 16 + 8);
    for (int n0 = 0; n0 < 16; n0 += 8) {
      const uint16_t* q = bt16 + (n0 + g) * 16 + 2 * t;
      const uint32_t bf[2] = {simt::load_u32(q), simt::load_u32(q + 8)};
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      simt::mma_bf16_16816(c, af, bf);
      store(d, n0, c);
    }
  }
  uint32_t af[4], bt[4], bn[4];
  load_a(af, s, kLd, 0, 0, lane);
  load_b_t2(bt, s + 16 * kLd, kLd, 0, 0, lane);
  load_b2(bn, s + 32 * kLd, kLd, 0, 0, lane);
  for (int n = 0; n < 2; ++n) {
    float c1[4] = {0.f, 0.f, 0.f, 0.f}, c2[4] = {0.f, 0.f, 0.f, 0.f};
    simt::mma_bf16_16816(c1, af, bt + 2 * n);
    simt::mma_bf16_16816(c2, af, bn + 2 * n);
    store(d + 256, 8 * n, c1);
    store(d + 512, 8 * n, c2);
  }
}
constexpr size_t kProbeSmemBytes = 3 * 16 * 24 * sizeof(uint16_t);

}  // namespace shardtrain::kernels::attention_mma
