// Typed host tensors for op and kernel tests (f32, bf16, f64, i32 storage behind one get/set in double), the
// batches and targets their attention and loss cases use, and the comparisons both the GPU op test and the
// emulated kernel test make: elementwise within a relative plus absolute tolerance, and bitwise equality
// (determinism).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/ops/rope.hpp"
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
  template <typename T>
  T* as_ptr() {
    return reinterpret_cast<T*>(bytes.data());
  }
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

// Normal values (mean 0) stored in dtype d; uniform integers in [lo, hi).
inline HostT random_normal(std::mt19937_64& rng, Shape s, DType d, double scale = 1.0) {
  HostT t(s, d);
  std::normal_distribution<double> dist(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}
inline HostT random_ints(std::mt19937_64& rng, Shape s, int32_t lo, int32_t hi) {
  HostT t(s, DType::I32);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
  return t;
}

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

// Document ids with random boundaries (nondecreasing per row) and input ids with a few pad tokens.
inline void make_batch(std::mt19937_64& rng, int64_t b, int64_t s, HostT& ids, HostT& docs) {
  ids = HostT({b, s}, DType::I32);
  docs = HostT({b, s}, DType::I32);
  std::uniform_int_distribution<int32_t> tok(0, 49);
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t r = 0; r < b; ++r) {
    int32_t doc = static_cast<int32_t>(r * 3);
    for (int64_t t = 0; t < s; ++t) {
      if (t > 0 && u(rng) < 0.08) ++doc;
      docs.set(r * s + t, doc);
      ids.set(r * s + t, u(rng) < 0.1 ? 7 : tok(rng));
    }
  }
}

// Targets for the loss tests: every fifth (from index 3) ignore_index, the first one the last class.
inline HostT loss_targets(std::mt19937_64& rng, int64_t n, int64_t vocab, int32_t ignore_index) {
  HostT t({n}, DType::I32);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  for (int64_t i = 0; i < n; ++i) t.set(i, i % 5 == 3 ? ignore_index : dist(rng));
  t.set(0, static_cast<double>(vocab - 1));
  return t;
}

// RoPE frequencies the op tests run: two bases, and Llama 3.1's scaling with an original context of 64 positions,
// so that at head dims 24 and 64 some pairs keep their frequency, some are divided by the factor and some are
// blended (wavelengths below 16, above 64 and between).
inline std::vector<std::pair<std::string, RopeFrequencies>> rope_cases() {
  RopeFrequencies llama3{.theta = 500000.0,
                         .scaling = RopeScaling::Llama3,
                         .factor = 8.0,
                         .low_freq_factor = 1.0,
                         .high_freq_factor = 4.0,
                         .original_max_position = 64.0};
  return {{"theta=1e4", RopeFrequencies{.theta = 10000.0}},
          {"theta=5e5", RopeFrequencies{.theta = 500000.0}},
          {"theta=5e5 llama3", llama3}};
}

// The packed (N, (H + 2 Hkv) Dh) q/k/v projection and its three parts (N, H, Dh), (N, Hkv, Dh), (N, Hkv, Dh), moved
// element by element (no arithmetic): the references for rope_qkv_forward and _backward.
struct QkvParts {
  HostT q, k, v;
};
inline QkvParts split_qkv(const HostT& packed, int64_t heads, int64_t kv_heads, int64_t dh) {
  const int64_t n = packed.shape[0], width = (heads + 2 * kv_heads) * dh;
  QkvParts p{HostT({n, heads, dh}, packed.dtype), HostT({n, kv_heads, dh}, packed.dtype),
             HostT({n, kv_heads, dh}, packed.dtype)};
  const size_t e = dtype_size(packed.dtype);
  for (int64_t t = 0; t < n; ++t) {
    const char* row = packed.bytes.data() + static_cast<size_t>(t * width) * e;
    std::copy(row, row + heads * dh * e, p.q.bytes.data() + static_cast<size_t>(t * heads * dh) * e);
    std::copy(row + heads * dh * e, row + (heads + kv_heads) * dh * e,
              p.k.bytes.data() + static_cast<size_t>(t * kv_heads * dh) * e);
    std::copy(row + (heads + kv_heads) * dh * e, row + width * e,
              p.v.bytes.data() + static_cast<size_t>(t * kv_heads * dh) * e);
  }
  return p;
}
inline HostT pack_qkv(const QkvParts& p) {
  const int64_t n = p.q.shape[0], heads = p.q.shape[1], kv_heads = p.k.shape[1], dh = p.q.shape[2];
  const int64_t width = (heads + 2 * kv_heads) * dh;
  HostT packed({n, width}, p.q.dtype);
  const size_t e = dtype_size(p.q.dtype);
  for (int64_t t = 0; t < n; ++t) {
    char* row = packed.bytes.data() + static_cast<size_t>(t * width) * e;
    const auto part = [&](const HostT& x, int64_t h) { return x.bytes.data() + static_cast<size_t>(t * h * dh) * e; };
    std::copy(part(p.q, heads), part(p.q, heads) + heads * dh * e, row);
    std::copy(part(p.k, kv_heads), part(p.k, kv_heads) + kv_heads * dh * e, row + heads * dh * e);
    std::copy(part(p.v, kv_heads), part(p.v, kv_heads) + kv_heads * dh * e, row + (heads + kv_heads) * dh * e);
  }
  return packed;
}

// SwiGLU's gate and up (N, F each) as one tensor in either layout (ops.hpp, GateUpLayout).
inline HostT gate_up_tensor(const HostT& gate, const HostT& up, bool rows) {
  const int64_t n = gate.shape[0], f = gate.shape[1];
  HostT gu(rows ? Shape{n, 2 * f} : Shape{2, n, f}, gate.dtype);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < f; ++c) {
      gu.set(rows ? r * 2 * f + c : r * f + c, gate.get(r * f + c));
      gu.set(rows ? r * 2 * f + f + c : n * f + r * f + c, up.get(r * f + c));
    }
  }
  return gu;
}

}  // namespace shardtrain::ops::test
