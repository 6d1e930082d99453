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

namespace {

// gate_up's rows as the kernels walk them (kernels/swiglu.cuh): Rows is N rows of F, 2F apart, up F after gate;
// Halves is one row of N F, up N F after gate.
struct GateUpRows {
  int64_t rows, cols, stride, up_offset;
  GateUpRows(int64_t n, int64_t f, GateUpLayout layout)
      : rows(layout == GateUpLayout::Rows ? n : 1),
        cols(layout == GateUpLayout::Rows ? f : n * f),
        stride(layout == GateUpLayout::Rows ? 2 * f : n * f),
        up_offset(layout == GateUpLayout::Rows ? f : n * f) {}
};

const void* elements_after(const Tensor& t, int64_t n) {
  return static_cast<const char*>(t.data) + n * static_cast<int64_t>(dtype_size(t.dtype));
}
void* elements_after(void* p, DType dtype, int64_t n) {
  return static_cast<char*>(p) + n * static_cast<int64_t>(dtype_size(dtype));
}

}  // namespace

void swiglu_forward(Context& ctx, const Tensor& gate_up, GateUpLayout layout, const Tensor& out) {
  const auto [n, f] = validate_swiglu(tensor_checks, "swiglu_forward", gate_up, layout, out, "out", Tensor{});
  const GateUpRows r(n, f, layout);
  kernels::swiglu_forward(gate_up.dtype, gate_up.data, elements_after(gate_up, r.up_offset), r.stride, out.data, r.rows,
                          r.cols, ctx.stream);
}

void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up, GateUpLayout layout, const Tensor& dgate_up) {
  const auto [n, f] = validate_swiglu(tensor_checks, "swiglu_backward", gate_up, layout, dout, "dout", dgate_up);
  const GateUpRows r(n, f, layout);
  kernels::swiglu_backward(gate_up.dtype, dout.data, gate_up.data, elements_after(gate_up, r.up_offset), r.stride,
                           dgate_up.data, elements_after(dgate_up.data, dgate_up.dtype, r.up_offset), r.rows, r.cols,
                           ctx.stream);
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
