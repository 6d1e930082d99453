// Cross-entropy rows (one block per row, an online max/sum pass then a gradient pass, 16-byte accesses where
// the row length and alignment allow) and the one-block deterministic sum of row losses.
#include <cmath>

#include "kernels/cross_entropy.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::load_floats;
using detail::store_floats;
using detail::to_f32;

constexpr int kThreads = 512;
constexpr int kSumThreads = 1024;
constexpr int64_t kMaxBlocks = 1 << 20;

// (m, s): the running max and the sum of exp(z - m). Merging keeps the larger max.
struct MaxSum {
  float m;
  float s;
};

ST_DEV MaxSum merge(MaxSum a, MaxSum b) {
  if (a.m == -INFINITY) return b;
  if (b.m == -INFINITY) return a;
  const float m = a.m > b.m ? a.m : b.m;
  return MaxSum{m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

ST_DEV MaxSum block_max_sum(MaxSum v, float* shared_m, float* shared_s) {
  constexpr int kWarps = kThreads / 32;
  const int lane = simt::thread_x() & 31, warp = simt::thread_x() >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other{simt::shfl_xor(v.m, o), simt::shfl_xor(v.s, o)};
    v = merge(v, other);
  }
  if (lane == 0) {
    shared_m[warp] = v.m;
    shared_s[warp] = v.s;
  }
  simt::sync();
  if (warp == 0) {
    MaxSum r = lane < kWarps ? MaxSum{shared_m[lane], shared_s[lane]} : MaxSum{-INFINITY, 0.0f};
    for (int o = 16; o > 0; o >>= 1) {
      const MaxSum other{simt::shfl_xor(r.m, o), simt::shfl_xor(r.s, o)};
      r = merge(r, other);
    }
    if (lane == 0) {
      shared_m[0] = r.m;
      shared_s[0] = r.s;
    }
  }
  simt::sync();
  const MaxSum r{shared_m[0], shared_s[0]};
  simt::sync();
  return r;
}

// One block per row, K elements per access (16 bytes of the wider of L and D when vocab is a multiple of it and
// both arrays are 16-byte aligned, else 1). No __restrict__ on logits/dlogits: they may alias (each thread
// then overwrites only the elements it has just read itself, after the block has finished the max/sum pass).
template <int K, typename L, typename D>
ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    cross_entropy_rows_kernel(const L* logits, int64_t rows, int64_t vocab, const int32_t* __restrict__ targets,
                              int32_t ignore_index, float grad_scale, D* dlogits, float* __restrict__ row_loss,
                              int64_t first_row, DataErrorRecord* error) {
  ST_SHARED(float, shared_m, 32);
  ST_SHARED(float, shared_s, 32);
  const int64_t first = int64_t(simt::thread_x()) * K, step = int64_t(simt::block_dim_x()) * K;
  for (int64_t r = simt::block_x(); r < rows; r += simt::grid_x()) {
    const L* z = logits + r * vocab;
    D* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    const int32_t t = targets[r];
    if (t == ignore_index || t < 0 || t >= vocab) {
      if (t != ignore_index && simt::thread_x() == 0)
        detail::record_data_error(error, DataErrorCode::Target, t, first_row + r, vocab, ignore_index);
      if (simt::thread_x() == 0) row_loss[r] = 0.0f;
      if (dz != nullptr) {
        float zero[K] = {};
        for (int64_t j = first; j < vocab; j += step) store_floats(dz + j, zero);
      }
      continue;
    }
    const float zt = to_f32(z[t]);  // read before any thread overwrites the row
    // One rescale per access: the K values' max first, then K independent exponentials (an update per element
    // chained every exponential on the one before it).
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t j = first; j < vocab; j += step) {
      float v[K];
      load_floats(z + j, v);
      float vmax = v[0];
      for (int k = 1; k < K; ++k) vmax = v[k] > vmax ? v[k] : vmax;
      if (vmax == -INFINITY) continue;  // all masked (a NaN is not skipped: it reaches the loss)
      const float m = vmax > acc.m ? vmax : acc.m;
      float add = 0.0f;
      for (int k = 0; k < K; ++k) add += expf(v[k] - m);  // exp(-inf) = 0 for a masked logit
      acc.s = acc.s * expf(acc.m - m) + add;              // exp(-inf) = 0 on the first access
      acc.m = m;
    }
    const MaxSum total = block_max_sum(acc, shared_m, shared_s);  // synchronizes: all reads of z are done
    if (simt::thread_x() == 0) row_loss[r] = total.m + logf(total.s) - zt;
    if (dz != nullptr) {
      const float f = grad_scale / total.s;
      for (int64_t j = first; j < vocab; j += step) {
        float g[K];
        load_floats(z + j, g);
        for (int k = 0; k < K; ++k) {
          g[k] = expf(g[k] - total.m) * f;
          if (j + k == t) g[k] -= grad_scale;
        }
        store_floats(dz + j, g);
      }
    }
  }
}

ST_GLOBAL void cross_entropy_sum_kernel(const float* __restrict__ row_loss, const int32_t* __restrict__ targets, int64_t n,
                                        int32_t ignore_index, LossSumsDevice* __restrict__ out,
                                        LossSumsDevice* __restrict__ total) {
  ST_SHARED(double, shared_d, 32);
  ST_SHARED(double, shared_c, 32);
  double loss = 0.0, count = 0.0;
  for (int64_t i = simt::thread_x(); i < n; i += simt::block_dim_x()) {
    if (targets[i] == ignore_index) continue;
    loss += static_cast<double>(row_loss[i]);
    count += 1.0;
  }
  loss = detail::block_sum<kSumThreads>(loss, shared_d);
  count = detail::block_sum<kSumThreads>(count, shared_c);
  if (simt::thread_x() == 0) {
    out->loss_sum = loss;
    out->tokens = static_cast<int64_t>(count);
    if (total) {
      total->loss_sum += loss;
      total->tokens += static_cast<int64_t>(count);
    }
  }
}

}  // namespace

void cross_entropy_rows(DType logits_dtype, const void* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                        int32_t ignore_index, float grad_scale, DType dlogits_dtype, void* dlogits, float* row_loss,
                        int64_t first_row, DataErrorRecord* error, StreamRef stream) {
  if (rows <= 0) return;
  const unsigned grid = static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
  cudaStream_t s = detail::cuda_stream(stream);
  detail::dispatch_float(logits_dtype, "cross_entropy_rows", [&](auto ltag) {
    using L = typename decltype(ltag)::type;
    detail::dispatch_float(dlogits_dtype, "cross_entropy_rows", [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      detail::with_row_width<L, D>(
          vocab,
          [&](auto width) {
            simt::launch(cross_entropy_rows_kernel<decltype(width)::value, L, D>, grid, kThreads, 0, s,
                         static_cast<const L*>(logits), rows, vocab, targets, ignore_index, grad_scale,
                         static_cast<D*>(dlogits), row_loss, first_row, error);
            ST_CHECK_KERNEL("cross_entropy_rows_kernel");
          },
          logits, dlogits);
    });
  });
}

void cross_entropy_sum(const float* row_loss, const int32_t* targets, int64_t n, int32_t ignore_index, LossSumsDevice* out,
                       LossSumsDevice* total, StreamRef stream) {
  // Runs for n == 0 too, so that *out always holds this call's (zero) sums.
  simt::launch(cross_entropy_sum_kernel, 1, kSumThreads, 0, detail::cuda_stream(stream), row_loss, targets, n, ignore_index,
               out, total);
  ST_CHECK_KERNEL("cross_entropy_sum_kernel");
}

}  // namespace shardtrain::kernels
