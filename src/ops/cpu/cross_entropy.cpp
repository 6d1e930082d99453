// Cross-entropy with ignore_index, alone and fused with lm_head. The fused form forms logits for a chunk
// of tokens (chunk x V), turns them into the loss and dlogits in place, and immediately folds them into
// dh and dW, so full-vocabulary probabilities exist for one chunk at a time. With bf16 h and W (mixed
// precision) the logits and dlogits are rounded to bf16, as the CUDA backend stores them and as PyTorch's
// bf16 lm_head produces them: the softmax itself runs in fp32 on the rounded logits.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels.hpp"
#include "rows.hpp"

namespace shardtrain::ops::cpu {
namespace {

void check_targets(const int32_t* t, int64_t n, int64_t vocab, int32_t ignore_index) {
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] != ignore_index && (t[i] < 0 || t[i] >= vocab))
      throw DataError(
          fmt::format("target {} at position {} is outside the vocabulary [0, {}) and is not "
                      "ignore_index {}",
                      t[i], i, vocab, ignore_index));
  }
}

// One row of logits z (V) in place: returns -log softmax(z)[target]; when grad, z becomes
// scale * (softmax(z) - onehot(target)). Ignored rows return 0 and, with grad, become zeros.
template <typename A>
A loss_row(A* z, int64_t vocab, int32_t target, int32_t ignore_index, A scale, bool grad) {
  if (target == ignore_index) {
    if (grad) std::fill(z, z + vocab, A(0));
    return 0;
  }
  return rows::cross_entropy(z, vocab, target, scale, grad);
}

// In place: every value rounded to the nearest bf16 (the logits and dlogits of a bf16 lm_head).
void round_to_bf16(int threads, float* p, int64_t n) {
#pragma omp parallel for num_threads(threads) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(bf16(p[i]));
}

}  // namespace

LossSums cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, int32_t ignore_index, double grad_scale,
                       const Tensor& dlogits) {
  const char* op = "cross_entropy";
  const RowDims dims = validate_cross_entropy(tensor_checks, logits, targets, dlogits);
  const int64_t n = dims.rows, vocab = dims.cols;
  const bool grad = dlogits.defined();
  const int32_t* t = targets.as<const int32_t>();
  check_targets(t, n, vocab, ignore_index);
  LossSums sums;
  dispatch_float(logits.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    A* rows = ctx.scratch_for<A>(Slot::Logits, n * vocab);
    A* row_loss = ctx.scratch_for<A>(Slot::LossRows, n);
    const T* z = logits.as<const T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n * vocab > (1 << 14))
    for (int64_t i = 0; i < n; ++i) {
      A* r = rows + i * vocab;
      for (int64_t j = 0; j < vocab; ++j) r[j] = load(z[i * vocab + j]);
      row_loss[i] = loss_row(r, vocab, t[i], ignore_index, static_cast<A>(grad_scale), grad);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == ignore_index) continue;
      sums.loss_sum += static_cast<double>(row_loss[i]);
      ++sums.tokens;
    }
    if (grad) {
      T* dz = dlogits.as<T>();
      for (int64_t i = 0; i < n * vocab; ++i) store(dz[i], rows[i]);
    }
  });
  return ctx.deferred(sums);
}

LossSums linear_cross_entropy(Context& ctx, const Tensor& h, const Tensor& weight, const Tensor& targets,
                              int32_t ignore_index, double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                              const Tensor& dweight, double dweight_beta) {
  const char* op = "linear_cross_entropy";
  const LinearLossDims dims = validate_linear_cross_entropy(tensor_checks, h, weight, targets, dh, dweight, dweight_beta);
  const int64_t n = dims.tokens, d = dims.hidden, vocab = dims.vocab;
  const bool grad = dh.defined();
  const int32_t* t = targets.as<const int32_t>();
  check_targets(t, n, vocab, ignore_index);
  // Default: about 16M logits (64 MiB in fp32) per chunk; more rows per chunk make the dW GEMM (K = rows) efficient.
  if (chunk_tokens <= 0) chunk_tokens = std::clamp<int64_t>((int64_t{16} << 20) / std::max<int64_t>(vocab, 1), 64, 4096);
  const bool bf16_logits = h.dtype == DType::BF16 && weight.dtype == DType::BF16;
  LossSums sums;
  dispatch_float(h.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    // Everything in the compute type: weight and h widened once, dW summed in a compute-type buffer
    // unless dweight already is one.
    const A* w = as_compute<A>(ctx, Slot::Weight, weight);
    const A* hc = as_compute<A>(ctx, Slot::GemmA, h);
    const bool dw_direct = grad && dweight.dtype == dtype_of_v<A>;
    A* dw = nullptr;
    if (grad) {
      dw = dw_direct ? dweight.as<A>() : ctx.scratch_for<A>(Slot::WeightGrad, vocab * d);
      // Zeroed to sum into: a scratch buffer, or dweight overwritten with no chunk to write it.
      if (!dw_direct || (dweight_beta == 0.0 && n == 0)) std::fill(dw, dw + vocab * d, A(0));
    }
    const bool dh_direct = grad && dh.dtype == dtype_of_v<A>;
    A* dh_buf = grad ? (dh_direct ? dh.as<A>() : ctx.scratch_for<A>(Slot::GemmC, n * d)) : nullptr;
    A* logits = ctx.scratch_for<A>(Slot::Logits, std::min(chunk_tokens, n) * vocab);
    A* row_loss = ctx.scratch_for<A>(Slot::LossRows, n);
    for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
      const int64_t rows = std::min(chunk_tokens, n - c0);
      // (rows, V) = h[c0 : c0+rows] @ W^T
      gemm_raw<A>(ctx.threads, Transpose::No, Transpose::Yes, rows, vocab, d, A(1), hc + c0 * d, d, w, d, A(0), logits,
                  vocab);
      if constexpr (std::is_same_v<A, float>) {
        if (bf16_logits) round_to_bf16(ctx.threads, logits, rows * vocab);
      }
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (rows * vocab > (1 << 14))
      for (int64_t i = 0; i < rows; ++i)
        row_loss[c0 + i] = loss_row(logits + i * vocab, vocab, t[c0 + i], ignore_index, static_cast<A>(grad_scale), grad);
      if (!grad) continue;
      if constexpr (std::is_same_v<A, float>) {
        if (bf16_logits) round_to_bf16(ctx.threads, logits, rows * vocab);
      }
      // dh (rows, D) = dlogits @ W;  dW (V, D) += dlogits^T @ h
      gemm_raw<A>(ctx.threads, Transpose::No, Transpose::No, rows, d, vocab, A(1), logits, vocab, w, d, A(0),
                  dh_buf + c0 * d, d);
      // the first chunk overwrites dweight when dweight_beta is 0
      const A beta = dw_direct && c0 == 0 ? static_cast<A>(dweight_beta) : A(1);
      gemm_raw<A>(ctx.threads, Transpose::Yes, Transpose::No, vocab, d, rows, A(1), logits, vocab, hc + c0 * d, d, beta, dw,
                  d);
    }
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == ignore_index) continue;
      sums.loss_sum += static_cast<double>(row_loss[i]);
      ++sums.tokens;
    }
    if (grad && !dh_direct) {
      T* out = dh.as<T>();
      for (int64_t i = 0; i < n * d; ++i) store(out[i], dh_buf[i]);
    }
    if (grad && !dw_direct) write_into(dw, dweight, dweight_beta == 0.0 ? Into::Store : Into::Add);
  });
  return ctx.deferred(sums);
}

}  // namespace shardtrain::ops::cpu
