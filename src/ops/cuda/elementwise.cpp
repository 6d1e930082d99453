// Argument checks and launches for the element-wise op families on the GPU: fill, copy, add, embedding,
// SwiGLU and the sum of squares. Checks mirror the CPU backend's (src/ops/cpu/elementwise.cpp).
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
  require_float(src, "copy", "src");
  require_float(dst, "copy", "dst");
  require_numel(dst, src.numel(), "copy", "dst");
  kernels::elementwise_copy(src.dtype, src.data, dst.dtype, dst.data, src.numel(), ctx.stream);
}

void add(Context& ctx, const Tensor& x, const Tensor& y) {
  require_float(x, "add", "x");
  require_float(y, "add", "y");
  require_numel(y, x.numel(), "add", "y");
  kernels::elementwise_add(x.dtype, x.data, y.dtype, y.data, x.numel(), ctx.stream);
}

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out) {
  const char* op = "embedding_forward";
  require_i32(ids, op, "ids");
  require_float(table, op, "table");
  require_float(out, op, "out");
  const int64_t n = ids.numel(), vocab = table.shape.rows(), d = table.shape.cols();
  require(out.numel() == n * d && out.shape.cols() == d, op, "out is {}, expected ({}, {})", out.shape.str(), n, d);
  kernels::embedding_forward(ids.as<const int32_t>(), n, table.dtype, table.data, vocab, d, out.dtype, out.data,
                             ctx.error_record(), ctx.stream);
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const char* op = "embedding_backward";
  require_i32(ids, op, "ids");
  require_float(dout, op, "dout");
  require_float(dtable, op, "dtable");
  const int64_t n = ids.numel(), vocab = dtable.shape.rows(), d = dtable.shape.cols();
  require(dout.numel() == n * d, op, "dout is {}, expected ({}, {})", dout.shape.str(), n, d);
  if (n == 0) return;
  const size_t bytes = kernels::embedding_backward_workspace_bytes(n, vocab);
  void* ws = ctx.scratch_for<char>(Slot::OpWorkspace, static_cast<int64_t>(bytes));
  kernels::embedding_backward(ids.as<const int32_t>(), n, dout.dtype, dout.data, d, dtable.dtype, dtable.data, vocab, ws,
                              bytes, ctx.error_record(), ctx.stream);
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& out) {
  const char* op = "swiglu_forward";
  require_float(gate, op, "gate");
  require_float(up, op, "up");
  require_float(out, op, "out");
  require(up.dtype == gate.dtype && out.dtype == gate.dtype, op, "gate, up and out must share a dtype");
  require_numel(up, gate.numel(), op, "up");
  require_numel(out, gate.numel(), op, "out");
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
