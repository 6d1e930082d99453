// Cross-entropy on the GPU, alone and fused with lm_head in chunks of tokens (never the full (N, V) logits):
// per chunk, logits (rows, V) fp32 = h_chunk W^T (cuBLASLt), the row kernel turns them into row losses and
// dlogits (in place in fp32, or into a bf16 chunk buffer when h and W are bf16, so the two backward GEMMs
// run on tensor cores), then dh_chunk = dlogits W and dW += dlogits^T h_chunk. The losses are summed once
// at the end in a fixed order, and one small readback + stream synchronization returns them.
#include <algorithm>

#include "context.hpp"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"

namespace shardtrain::ops::cuda {
namespace {

LossSums to_loss_sums(const Readback& r) { return LossSums{r.sums.loss_sum, static_cast<int64_t>(r.sums.tokens)}; }

Tensor device_view(void* data, DType dtype, Shape shape) { return make_tensor(data, dtype, shape, DeviceKind::Cuda); }

}  // namespace

LossSums cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                       double grad_scale, const Tensor& dlogits) {
  const RowDims dims = validate_cross_entropy(tensor_checks, logits, targets, dlogits);
  const int64_t n = dims.rows, vocab = dims.cols;
  const bool grad = dlogits.defined();
  float* row_loss = ctx.scratch_for<float>(Slot::RowLoss, std::max<int64_t>(n, 1));
  const int32_t* t = targets.as<const int32_t>();
  kernels::cross_entropy_rows(logits.dtype, logits.data, n, vocab, t, ignore_index, static_cast<float>(grad_scale),
                              logits.dtype, grad ? dlogits.data : nullptr, row_loss, 0, ctx.error_record(), ctx.stream);
  kernels::cross_entropy_sum(row_loss, t, n, ignore_index, ctx.loss_sums(), ctx.defer_loss ? ctx.deferred_sums() : nullptr,
                             ctx.stream);
  if (ctx.defer_loss) return LossSums{};
  return to_loss_sums(ctx.synchronize_and_check());
}

LossSums linear_cross_entropy(Context& ctx, const Tensor& h, const Tensor& weight, const Tensor& targets,
                              int32_t ignore_index, double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                              const Tensor& dweight) {
  const LinearLossDims dims = validate_linear_cross_entropy(tensor_checks, h, weight, targets, dh, dweight);
  const int64_t n = dims.tokens, d = dims.hidden, vocab = dims.vocab;
  const bool grad = dh.defined();
  chunk_tokens = linear_loss_chunk_tokens(vocab, n, chunk_tokens);  // cuda_ops.hpp (the planner sizes it too)

  // dlogits feed both backward GEMMs: bf16 when h and W are (tensor cores, fp32 accumulation), else fp32.
  const DType grad_dtype = h.dtype == DType::BF16 && weight.dtype == DType::BF16 ? DType::BF16 : DType::F32;
  float* logits = ctx.scratch_for<float>(Slot::Logits, chunk_tokens * vocab);
  void* dlogits = nullptr;
  if (grad) {
    dlogits = grad_dtype == DType::F32 ? static_cast<void*>(logits)
                                       : ctx.scratch_for<char>(Slot::DLogits, chunk_tokens * vocab * 2);
  }
  float* row_loss = ctx.scratch_for<float>(Slot::RowLoss, std::max<int64_t>(n, 1));
  // dW sums over chunks in fp32: straight into dweight when it is f32, else in an fp32 buffer added once at
  // the end (as the CPU backend does), so bf16 dweight is rounded once.
  Tensor dw;
  if (grad) {
    if (dweight.dtype == DType::F32) {
      dw = dweight.reshaped(Shape{vocab, d});
    } else {
      dw = device_view(ctx.scratch_for<float>(Slot::WeightGrad, vocab * d), DType::F32, Shape{vocab, d});
      kernels::elementwise_fill(DType::F32, dw.data, vocab * d, 0.0f, ctx.stream);
    }
  }
  const Tensor w2 = weight.reshaped(Shape{vocab, d});
  const Tensor h2 = h.reshaped(Shape{n, d});
  const Tensor dh2 = grad ? dh.reshaped(Shape{n, d}) : Tensor{};
  const int32_t* t = targets.as<const int32_t>();
  for (int64_t c0 = 0; c0 < n; c0 += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, n - c0);
    const Tensor hc = h2.row_slice(c0, rows);
    const Tensor lc = device_view(logits, DType::F32, Shape{rows, vocab});
    matmul(ctx, Transpose::No, Transpose::Yes, 1.0, hc, w2, 0.0, lc);  // (rows, V) = h_c W^T
    kernels::cross_entropy_rows(DType::F32, logits, rows, vocab, t + c0, ignore_index, static_cast<float>(grad_scale),
                                grad_dtype, dlogits, row_loss + c0, c0, ctx.error_record(), ctx.stream);
    if (!grad) continue;
    const Tensor gc = device_view(dlogits, grad_dtype, Shape{rows, vocab});
    matmul(ctx, Transpose::No, Transpose::No, 1.0, gc, w2, 0.0, dh2.row_slice(c0, rows));  // (rows, D) = dlogits W
    matmul(ctx, Transpose::Yes, Transpose::No, 1.0, gc, hc, 1.0, dw);                      // (V, D) += dlogits^T h_c
  }
  kernels::cross_entropy_sum(row_loss, t, n, ignore_index, ctx.loss_sums(), ctx.defer_loss ? ctx.deferred_sums() : nullptr,
                             ctx.stream);
  if (grad && dweight.dtype != DType::F32)
    kernels::elementwise_add(DType::F32, dw.data, dweight.dtype, dweight.data, vocab * d, ctx.stream);
  if (ctx.defer_loss) return LossSums{};
  return to_loss_sums(ctx.synchronize_and_check());
}

}  // namespace shardtrain::ops::cuda
