// Per-row inputs of the flash attention kernels, loaded into shared memory by the THREADS threads of a CTA:
// shared by the FMA kernels (attention_fwd.cu, attention_bwd.cu) and the tensor-core ones
// (attention_mma_body.cuh). Device code against kernels/simt.cuh.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/simt.cuh"

namespace shardtrain::kernels::attention_rows {

// Segments of tokens [first, first + n) of one batch row: the document id (0 without segments), -1 past S.
// A negative value means "attends to nothing and is attended by nothing". Returns whether a value this thread
// stored differs from dst[0] (a barrier's OR of it tells whether the n segments are all one).
template <int THREADS>
ST_DEV bool load_segments(int* dst, const int32_t* seg, int first, int n, int seq) {
  const auto segment = [&](int t) { return t < seq ? (seg ? seg[t] : 0) : -1; };
  const int first_seg = segment(first);
  bool differs = false;
  for (int r = simt::thread_x(); r < n; r += THREADS) {
    dst[r] = segment(first + r);
    differs = differs || dst[r] != first_seg;
  }
  return differs;
}

// Query rows [first, first + n) of one head for the backward: the segment (-1 past S, for padding, and where
// lse = -inf: a row that saw nothing forward gets no gradient), lse * lse_mul (0 in rows with segment -1,
// which no visible pair reads) and dvec. Returns whether a segment this thread stored differs from seg_dst[0].
template <int THREADS>
ST_DEV bool load_query_stats(int* seg_dst, float* lse_dst, float* dvec_dst, const int32_t* seg, const float* lse,
                             const float* dvec, int first, int n, int seq, float lse_mul) {
  const auto segment = [&](int t, float l) { return t >= seq || l == -INFINITY ? -1 : (seg ? seg[t] : 0); };
  const int first_seg = segment(first, first < seq ? lse[first] : 0.f);
  bool differs = false;
  for (int r = simt::thread_x(); r < n; r += THREADS) {
    const int t = first + r;
    float l = 0.f, dd = 0.f;
    if (t < seq) {
      l = lse[t];
      dd = dvec[t];
    }
    const int sg = segment(t, l);
    seg_dst[r] = sg;
    lse_dst[r] = sg >= 0 ? l * lse_mul : 0.f;
    dvec_dst[r] = dd;
    differs = differs || sg != first_seg;
  }
  return differs;
}

}  // namespace shardtrain::kernels::attention_rows
