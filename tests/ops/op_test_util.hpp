// Helpers for op tests: f64 host tensors, random data, and a central finite-difference checker.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops::test {

// An owning f64 host tensor.
struct HostTensor {
  std::vector<double> data;
  Shape shape;
  HostTensor() = default;
  explicit HostTensor(Shape s) : data(static_cast<size_t>(s.numel())), shape(s) {}
  Tensor view() { return make_tensor(data.data(), DType::F64, shape); }
  double& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  int64_t numel() const { return shape.numel(); }
};

struct IntTensor {
  std::vector<int32_t> data;
  Shape shape;
  explicit IntTensor(Shape s, int32_t v = 0) : data(static_cast<size_t>(s.numel()), v), shape(s) {}
  Tensor view() { return make_tensor(data.data(), DType::I32, shape); }
  int32_t& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
};

inline HostTensor random_tensor(Shape s, std::mt19937_64& rng, double scale = 1.0) {
  HostTensor t(s);
  std::normal_distribution<double> dist(0.0, scale);
  for (double& v : t.data) v = dist(rng);
  return t;
}

inline double dot(const HostTensor& a, const HostTensor& b) {
  double s = 0;
  for (size_t i = 0; i < a.data.size(); ++i) s += a.data[i] * b.data[i];
  return s;
}

// Compares analytic[i] with the central difference of loss() with respect to x[i], for up to max_checks
// elements spread over x. loss() must read x's current contents.
inline void expect_gradient(const char* what, HostTensor& x, const HostTensor& analytic, const std::function<double()>& loss,
                            int max_checks = 80, double eps = 1e-5, double tol = 1e-6) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  const int64_t n = x.numel();
  const int64_t stride = std::max<int64_t>(1, n / max_checks);
  double worst = 0;
  int64_t worst_i = -1;
  double worst_a = 0, worst_fd = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2 * eps);
    const double a = analytic.data[static_cast<size_t>(i)];
    const double err = std::abs(a - fd) / std::max(1.0, std::abs(fd));
    if (err > worst) {
      worst = err;
      worst_i = i;
      worst_a = a;
      worst_fd = fd;
    }
  }
  EXPECT_LT(worst, tol) << what << ": worst element " << worst_i << " analytic " << worst_a << " finite difference "
                        << worst_fd;
}

inline std::unique_ptr<Ops> cpu_ops(int threads = 1) { return make_cpu_ops(CpuOpsOptions{threads}); }

}  // namespace shardtrain::ops::test
