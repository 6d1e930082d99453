// Attention on the GPU: the argument checks (shared with the CPU backend through ../validate.hpp), the choice
// between cuDNN's fused flash attention and our kernels (kernels/attention.cuh), and the segments kernel.
#include <cmath>
#include <cstdlib>
#include <string>

#include "context.hpp"
#include "cudnn_attention.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "kernels/attention.cuh"
#include "kernels/attention_segments.cuh"
#include "shardtrain/runtime/log.hpp"

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

std::string describe(const AttentionShape& sh, DType dtype, const AttentionMask& mask, bool backward) {
  const char* masking = mask.hint == SegmentsHint::Causal      ? "causal"
                        : mask.hint == SegmentsHint::Documents ? "documents"
                                                               : "segments";
  return fmt::format("{} {} B={} S={} H={}/{} Dh={} {}", backward ? "backward" : "forward", dtype_name(dtype), sh.batch,
                     sh.seq, sh.heads, sh.kv_heads, sh.head_dim, masking);
}

// Why cuDNN cannot run this call here ("" when it can), and the call as cuDNN's path takes it. A shape cuDNN
// can run has its plan built here, the first time (cached after: a map lookup per call).
std::string cudnn_reason(Context& ctx, const AttentionShape& sh, DType dtype, const AttentionMask& mask, bool backward,
                         SdpaCall* call) {
  const std::string why =
      sdpa_call_of(sh, mask, backward ? SdpaDirection::Backward : SdpaDirection::Forward, ctx.deterministic_attention, call);
  if (!why.empty()) return why;
  return ctx.cudnn_attention().unsupported_reason(*call, dtype);
}

// Auto and Cudnn ask cuDNN first. Each distinct call's choice is logged once, with the reason.
bool use_cudnn(Context& ctx, const AttentionShape& sh, DType dtype, const AttentionMask& mask, bool backward,
               SdpaCall* call) {
  const kernels::AttentionKernel impl = kernels::attention_kernel();
  if (impl == kernels::AttentionKernel::Mma || impl == kernels::AttentionKernel::Fma) return false;
  const std::string reason = cudnn_reason(ctx, sh, dtype, mask, backward, call);
  const std::string described = describe(sh, dtype, mask, backward);
  if (!reason.empty() && impl == kernels::AttentionKernel::Cudnn)
    throw UsageError(fmt::format("SHARDTRAIN_ATTENTION_KERNEL=cudnn: cuDNN cannot run attention {}: {}", described, reason));
  if (ctx.attention_logged.insert(described).second) {
    if (reason.empty())
      log::info("attention {}: cuDNN's fused flash attention{}", described,
                backward ? (call->deterministic ? " (deterministic backward)" : " (nondeterministic backward)") : "");
    else
      log::info("attention {}: our {} kernels (cuDNN: {})", described,
                kernels::attention_uses_mma(dtype) ? "tensor-core" : "FMA", reason);
  }
  return reason.empty();
}

}  // namespace

std::string attention_choice(Context& ctx, const AttentionShape& shape, DType dtype, const AttentionMask& mask,
                             bool backward) {
  const kernels::AttentionKernel impl = kernels::attention_kernel();
  const char* ours = kernels::attention_uses_mma(dtype) ? "mma" : "fma";
  if (impl == kernels::AttentionKernel::Mma || impl == kernels::AttentionKernel::Fma) return ours;
  SdpaCall call;
  const std::string reason = cudnn_reason(ctx, shape, dtype, mask, backward, &call);
  return reason.empty() ? std::string("cudnn") : fmt::format("{} (cuDNN: {})", ours, reason);
}

void attention_forward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  validate_attention_forward(tensor_checks, shape, q, k, v, mask, out, lse);
  if (SdpaCall call; use_cudnn(ctx, shape, q.dtype, mask, false, &call)) {
    CudnnAttention& cudnn = ctx.cudnn_attention();
    const size_t bytes = cudnn.workspace_bytes(call);
    void* ws = bytes > 0 ? ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes)) : nullptr;
    cudnn.forward(call, SdpaForwardTensors{q.data, k.data, v.data, segments_of(mask), out.data, lse.as<float>()}, ws, bytes,
                  ctx.error_record(), ctx.stream);
    return;
  }
  kernels::attention_forward(q.dtype, dims_of(shape), q.data, k.data, v.data, segments_of(mask), scale_of(shape), out.data,
                             lse.as<float>(), ctx.stream);
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
    require(kv_like[i]->dtype == q.dtype && kv_like[i]->numel() == k.numel(), op, "{} {} is not shaped like k", kv_names[i],
            kv_like[i]->describe());
  }
  if (SdpaCall call; use_cudnn(ctx, shape, q.dtype, mask, true, &call)) {
    CudnnAttention& cudnn = ctx.cudnn_attention();
    const size_t bytes = cudnn.workspace_bytes(call);
    void* ws = bytes > 0 ? ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes)) : nullptr;
    cudnn.backward(call,
                   SdpaBackwardTensors{q.data, k.data, v.data, out.data, lse.as<const float>(), dout.data, segments_of(mask),
                                       dq.data, dk.data, dv.data},
                   ws, bytes, ctx.error_record(), ctx.stream);
    return;
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

std::string cudnn_attention_status() {
  cuda::CudnnAttention cudnn;
  const std::string why = cudnn.unavailable_reason();
  return why.empty() ? cudnn.library_description() : "none: " + why;
}

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::Auto: return "auto";
    case AttentionImpl::Cudnn: return "cudnn";
    case AttentionImpl::Mma: return "mma";
    case AttentionImpl::Fma: return "fma";
  }
  return "?";
}

void CudaOps::set_attention_impl(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::Auto: kernels::set_attention_kernel(kernels::AttentionKernel::Auto); break;
    case AttentionImpl::Cudnn: kernels::set_attention_kernel(kernels::AttentionKernel::Cudnn); break;
    case AttentionImpl::Mma: kernels::set_attention_kernel(kernels::AttentionKernel::Mma); break;
    case AttentionImpl::Fma: kernels::set_attention_kernel(kernels::AttentionKernel::Fma); break;
  }
}

AttentionImpl CudaOps::attention_impl() {
  switch (kernels::attention_kernel()) {
    case kernels::AttentionKernel::Auto: return AttentionImpl::Auto;
    case kernels::AttentionKernel::Cudnn: return AttentionImpl::Cudnn;
    case kernels::AttentionKernel::Mma: return AttentionImpl::Mma;
    case kernels::AttentionKernel::Fma: return AttentionImpl::Fma;
  }
  return AttentionImpl::Auto;
}

void CudaOps::use_fma_attention(bool on) { set_attention_impl(on ? AttentionImpl::Fma : AttentionImpl::Auto); }
bool CudaOps::fma_attention() { return attention_impl() == AttentionImpl::Fma; }

void CudaOps::set_deterministic_attention(bool on) { ctx_->deterministic_attention = on; }
bool CudaOps::deterministic_attention() const { return ctx_->deterministic_attention; }

std::string CudaOps::attention_choice(const AttentionShape& shape, DType dtype, const AttentionMask& mask, bool backward) {
  return cuda::attention_choice(*ctx_, shape, dtype, mask, backward);
}

}  // namespace shardtrain::ops
