// Cross-entropy rows (one block per row, an online max/sum pass then a gradient pass) and the one-block
// deterministic sum of row losses.
#include <cmath>

#include "kernels/cross_entropy.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
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

// No __restrict__ on logits/dlogits: they may alias.
template <typename L, typename D>
ST_GLOBAL void rows_kernel(const L* logits, int64_t rows, int64_t vocab, const int32_t* __restrict__ targets,
                           int32_t ignore_index, float grad_scale, D* dlogits, float* __restrict__ row_loss,
                           int64_t first_row, DataErrorRecord* error) {
  ST_SHARED(float, shared_m, 32);
  ST_SHARED(float, shared_s, 32);
  for (int64_t r = simt::block_x(); r < rows; r += simt::grid_x()) {
    const L* z = logits + r * vocab;
    D* dz = dlogits != nullptr ? dlogits + r * vocab : nullptr;
    const int32_t t = targets[r];
    if (t == ignore_index || t < 0 || t >= vocab) {
      if (t != ignore_index && simt::thread_x() == 0)
        detail::record_data_error(error, DataErrorCode::Target, t, first_row + r, vocab, ignore_index);
      if (simt::thread_x() == 0) row_loss[r] = 0.0f;
      if (dz != nullptr)
        for (int64_t j = simt::thread_x(); j < vocab; j += simt::block_dim_x()) dz[j] = from_f32<D>(0.0f);
      continue;
    }
    const float zt = to_f32(z[t]);  // read before any thread overwrites the row
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t j = simt::thread_x(); j < vocab; j += simt::block_dim_x()) {
      const float v = to_f32(z[j]);
      if (v == -INFINITY) continue;
      if (v > acc.m) {
        acc.s = acc.s * expf(acc.m - v) + 1.0f;  // exp(-inf) = 0 on the first element
        acc.m = v;
      } else {
        acc.s += expf(v - acc.m);
      }
    }
    const MaxSum total = block_max_sum(acc, shared_m, shared_s);  // synchronizes: all reads of z are done
    if (simt::thread_x() == 0) row_loss[r] = total.m + logf(total.s) - zt;
    if (dz != nullptr) {
      const float f = grad_scale / total.s;
      for (int64_t j = simt::thread_x(); j < vocab; j += simt::block_dim_x()) {
        float g = expf(to_f32(z[j]) - total.m) * f;
        if (j == t) g -= grad_scale;
        dz[j] = from_f32<D>(g);
      }
    }
  }
}

ST_GLOBAL void sum_kernel(const float* __restrict__ row_loss, const int32_t* __restrict__ targets, int64_t n,
                          int32_t ignore_index, LossSumsDevice* __restrict__ out, LossSumsDevice* __restrict__ total) {
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
      simt::launch(rows_kernel<L, D>, grid, kThreads, 0, s, static_cast<const L*>(logits), rows, vocab, targets,
                   ignore_index, grad_scale, static_cast<D*>(dlogits), row_loss, first_row, error);
      ST_CHECK_KERNEL("cross_entropy rows_kernel");
    });
  });
}

void cross_entropy_sum(const float* row_loss, const int32_t* targets, int64_t n, int32_t ignore_index,
                       LossSumsDevice* out, LossSumsDevice* total, StreamRef stream) {
  // Runs for n == 0 too, so that *out always holds this call's (zero) sums.
  simt::launch(sum_kernel, 1, kSumThreads, 0, detail::cuda_stream(stream), row_loss, targets, n, ignore_index, out,
               total);
  ST_CHECK_KERNEL("cross_entropy sum_kernel");
}

}  // namespace shardtrain::kernels
