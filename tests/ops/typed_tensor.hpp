// Typed host tensors for op and kernel tests (f32, bf16, f64, i32 storage behind one get/set in double),
// and the comparisons both the GPU op test and the emulated kernel test make: elementwise within a relative
// plus absolute tolerance, and bitwise equality (determinism).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "shardtrain/ops/tensor.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::ops::test {

// An owning host tensor of any dtype.
struct HostT {
  std::vector<char> bytes;
  DType dtype = DType::F32;
  Shape shape;
  HostT() = default;
  HostT(Shape s, DType d) : bytes(static_cast<size_t>(s.numel()) * dtype_size(d)), dtype(d), shape(s) {}
  int64_t numel() const { return shape.numel(); }
  Tensor view() { return make_tensor(bytes.data(), dtype, shape); }
  void* ptr() { return bytes.data(); }
  const void* ptr() const { return bytes.data(); }
  template <typename T> T* as_ptr() { return reinterpret_cast<T*>(bytes.data()); }
  double get(int64_t i) const {
    const char* p = bytes.data();
    switch (dtype) {
      case DType::F32: return reinterpret_cast<const float*>(p)[i];
      case DType::BF16: return static_cast<float>(reinterpret_cast<const bf16*>(p)[i]);
      case DType::F64: return reinterpret_cast<const double*>(p)[i];
      case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
      default: return 0;
    }
  }
  void set(int64_t i, double v) {
    char* p = bytes.data();
    switch (dtype) {
      case DType::F32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
      case DType::BF16: reinterpret_cast<bf16*>(p)[i] = bf16(static_cast<float>(v)); break;
      case DType::F64: reinterpret_cast<double*>(p)[i] = v; break;
      case DType::I32: reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
      default: break;
    }
  }
  HostT as(DType d) const {  // a copy in another dtype
    HostT t(shape, d);
    for (int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
    return t;
  }
};

struct Tol {
  double rel;
  double abs_frac;  // absolute tolerance as a fraction of the largest |expected|
};
inline Tol tol_for(DType d) { return d == DType::BF16 ? Tol{1e-2, 1e-2} : Tol{1e-5, 1e-5}; }

// Every element within abs + rel * |want| (infinities must match exactly); on failure, the worst element.
inline void expect_close(const std::string& what, const HostT& got, const HostT& want, Tol tol) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double maxabs = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (std::isfinite(want.get(i))) maxabs = std::max(maxabs, std::abs(want.get(i)));
  const double abs_tol = tol.abs_frac * maxabs;
  int64_t bad = 0, worst_i = -1;
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    double ratio;
    if (!std::isfinite(w) || !std::isfinite(g)) ratio = (g == w) ? 0 : std::numeric_limits<double>::infinity();
    else ratio = std::abs(g - w) / (abs_tol + tol.rel * std::abs(w) + 1e-300);
    if (ratio > 1) ++bad;
    if (ratio > worst || worst_i < 0) worst = ratio, worst_i = i;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.numel() << " elements outside tolerance (rel " << tol.rel
                    << ", abs " << abs_tol << "); worst at " << worst_i << ": got " << got.get(worst_i) << ", want "
                    << want.get(worst_i);
}

inline void expect_bitwise_equal(const std::string& what, const HostT& a, const HostT& b) {
  EXPECT_TRUE(a.bytes == b.bytes) << what << ": two runs differ";
}

}  // namespace shardtrain::ops::test
