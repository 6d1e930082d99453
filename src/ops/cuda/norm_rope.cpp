// RMSNorm, RoPE and RoPE fused with the q/k/v split on the GPU: argument checks (shared with
// src/ops/cpu/rmsnorm.cpp and rope.cpp through ../validate.hpp, but for the messages that differ) and launches.
#include "context.hpp"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_qkv.cuh"

namespace shardtrain::ops::cuda {

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     const Tensor& h_out, const Tensor& y, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const auto [rows, d] = validate_rmsnorm_forward(tensor_checks, x, residual, weight, y);
  if (residual.defined()) {
    require(h_out.defined(), op, "h_out must be bound like x when a residual is given");
    require_float(h_out, op, "h_out");
    require(h_out.dtype == x.dtype && h_out.numel() == x.numel(), op, "h_out is {}, expected like x {}", h_out.describe(),
            x.describe());
  }
  require_stats(tensor_checks, rstd, x, rows, op, "rstd");
  kernels::rmsnorm_forward(x.dtype, x.data, residual.defined() ? residual.data : nullptr, weight.dtype, weight.data,
                           static_cast<float>(eps), rows, d, residual.defined() ? h_out.data : nullptr, y.data,
                           rstd.as<float>(), ctx.stream);
}

void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  const auto [rows, d] = validate_rmsnorm_backward(tensor_checks, h, weight, dweight);
  const char* names[] = {"dy", "dh", "dh_extra"};
  const Tensor* tensors[] = {&dy, &dh, &dh_extra};
  for (int i = 0; i < 3; ++i) {
    if (tensors[i] == &dh_extra && !dh_extra.defined()) continue;
    require_float(*tensors[i], op, names[i]);
    require(tensors[i]->dtype == h.dtype && tensors[i]->numel() == h.numel(), op, "{} is {}, not shaped like h {}", names[i],
            tensors[i]->describe(), h.describe());
  }
  require_stats(tensor_checks, rstd, h, rows, op, "rstd");
  const size_t bytes = kernels::rmsnorm_backward_workspace_bytes(rows, d);
  void* ws = ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes));
  kernels::rmsnorm_backward(h.dtype, dy.data, h.data, weight.dtype, weight.data, rstd.as<const float>(),
                            dh_extra.defined() ? dh_extra.data : nullptr, dh.data, rows, d, dweight.dtype, dweight.data, ws,
                            bytes, ctx.stream);
}

void rope(Context& ctx, const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) {
  validate_rope(tensor_checks, x, positions);
  // The frequencies the CPU backend uses, formed on the host (a few dozen fp32 operations) and passed by value.
  const std::vector<float> inv_freq = rope_inv_freq<float>(freq, x.shape[2]);
  kernels::rope(x.dtype, x.data, positions.as<const int32_t>(), x.shape[0], x.shape[1], x.shape[2], inv_freq.data(),
                direction == RopeDirection::Forward ? kernels::RopeDirection::Forward : kernels::RopeDirection::Backward,
                ctx.stream);
}

namespace {
const char* const kQkvNames[4] = {"qkv", "q", "k", "v"};
const char* const kDqkvNames[4] = {"dqkv", "dq", "dk", "dv"};
}  // namespace

void rope_qkv_forward(Context& ctx, const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq, const Tensor& q,
                      const Tensor& k, const Tensor& v) {
  const QkvDims d = validate_rope_qkv(tensor_checks, "rope_qkv_forward", qkv, positions, q, k, v, kQkvNames);
  const std::vector<float> inv_freq = rope_inv_freq<float>(freq, d.head_dim);
  kernels::rope_qkv(qkv.dtype, qkv.data, q.data, k.data, v.data, positions.as<const int32_t>(), d.tokens, d.heads,
                    d.kv_heads, d.head_dim, inv_freq.data(), kernels::RopeDirection::Forward, ctx.stream);
}

void rope_qkv_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                       const RopeFrequencies& freq, const Tensor& dqkv) {
  const QkvDims d = validate_rope_qkv(tensor_checks, "rope_qkv_backward", dqkv, positions, dq, dk, dv, kDqkvNames);
  const std::vector<float> inv_freq = rope_inv_freq<float>(freq, d.head_dim);
  kernels::rope_qkv(dqkv.dtype, dqkv.data, dq.data, dk.data, dv.data, positions.as<const int32_t>(), d.tokens, d.heads,
                    d.kv_heads, d.head_dim, inv_freq.data(), kernels::RopeDirection::Backward, ctx.stream);
}

}  // namespace shardtrain::ops::cuda
