// A non-owning tensor view: pointer, element type, device and a row-major shape of up to 4 dims.
// Ops take views; whoever calls them owns the memory (the model's activation arena, the FSDP engine's
// flat buffers, DenseParams). Views are always contiguous.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::ops {

inline constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  // Rows x last dim: every dimension but the last, folded (a (B, S, D) tensor is (B*S) x D).
  int64_t rows() const { return rank == 0 ? 1 : numel() / dims[static_cast<size_t>(rank - 1)]; }
  int64_t cols() const { return rank == 0 ? 1 : dims[static_cast<size_t>(rank - 1)]; }
  friend bool operator==(const Shape& a, const Shape& b);
  std::string str() const;  // "(4, 256, 64)"
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  DeviceKind device = DeviceKind::Cpu;
  Shape shape;

  bool defined() const { return data != nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // The same memory seen with another shape of the same element count.
  Tensor reshaped(Shape s) const;
  // Rows [first, first + count) of the (rows x cols) view.
  Tensor row_slice(int64_t first, int64_t count) const;
  std::string describe() const;  // "f32 (4, 256) cpu"
};

inline Tensor make_tensor(void* data, DType dtype, Shape shape, DeviceKind device = DeviceKind::Cpu) {
  return Tensor{data, dtype, device, shape};
}

}  // namespace shardtrain::ops
