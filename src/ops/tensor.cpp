// Shape and view helpers.
#include "shardtrain/ops/tensor.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {

Shape::Shape(std::initializer_list<int64_t> d) {
  if (d.size() > kMaxDims) throw InternalError(fmt::format("Shape: {} dims, at most {} supported", d.size(), kMaxDims));
  for (int64_t v : d) dims[static_cast<size_t>(rank++)] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < rank; ++i) s += fmt::format("{}{}", i ? ", " : "", dims[static_cast<size_t>(i)]);
  return s + ")";
}

Tensor Tensor::reshaped(Shape s) const {
  if (s.numel() != numel())
    throw InternalError(fmt::format("reshape {} to {}: element counts differ", shape.str(), s.str()));
  Tensor t = *this;
  t.shape = s;
  return t;
}

Tensor Tensor::row_slice(int64_t first, int64_t count) const {
  const int64_t rows = shape.rows(), cols = shape.cols();
  if (first < 0 || count < 0 || first + count > rows)
    throw InternalError(fmt::format("row_slice [{}, {}) of {} rows", first, first + count, rows));
  Tensor t = *this;
  t.data = static_cast<char*>(data) + static_cast<size_t>(first * cols) * dtype_size(dtype);
  t.shape = Shape{count, cols};
  return t;
}

std::string Tensor::describe() const {
  return fmt::format("{} {} {}", dtype_name(dtype), shape.str(), device == DeviceKind::Cpu ? "cpu" : "cuda");
}

}  // namespace shardtrain::ops
