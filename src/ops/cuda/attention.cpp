// Argument checks for attention on the GPU (as src/ops/cpu/attention.cpp) and the calls into the flash
// attention kernels (kernels/attention.cuh) and the segments kernel.
#include <cmath>

#include "context.hpp"
#include "kernels/attention.cuh"
#include "kernels/attention_segments.cuh"

namespace shardtrain::ops::cuda {
namespace {

void check_shapes(const char* op, const AttentionShape& sh, const Tensor& q, const Tensor& k, const Tensor& v,
                  const AttentionMask& mask) {
  require(sh.batch > 0 && sh.seq > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.head_dim > 0, op,
          "empty shape B={} S={} H={} Hkv={} Dh={}", sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim);
  require(sh.heads % sh.kv_heads == 0, op, "kv_heads {} does not divide heads {}", sh.kv_heads, sh.heads);
  require_float(q, op, "q");
  require_float(k, op, "k");
  require_float(v, op, "v");
  require(k.dtype == q.dtype && v.dtype == q.dtype, op, "q, k, v must share a dtype");
  require_numel(q, sh.batch * sh.seq * sh.heads * sh.head_dim, op, "q");
  require_numel(k, sh.batch * sh.seq * sh.kv_heads * sh.head_dim, op, "k");
  require_numel(v, sh.batch * sh.seq * sh.kv_heads * sh.head_dim, op, "v");
  if (mask.segments.defined()) {
    require_i32(mask.segments, op, "segments");
    require_numel(mask.segments, sh.batch * sh.seq, op, "segments");
  }
}

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
  const char* op = "attention_forward";
  check_shapes(op, shape, q, k, v, mask);
  require_f32_stats(lse, shape.batch * shape.heads * shape.seq, op, "lse");
  require_float(out, op, "out");
  require(out.dtype == q.dtype && out.numel() == q.numel(), op, "out {} is not shaped like q", out.describe());
  kernels::attention_forward(q.dtype, dims_of(shape), q.data, k.data, v.data, segments_of(mask), scale_of(shape),
                             out.data, lse.as<float>(), ctx.stream);
}

void attention_backward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  check_shapes(op, shape, q, k, v, mask);
  require_f32_stats(lse, shape.batch * shape.heads * shape.seq, op, "lse");
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
  const char* op = "attention_segments";
  require_i32(input_ids, op, "input_ids");
  require_i32(segments, op, "segments");
  require_i32(positions, op, "positions");
  require(input_ids.shape.rank == 2, op, "input_ids must be (batch, seq), got {}", input_ids.shape.str());
  const int64_t b = input_ids.shape[0], s = input_ids.shape[1];
  require_numel(segments, b * s, op, "segments");
  require_numel(positions, b * s, op, "positions");
  const int32_t* docs = nullptr;
  if (document_ids.defined()) {
    require_i32(document_ids, op, "document_ids");
    require_numel(document_ids, b * s, op, "document_ids");
    docs = document_ids.as<const int32_t>();
  }
  kernels::attention_segments(input_ids.as<const int32_t>(), pad_token_id, docs, b, s, segments.as<int32_t>(),
                              positions.as<int32_t>(), ctx.error_record(), ctx.stream);
}

}  // namespace shardtrain::ops::cuda
