// attention_sequences: one block walks the flattened batch in tiles of kThreads tokens. A token starts a run when
// its segment is >= 0 and differs from the previous token's (or it opens a row); an exclusive scan of the
// starts (warp shuffles, then across warps, plus a carry of the earlier tiles) numbers the runs. Starts and ends
// are parked in q_offsets and kv_offsets, checked for ids repeated within a row, then turned into lengths and
// element offsets in place, each entry by the thread that owns it.
// attention_stats_*: grid-stride loops over (B, H, S) elements. attention_zero_padding_rows: a block per token
// (grid-stride), 16-byte stores where the rows allow them.
#include "kernels/attention_sequences.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

ST_DEV int64_t warp_inclusive_sum(int64_t v, int lane) {
  for (int o = 1; o < 32; o <<= 1) {
    const int64_t u = simt::shfl_up(v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// Inclusive sum of v over the block's threads (every thread must call it); the block's total in *total.
ST_DEV int64_t block_inclusive_sum(int64_t v, int64_t* warp_sums, int64_t* total) {
  const int lane = simt::thread_x() & 31, warp = simt::thread_x() >> 5;
  v = warp_inclusive_sum(v, lane);
  if (lane == 31) warp_sums[warp] = v;
  simt::sync();
  if (warp == 0) {
    int64_t w = lane < kWarps ? warp_sums[lane] : 0;
    w = warp_inclusive_sum(w, lane);
    if (lane < kWarps) warp_sums[lane] = w;
  }
  simt::sync();
  if (warp > 0) v += warp_sums[warp - 1];
  *total = warp_sums[kWarps - 1];
  simt::sync();  // warp_sums is reused by the next call
  return v;
}

ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    attention_sequences_kernel(const int32_t* __restrict__ seg, AttentionSequenceDims d, AttentionSequences out,
                               DataErrorRecord* error) {
  ST_SHARED(int64_t, warp_sums, kWarps);
  const int64_t tokens = d.batch * d.seq;
  const int64_t q_unit = d.heads * d.head_dim, kv_unit = d.kv_heads * d.head_dim, stats_unit = d.heads;
  const int tid = simt::thread_x();
  int64_t runs = 0;  // the runs met so far (all threads hold the same value)
  if (seg == nullptr) {
    runs = d.batch;  // one sequence per row
  } else {
    for (int64_t tile = 0; tile < tokens; tile += kThreads) {
      const int64_t t = tile + tid;
      bool starts = false, ends = false;
      if (t < tokens) {
        const int32_t s = seg[t];
        const bool row_first = t % d.seq == 0, row_last = (t + 1) % d.seq == 0;
        starts = s >= 0 && (row_first || seg[t - 1] != s);
        ends = s >= 0 && (row_last || seg[t + 1] != s);
      }
      int64_t tile_runs = 0;
      const int64_t inclusive = block_inclusive_sum(starts ? 1 : 0, warp_sums, &tile_runs);
      const int64_t run = runs + inclusive - 1;  // the run token t belongs to, when its segment is >= 0
      if (starts) {
        if (run < d.count) {
          if (out.q_offsets != nullptr) out.q_offsets[run] = t;
        } else if (run == d.count) {
          detail::record_data_error(error, DataErrorCode::SequenceCount, static_cast<int32_t>(run), t, d.count);
        }
      }
      if (ends && run < d.count && out.kv_offsets != nullptr) out.kv_offsets[run] = t + 1;
      runs += tile_runs;
    }
  }
  const int64_t kept = runs < d.count ? runs : d.count;
  simt::sync();  // every start and end is written

  // A later run of an id the same row already had: compare each run with the earlier runs of its row. The runs
  // are parked as starts in q_offsets, which needs that array (the ragged path always passes it).
  if (seg != nullptr && out.q_offsets != nullptr) {
    for (int64_t i = tid; i < kept; i += kThreads) {
      const int64_t start = out.q_offsets[i], row = start / d.seq;
      const int32_t id = seg[start];
      for (int64_t j = i - 1; j >= 0; --j) {
        const int64_t other = out.q_offsets[j];
        if (other / d.seq != row) break;
        if (seg[other] == id) {
          detail::record_data_error(error, DataErrorCode::DocumentSplit, id, start, d.seq);
          break;
        }
      }
    }
  }
  simt::sync();  // the checks have read every start

  for (int64_t i = tid; i <= d.count; i += kThreads) {
    int64_t start = tokens, length = 0;
    if (i < kept) {
      if (seg == nullptr) {
        start = i * d.seq;
        length = d.seq;
      } else if (out.q_offsets != nullptr && out.kv_offsets != nullptr) {
        start = out.q_offsets[i];
        length = out.kv_offsets[i] - start;
      }
    }
    if (i < d.count && out.lengths != nullptr) out.lengths[i] = static_cast<int32_t>(length);
    if (out.q_offsets != nullptr) out.q_offsets[i] = start * q_unit;
    if (out.kv_offsets != nullptr) out.kv_offsets[i] = start * kv_unit;
    if (out.stats_offsets != nullptr) out.stats_offsets[i] = start * stats_unit;
  }
}

ST_GLOBAL void attention_stats_from_tokens_kernel(const float* __restrict__ stats, const int32_t* __restrict__ seg,
                                                  int64_t batch, int64_t seq, int64_t heads, float* __restrict__ lse) {
  const int64_t n = batch * heads * seq;
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t e = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); e < n; e += stride) {
    const int64_t t = e % seq, bh = e / seq, h = bh % heads, b = bh / heads;
    const int64_t token = b * seq + t;
    lse[e] = seg[token] >= 0 ? stats[token * heads + h] : -INFINITY;
  }
}

ST_GLOBAL void attention_stats_to_tokens_kernel(const float* __restrict__ lse, int64_t batch, int64_t seq, int64_t heads,
                                                float* __restrict__ stats) {
  const int64_t n = batch * heads * seq;
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t e = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); e < n; e += stride) {
    const int64_t t = e % seq, bh = e / seq, h = bh % heads, b = bh / heads;
    stats[(b * seq + t) * heads + h] = lse[e];
  }
}

