// CudaOps: the Ops interface on the GPU, forwarding to the op families in this folder (context.hpp).
#include "shardtrain/ops/cuda_ops.hpp"

#include <cuda_runtime_api.h>

#include "context.hpp"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::ops {

CudaOps::CudaOps(const CudaOpsOptions& options) {
  if (cuda_device_count() == 0)
    throw Error(ExitCode::Device, "CudaOps: no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES empty)");
  ctx_ = std::make_unique<cuda::Context>(options);
}

CudaOps::~CudaOps() = default;

void CudaOps::set_stream(StreamRef stream) { ctx_->switch_stream(stream); }
StreamRef CudaOps::stream() const { return ctx_->stream; }

void CudaOps::matmul(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
                     const Tensor& c) {
  cuda::matmul(*ctx_, ta, tb, alpha, a, b, beta, c);
}
void CudaOps::matmul_add(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, const Tensor& c,
                         const Tensor& out) {
  cuda::matmul_add(*ctx_, ta, tb, alpha, a, b, c, out);
}
void CudaOps::fill(const Tensor& out, double value) { cuda::fill(*ctx_, out, value); }
void CudaOps::copy(const Tensor& src, const Tensor& dst) { cuda::copy(*ctx_, src, dst); }
void CudaOps::add(const Tensor& x, const Tensor& y) { cuda::add(*ctx_, x, y); }
void CudaOps::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  cuda::embedding_forward(*ctx_, ids, table, out);
}
void CudaOps::embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  cuda::embedding_backward(*ctx_, ids, dout, dtable);
}
void CudaOps::rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                              const Tensor& h_out, const Tensor& y, const Tensor& rstd) {
  cuda::rmsnorm_forward(*ctx_, x, residual, weight, eps, h_out, y, rstd);
}
void CudaOps::rmsnorm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                               const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  cuda::rmsnorm_backward(*ctx_, dy, h, weight, rstd, dh_extra, dh, dweight);
}
void CudaOps::rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) {
  cuda::rope(*ctx_, x, positions, freq, direction);
}
void CudaOps::rope_qkv_forward(const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq, const Tensor& q,
                               const Tensor& k, const Tensor& v) {
  cuda::rope_qkv_forward(*ctx_, qkv, positions, freq, q, k, v);
}
void CudaOps::rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                                const RopeFrequencies& freq, const Tensor& dqkv) {
  cuda::rope_qkv_backward(*ctx_, dq, dk, dv, positions, freq, dqkv);
}
void CudaOps::attention_forward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                                const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  cuda::attention_forward(*ctx_, shape, q, k, v, mask, out, lse);
}
void CudaOps::attention_backward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  cuda::attention_backward(*ctx_, shape, q, k, v, out, lse, dout, mask, dq, dk, dv);
}
void CudaOps::attention_segments(const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                                 const Tensor& segments, const Tensor& positions) {
  cuda::attention_segments(*ctx_, input_ids, pad_token_id, document_ids, segments, positions);
}
void CudaOps::swiglu_forward(const Tensor& gate_up, GateUpLayout layout, const Tensor& out) {
  cuda::swiglu_forward(*ctx_, gate_up, layout, out);
}
void CudaOps::swiglu_backward(const Tensor& dout, const Tensor& gate_up, GateUpLayout layout, const Tensor& dgate_up) {
  cuda::swiglu_backward(*ctx_, dout, gate_up, layout, dgate_up);
}
LossSums CudaOps::cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index, double grad_scale,
                                const Tensor& dlogits) {
  return cuda::cross_entropy(*ctx_, logits, targets, ignore_index, grad_scale, dlogits);
}
LossSums CudaOps::linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                       int32_t ignore_index, double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                                       const Tensor& dweight) {
  return cuda::linear_cross_entropy(*ctx_, h, weight, targets, ignore_index, grad_scale, chunk_tokens, dh, dweight);
}

void CudaOps::defer_loss(bool on) { ctx_->defer_loss = on; }
LossSums CudaOps::take_loss() {
  // Read (one copy, one wait), then the total starts again from zero: also when a kernel recorded a bad
  // target, so that the DataError leaves no stale sums behind.
  auto restart = [&] {
    ST_CHECK_CUDA(cudaMemsetAsync(ctx_->deferred_sums(), 0, sizeof(kernels::LossSumsDevice),
                                  static_cast<cudaStream_t>(ctx_->stream.handle)));
  };
  cuda::Readback r;
  try {
    r = ctx_->synchronize_and_check();
  } catch (...) {
    restart();
    throw;
  }
  restart();
  return LossSums{r.deferred.loss_sum, static_cast<int64_t>(r.deferred.tokens)};
}

void CudaOps::sum_squares(const Tensor& x, const Tensor& out, SumInto mode) { cuda::sum_squares(*ctx_, x, out, mode); }
void CudaOps::synchronize() { ctx_->synchronize_and_check(); }
size_t CudaOps::gemm_plans() const { return ctx_->gemm.plans(); }

std::unique_ptr<Ops> make_cuda_ops(const CudaOpsOptions& options) { return std::make_unique<CudaOps>(options); }

}  // namespace shardtrain::ops
