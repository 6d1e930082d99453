// attention_segments: one block per batch row. A token's position is its distance to the start of its
// document, i.e. t minus an inclusive max-scan of "document starts here" markers, done tile by tile with
// warp shuffles (a carry holds the previous tiles' maximum).
#include "kernels/attention_segments.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

ST_DEV int64_t warp_inclusive_max(int64_t v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t u = simt::shfl_up(v, o);
    if (lane >= o) v = u > v ? u : v;
  }
  return v;
}

ST_GLOBAL void attention_segments_kernel(const int32_t* __restrict__ ids, int32_t pad, const int32_t* __restrict__ docs,
                                         int64_t batch, int64_t seq, int32_t* __restrict__ segments,
                                         int32_t* __restrict__ positions, DataErrorRecord* error) {
  ST_SHARED(int64_t, warp_max, 32);
  ST_SHARED(int64_t, carry, 1);  // carry[0]: the maximum over the previous tiles
  const int lane = simt::thread_x() & 31, warp = simt::thread_x() >> 5;
  for (int64_t b = simt::block_x(); b < batch; b += simt::grid_x()) {
    const int32_t* row_ids = ids + b * seq;
    const int32_t* row_docs = docs != nullptr ? docs + b * seq : nullptr;
    if (simt::thread_x() == 0) carry[0] = 0;
    simt::sync();
    for (int64_t tile = 0; tile < seq; tile += kThreads) {
      const int64_t t = tile + simt::thread_x();
      int32_t doc = 0;
      int64_t start = 0;  // the latest document start at or before t (0 without document ids)
      if (row_docs != nullptr && t < seq) {
        doc = row_docs[t];
        if (doc < 0) detail::record_data_error(error, DataErrorCode::DocumentId, doc, b * seq + t, seq);
        start = t > 0 && row_docs[t - 1] != doc ? t : 0;
      }
      start = warp_inclusive_max(start, lane);
      if (lane == 31) warp_max[warp] = start;
      simt::sync();
      if (warp == 0) {
        int64_t w = lane < kWarps ? warp_max[lane] : 0;
        w = warp_inclusive_max(w, lane);
        if (lane < kWarps) warp_max[lane] = w;
      }
      simt::sync();
      if (warp > 0) start = warp_max[warp - 1] > start ? warp_max[warp - 1] : start;
      start = carry[0] > start ? carry[0] : start;
      if (t < seq) {
        const bool padded = (pad >= 0 && row_ids[t] == pad) || doc < 0;
        segments[b * seq + t] = padded ? -1 : doc;
        positions[b * seq + t] = static_cast<int32_t>(row_docs != nullptr ? t - start : t);
      }
      simt::sync();  // every thread has read carry and warp_max
      if (simt::thread_x() == kThreads - 1) carry[0] = start;
      simt::sync();
    }
  }
}

}  // namespace

void attention_segments(const int32_t* input_ids, int32_t pad_token_id, const int32_t* document_ids, int64_t batch,
                        int64_t seq, int32_t* segments, int32_t* positions, DataErrorRecord* error, StreamRef stream) {
  if (batch <= 0 || seq <= 0) return;
  const unsigned grid = static_cast<unsigned>(batch < 65535 ? batch : 65535);
  simt::launch(attention_segments_kernel, grid, kThreads, 0, detail::cuda_stream(stream), input_ids, pad_token_id,
               document_ids, batch, seq, segments, positions, error);
  ST_CHECK_KERNEL("attention_segments_kernel");
}

}  // namespace shardtrain::kernels
