// Measures the fp32 GEMM rate of this machine (see measure_cpu_sgemm in cpu_ops.hpp).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels.hpp"
#include "shardtrain/ops/cpu_ops.hpp"

namespace shardtrain::ops {
namespace {

template <typename F>
double median_gflops(double flops, int repeats, double& best, F&& run) {
  run();  // warm-up: page faults, OpenBLAS buffers
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(flops / s * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  best = std::max(best, rates.back());
  return rates[rates.size() / 2];
}

}  // namespace

SgemmRate measure_cpu_sgemm(int threads, int64_t n, int repeats) {
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 13) * 0.01f;
    b[i] = static_cast<float>(i % 7) * 0.02f;
  }
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const auto bn = static_cast<blasint>(n);
  SgemmRate rate;
  openblas_set_num_threads(threads);
  rate.openblas_gflops = median_gflops(flops, repeats, rate.best_gflops, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, bn, bn, 1.0f, a.data(), bn, b.data(), bn, 0.0f, c.data(), bn);
  });
  openblas_set_num_threads(1);
  rate.backend_gflops = median_gflops(flops, repeats, rate.best_gflops, [&] {
    cpu::gemm_raw<float>(threads, Transpose::No, Transpose::Yes, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  return rate;
}

}  // namespace shardtrain::ops
