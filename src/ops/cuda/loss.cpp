// Cross-entropy on the GPU, alone and fused with lm_head in chunks of tokens (never the full (N, V) logits):
// per chunk, logits (rows, V) = h_chunk W^T (cuBLASLt, fp32 accumulation; stored in bf16 when h and W are
// bf16, as PyTorch's bf16 lm_head stores them, else fp32), the row kernel turns them into row losses (fp32
// softmax) and dlogits in place, in the same dtype, then dh_chunk = dlogits W and dW += dlogits^T h_chunk
// (tensor cores for bf16). The losses are summed once at the end in a fixed order, and one small readback +
// stream synchronization returns them.
#include <algorithm>

#include "context.hpp"
#include "kernels/cross_entropy.cuh"
#include "kernels/elementwise.cuh"

namespace shardtrain::ops::cuda {
namespace {

LossSums to_loss_sums(const Readback& r) { return LossSums{r.sums.loss_sum, static_cast<int64_t>(r.sums.tokens)}; }

Tensor device_view(void* data, DType dtype, Shape shape) { return make_tensor(data, dtype, shape, DeviceKind::Cuda); }

}  // namespace

LossSums cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, int32_t ignore_index, double grad_scale,
                       const Tensor& dlogits) {
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
                              const Tensor& dweight, double dweight_beta) {
  const LinearLossDims dims = validate_linear_cross_entropy(tensor_checks, h, weight, targets, dh, dweight, dweight_beta);
  const int64_t n = dims.tokens, d = dims.hidden, vocab = dims.vocab;
  const bool grad = dh.defined();
  // One chunk buffer: logits, then dlogits over them (cuda_ops.hpp; the planner sizes it too). bf16 halves the
  // bytes the row kernel moves and lets the buffer hold twice the rows, so dW is read and written half as often.
  const DType logits_dtype = linear_loss_logits_dtype(h.dtype, weight.dtype);
  chunk_tokens = linear_loss_chunk_tokens(vocab, n, chunk_tokens, logits_dtype);
  void* logits = ctx.scratch_for<char>(Slot::Logits, chunk_tokens * vocab * static_cast<int64_t>(dtype_size(logits_dtype)));
  void* dlogits = grad ? logits : nullptr;
  float* row_loss = ctx.scratch_for<float>(Slot::RowLoss, std::max<int64_t>(n, 1));
  // dW sums over chunks in fp32: straight into dweight when it is f32, else in an fp32 buffer added once at
  // the end (as the CPU backend does), so bf16 dweight is rounded once.
  Tensor dw;
  const bool dw_direct = grad && dweight.dtype == DType::F32;
  if (grad) {
    if (dw_direct) {
      dw = dweight.reshaped(Shape{vocab, d});
      // overwritten, with no chunk to write it
      if (dweight_beta == 0.0 && n == 0) kernels::elementwise_fill(DType::F32, dw.data, vocab * d, 0.0f, ctx.stream);
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
    const Tensor lc = device_view(logits, logits_dtype, Shape{rows, vocab});
    matmul(ctx, Transpose::No, Transpose::Yes, 1.0, hc, w2, 0.0, lc);  // (rows, V) = h_c W^T
    kernels::cross_entropy_rows(logits_dtype, logits, rows, vocab, t + c0, ignore_index, static_cast<float>(grad_scale),
                                logits_dtype, dlogits, row_loss + c0, c0, ctx.error_record(), ctx.stream);
    if (!grad) continue;
    const Tensor& gc = lc;  // the dlogits, written over the logits
    matmul(ctx, Transpose::No, Transpose::No, 1.0, gc, w2, 0.0, dh2.row_slice(c0, rows));  // (rows, D) = dlogits W
    // (V, D) += dlogits^T h_c; the first chunk overwrites dweight when dweight_beta is 0
    matmul(ctx, Transpose::Yes, Transpose::No, 1.0, gc, hc, dw_direct && c0 == 0 ? dweight_beta : 1.0, dw);
  }
  kernels::cross_entropy_sum(row_loss, t, n, ignore_index, ctx.loss_sums(), ctx.defer_loss ? ctx.deferred_sums() : nullptr,
                             ctx.stream);
  if (grad && !dw_direct) {
    if (dweight_beta == 0.0) {
      kernels::elementwise_copy(DType::F32, dw.data, dweight.dtype, dweight.data, vocab * d, ctx.stream);
    } else {
      kernels::elementwise_add(DType::F32, dw.data, dweight.dtype, dweight.data, vocab * d, ctx.stream);
    }
  }
  if (ctx.defer_loss) return LossSums{};
  return to_loss_sums(ctx.synchronize_and_check());
}

}  // namespace shardtrain::ops::cuda
