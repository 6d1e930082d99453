// Argument checks and launches for the element-wise op families on the GPU: fill, copy, add, embedding,
// SwiGLU and the sum of squares. Checks are the CPU backend's (src/ops/cpu/elementwise.cpp), shared through
// ../validate.hpp where the messages agree.
#include "context.hpp"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/sum_squares.cuh"
#include "kernels/swiglu.cuh"

namespace shardtrain::ops::cuda {

void fill(Context& ctx, const Tensor& out, double value) {
  require_float(out, "fill", "out");
  kernels::elementwise_fill(out.dtype, out.data, out.numel(), static_cast<float>(value), ctx.stream);
}

void copy(Context& ctx, const Tensor& src, const Tensor& dst) {
  validate_copy(tensor_checks, src, dst);
  kernels::elementwise_copy(src.dtype, src.data, dst.dtype, dst.data, src.numel(), ctx.stream);
}

void add(Context& ctx, const Tensor& x, const Tensor& y) {
  validate_add(tensor_checks, x, y);
  kernels::elementwise_add(x.dtype, x.data, y.dtype, y.data, x.numel(), ctx.stream);
}

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out) {
  const auto [n, vocab, d] = validate_embedding_forward(tensor_checks, ids, table, out);
  kernels::embedding_forward(ids.as<const int32_t>(), n, table.dtype, table.data, vocab, d, out.dtype, out.data,
                             ctx.error_record(), ctx.stream);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const auto [n, vocab, d] = validate_embedding_backward(tensor_checks, ids, dout, dtable);
  if (n == 0) return;
  const size_t bytes = kernels::embedding_backward_workspace_bytes(n, vocab, d);
  void* ws = ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes));
  kernels::embedding_backward(ids.as<const int32_t>(), n, dout.dtype, dout.data, d, dtable.dtype, dtable.data, vocab, ws,
                              bytes, ctx.error_record(), ctx.stream);
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& out) {
  validate_swiglu_forward(tensor_checks, gate, up, out);
  kernels::swiglu_forward(gate.dtype, gate.data, up.data, out.data, gate.numel(), ctx.stream);
}

void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  const char* op = "swiglu_backward";
  require_float(gate, op, "gate");
  const char* names[] = {"dout", "up", "dgate", "dup"};
  const Tensor* tensors[] = {&dout, &up, &dgate, &dup};
  for (int i = 0; i < 4; ++i) {
    require_float(*tensors[i], op, names[i]);
    require(tensors[i]->dtype == gate.dtype, op, "{} must share the dtype of gate ({})", names[i], dtype_name(gate.dtype));
    require_numel(*tensors[i], gate.numel(), op, names[i]);
  }
  kernels::swiglu_backward(gate.dtype, dout.data, gate.data, up.data, dgate.data, dup.data, gate.numel(), ctx.stream);
}

void sum_squares(Context& ctx, const Tensor& x, const Tensor& out, SumInto mode) {
  const char* op = "sum_squares";
  require_float(x, op, "x");
  require_device(out, op, "out");
  require(out.dtype == DType::F64 && out.numel() == 1, op, "out is {}, expected one f64 element", out.describe());
  const size_t bytes = kernels::sum_squares_workspace_bytes();
  void* ws = ctx.scratch_for<char>(Slot::SumPartials, static_cast<int64_t>(bytes));
  kernels::sum_squares(x.dtype, x.data, x.numel(), out.as<double>(),
                       mode == SumInto::Accumulate ? kernels::ReduceInto::Accumulate : kernels::ReduceInto::Overwrite, ws,
                       bytes, ctx.stream);
}

}  // namespace shardtrain::ops::cuda