ST_GLOBAL void attention_zero_padding_rows_kernel(const int32_t* __restrict__ seg, int64_t tokens, int64_t row,
                                                  uint16_t* __restrict__ x, bool vec) {
  for (int64_t t = simt::block_x(); t < tokens; t += simt::grid_x()) {
    if (seg[t] >= 0) continue;  // the same for every thread of the block: no divergence at the barrier-free loop
    uint16_t* r = x + t * row;
    if (vec) {
      alignas(16) const uint16_t zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = int64_t(simt::thread_x()) * 8; i < row; i += int64_t(kThreads) * 8) simt::copy16(r + i, zeros);
    } else {
      for (int64_t i = simt::thread_x(); i < row; i += kThreads) r[i] = 0;
    }
  }
}

}  // namespace

void attention_sequences(const int32_t* segments, const AttentionSequenceDims& d, const AttentionSequences& out,
                         DataErrorRecord* error, StreamRef stream) {
  if (d.count <= 0 || d.batch <= 0 || d.seq <= 0) return;
  if (segments == nullptr && d.count < d.batch) {
    throw InternalError("attention_sequences: plain causal needs one sequence per row (count " + std::to_string(d.count) +
                        " < batch " + std::to_string(d.batch) + ")");
  }
  simt::launch(attention_sequences_kernel, 1, kThreads, 0, detail::cuda_stream(stream), segments, d, out, error);
  ST_CHECK_KERNEL("attention_sequences_kernel");
}

void attention_stats_from_tokens(const float* stats, const int32_t* segments, int64_t batch, int64_t seq, int64_t heads,
                                 float* lse, StreamRef stream) {
  const int64_t n = batch * heads * seq;
  if (n <= 0) return;
  simt::launch(attention_stats_from_tokens_kernel, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
               stats, segments, batch, seq, heads, lse);
  ST_CHECK_KERNEL("attention_stats_from_tokens_kernel");
}

void attention_stats_to_tokens(const float* lse, int64_t batch, int64_t seq, int64_t heads, float* stats, StreamRef stream) {
  const int64_t n = batch * heads * seq;
  if (n <= 0) return;
  simt::launch(attention_stats_to_tokens_kernel, detail::grid_for(n, kThreads), kThreads, 0, detail::cuda_stream(stream),
               lse, batch, seq, heads, stats);
  ST_CHECK_KERNEL("attention_stats_to_tokens_kernel");
}

void attention_zero_padding_rows(const int32_t* segments, int64_t tokens, int64_t row, uint16_t* x, StreamRef stream) {
  if (tokens <= 0 || row <= 0) return;
  const bool vec = row % 8 == 0 && detail::aligned16(x);
  const unsigned grid = static_cast<unsigned>(tokens < 65535 ? tokens : 65535);
  simt::launch(attention_zero_padding_rows_kernel, grid, kThreads, 0, detail::cuda_stream(stream), segments, tokens, row, x,
               vec);
  ST_CHECK_KERNEL("attention_zero_padding_rows_kernel");
}

}  // namespace shardtrain::kernels
