// Attention on the GPU: the argument checks (shared with the CPU backend through ../validate.hpp) and the
// calls into the flash attention kernels (kernels/attention.cuh) and the segments kernel.
#include <cmath>

#include "context.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "kernels/attention.cuh"
#include "kernels/attention_segments.cuh"

namespace shardtrain::ops::cuda {
namespace {

kernels::AttentionDims dims_of(const AttentionShape& sh) {
  return kernels::AttentionDims{sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim};
}

const int32_t* segments_of(const AttentionMask& mask) {
  return mask.segments.defined() ? mask.segments.as<const int32_t>() : nullptr;
}

// 1 / sqrt(Dh) in fp32, exactly as the CPU backend forms it.
float scale_of(const AttentionShape& sh) { return 1.0f / std::sqrt(static_cast<float>(sh.head_dim)); }

}  // namespace

void attention_forward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  validate_attention_forward(tensor_checks, shape, q, k, v, mask, out, lse);
  kernels::attention_forward(q.dtype, dims_of(shape), q.data, k.data, v.data, segments_of(mask), scale_of(shape),
                             out.data, lse.as<float>(), ctx.stream);
}

void attention_backward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  validate_attention(tensor_checks, op, shape, q, k, v, mask, lse);
  const char* q_names[] = {"out", "dout", "dq"};
  const Tensor* q_like[] = {&out, &dout, &dq};
  for (int i = 0; i < 3; ++i) {
    require_float(*q_like[i], op, q_names[i]);
    require(q_like[i]->dtype == q.dtype && q_like[i]->numel() == q.numel(), op, "{} {} is not shaped like q", q_names[i],
            q_like[i]->describe());
  }
  const char* kv_names[] = {"dk", "dv"};
  const Tensor* kv_like[] = {&dk, &dv};
  for (int i = 0; i < 2; ++i) {
    require_float(*kv_like[i], op, kv_names[i]);
    require(kv_like[i]->dtype == q.dtype && kv_like[i]->numel() == k.numel(), op, "{} {} is not shaped like k",
            kv_names[i], kv_like[i]->describe());
  }
  const kernels::AttentionDims dims = dims_of(shape);
  const size_t bytes = kernels::attention_backward_workspace_bytes(dims);
  void* ws = ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes));
  kernels::attention_backward(q.dtype, dims, q.data, k.data, v.data, out.data, lse.as<const float>(), dout.data,
                              segments_of(mask), scale_of(shape), dq.data, dk.data, dv.data, ws, ctx.stream);
}

void attention_segments(Context& ctx, const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                        const Tensor& segments, const Tensor& positions) {
  const BatchDims dims = validate_attention_segments(tensor_checks, input_ids, document_ids, segments, positions);
  const int32_t* docs = document_ids.defined() ? document_ids.as<const int32_t>() : nullptr;
  kernels::attention_segments(input_ids.as<const int32_t>(), pad_token_id, docs, dims.batch, dims.seq,
                              segments.as<int32_t>(), positions.as<int32_t>(), ctx.error_record(), ctx.stream);
}

}  // namespace shardtrain::ops::cuda

namespace shardtrain::ops {

void CudaOps::use_fma_attention(bool on) {
  kernels::set_attention_kernel(on ? kernels::AttentionKernel::Fma : kernels::AttentionKernel::Auto);
}
bool CudaOps::fma_attention() { return kernels::attention_kernel() == kernels::AttentionKernel::Fma; }

}  // namespace shardtrain::ops
