// Argument checks and launches for RMSNorm and RoPE on the GPU, mirroring src/ops/cpu/rmsnorm.cpp and rope.cpp.
#include "context.hpp"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"

namespace shardtrain::ops::cuda {

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     const Tensor& h_out, const Tensor& y, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  require_float(x, op, "x");
  require_float(weight, op, "weight");
  require_float(y, op, "y");
  const int64_t rows = x.shape.rows(), d = x.shape.cols();
  require_numel(weight, d, op, "weight");
  require(y.dtype == x.dtype && y.numel() == x.numel(), op, "y is {}, expected like x {}", y.describe(), x.describe());
  if (residual.defined()) {
    require_float(residual, op, "residual");
    require(residual.dtype == x.dtype && residual.numel() == x.numel(), op, "residual is {}, expected like x {}",
            residual.describe(), x.describe());
    require(h_out.defined(), op, "h_out must be bound like x when a residual is given");
    require_float(h_out, op, "h_out");
    require(h_out.dtype == x.dtype && h_out.numel() == x.numel(), op, "h_out is {}, expected like x {}", h_out.describe(),
            x.describe());
  }
  require_f32_stats(rstd, rows, op, "rstd");
  kernels::rmsnorm_forward(x.dtype, x.data, residual.defined() ? residual.data : nullptr, weight.dtype, weight.data,
                           static_cast<float>(eps), rows, d, residual.defined() ? h_out.data : nullptr, y.data,
                           rstd.as<float>(), ctx.stream);
}

void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  require_float(h, op, "h");
  require_float(weight, op, "weight");
  require_float(dweight, op, "dweight");
  const int64_t rows = h.shape.rows(), d = h.shape.cols();
  require_numel(weight, d, op, "weight");
  require_numel(dweight, d, op, "dweight");
  const char* names[] = {"dy", "dh", "dh_extra"};
  const Tensor* tensors[] = {&dy, &dh, &dh_extra};
  for (int i = 0; i < 3; ++i) {
    if (tensors[i] == &dh_extra && !dh_extra.defined()) continue;
    require_float(*tensors[i], op, names[i]);
    require(tensors[i]->dtype == h.dtype && tensors[i]->numel() == h.numel(), op, "{} is {}, not shaped like h {}",
            names[i], tensors[i]->describe(), h.describe());
  }
  require_f32_stats(rstd, rows, op, "rstd");
  const size_t bytes = kernels::rmsnorm_backward_workspace_bytes(rows, d);
  void* ws = ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes));
  kernels::rmsnorm_backward(h.dtype, dy.data, h.data, weight.dtype, weight.data, rstd.as<const float>(),
                            dh_extra.defined() ? dh_extra.data : nullptr, dh.data, rows, d, dweight.dtype, dweight.data,
                            ws, bytes, ctx.stream);
}

void rope(Context& ctx, const Tensor& x, const Tensor& positions, double theta, RopeDirection direction) {
  const char* op = "rope";
  require_float(x, op, "x");
  require_i32(positions, op, "positions");
  require(x.shape.rank == 3, op, "x must be (tokens, heads, head_dim), got {}", x.shape.str());
  require(x.shape[2] % 2 == 0, op, "head_dim {} is odd", x.shape[2]);
  require_numel(positions, x.shape[0], op, "positions");
  kernels::rope(x.dtype, x.data, positions.as<const int32_t>(), x.shape[0], x.shape[1], x.shape[2],
                static_cast<float>(theta),
                direction == RopeDirection::Forward ? kernels::RopeDirection::Forward : kernels::RopeDirection::Backward,
                ctx.stream);
}

}  // namespace shardtrain::ops::cuda
