// Op costs: the built-in device rates (each number's source beside it), the analytic estimate, and the table model.
#include "shardtrain/ops/op_cost.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {
namespace {

// H200 (141 GB HBM3e), measured in this repository on one H200 (bf16, CUDA 13):
//   matmul: the ceiling of `bench ops`, a bf16 8192^3 GEMM, docs/gpu-runs/2026-11-25-h200/ops.json
//     (ceilings.matmul_flops_per_s = 806.06e12);
//   memory: the same file's copy ceiling, a 1 GiB copy read + written (ceilings.copy_bytes_per_s = 4.232e12);
//   attention: cuDNN's fused flash attention at B 1 S 8192 H 32/8 Dh 128 causal, the fast backward,
//     docs/gpu-runs/2026-11-27-h200/1aeba62/attention.md: forward 876 us = 627.2 TFLOP/s; backward 2.58 ms, which
//     that table counts 2.5x the forward (533.2 TFLOP/s) and OpCall counts 2x: 533.2 * 2 / 2.5 = 426.6e12;
//   kernel overhead: the (32768, 768) bf16 copy row of the 2026-11-25 ops.json, 28.0 us against 23.8 us at the
//     copy ceiling: about 4 us;
//   the fused lm_head + loss: its fwd+bwd row at the seed's shape, profiles/h200/seed-b64-s512.json (2026-11-26,
//     cece5a0): 7.55 TFLOP in 15.0 ms = 503 TFLOP/s, 62 % of the GEMM ceiling; the same kernels at every vocabulary.
constexpr double kH200MatmulFlops = 806.06e12;
constexpr double kH200MemoryBytes = 4.232e12;
constexpr double kH200AttentionForwardFlops = 627.2e12;
constexpr double kH200AttentionBackwardFlops = 533.2e12 * 2.0 / 2.5;
constexpr double kH200KernelOverhead = 4e-6;
constexpr double kH200LossFlops = 503.0e12;
//   the fused AdamW: one launch over the seed's 179,448,576 parameters (28 bytes each, 5.02 GB) took 1.2515 ms in
//     the step, docs/gpu-runs/2026-11-26-h200/cece5a0/profile.md: 4.01 TB/s, 95 % of the copy ceiling.
constexpr double kH200UpdateBytes = 179448576.0 * 28.0 / 1.2515e-3;
// cuDNN's fused attention, the fast backward, at the three shapes of docs/performance.md (1aeba62/attention.md,
// 2026-11-27): seed (Dh 64, S 512) 253.6 / 151.4, 1B (Dh 64, S 2048) 397.5 / 315.6, 8B (Dh 128, S 8192) 627.2 /
// 533.2 TFLOP/s, each backward counted 2.5x the forward there and 2x here.
std::vector<AttentionRate> h200_attention_points() {
  constexpr double kBackward = 2.0 / 2.5;
  return {{64, 512, 253.6e12, 151.4e12 * kBackward},
          {64, 2048, 397.5e12, 315.6e12 * kBackward},
          {128, 8192, 627.2e12, 533.2e12 * kBackward}};
}
// H100 SXM (80 GB HBM3): the same GH100 chip with the same 132 SMs and boost clock as the H200, so every compute
// rate is the H200's; memory-bound work scaled by the datasheets' bandwidths, 3.35 TB/s against the H200's 4.8.
constexpr double kH100MemoryBytes = kH200MemoryBytes * 3.35 / 4.8;

DeviceRates h200_rates() {
  return {"h200",
          kH200MatmulFlops,
          kH200MemoryBytes,
          kH200AttentionForwardFlops,
          kH200AttentionBackwardFlops,
          kH200KernelOverhead,
          kH200LossFlops,
          h200_attention_points(),
          kH200UpdateBytes};
}
DeviceRates h100_sxm_rates() {
  return {"h100-sxm",
          kH200MatmulFlops,
          kH100MemoryBytes,
          kH200AttentionForwardFlops,
          kH200AttentionBackwardFlops,
          kH200KernelOverhead,
          kH200LossFlops,
          h200_attention_points(),
          kH200UpdateBytes * 3.35 / 4.8};
}

void check_rates(const DeviceRates& r) {
  auto positive = [&](double v, const char* field) {
    if (!(v > 0) || !std::isfinite(v))
      throw ConfigError(fmt::format("device rates '{}': {} = {}: expected a positive number", r.name, field, v));
  };
  positive(r.matmul_flops_per_s, "matmul_flops_per_s");
  positive(r.memory_bytes_per_s, "memory_bytes_per_s");
  positive(r.attention_forward_flops_per_s, "attention_forward_flops_per_s");
  positive(r.attention_backward_flops_per_s, "attention_backward_flops_per_s");
  if (!(r.kernel_overhead_s >= 0) || !std::isfinite(r.kernel_overhead_s))
    throw ConfigError(
        fmt::format("device rates '{}': kernel_overhead_s = {}: expected 0 or more", r.name, r.kernel_overhead_s));
}

}  // namespace

std::vector<std::string> device_rates_names() { return {"h100-sxm", "h200"}; }

DeviceRates device_rates(std::string_view name) {
  if (name == "h200") return h200_rates();
  if (name == "h100-sxm") return h100_sxm_rates();
  throw UsageError(fmt::format("device rates '{}': expected one of {}", name, fmt::join(device_rates_names(), ", ")));
}

namespace {
const AttentionRate* nearest_attention_point(const DeviceRates& rates, const AttentionShape& s) {
  const AttentionRate* best = nullptr;
  double best_distance = 0;
  for (const AttentionRate& p : rates.attention_points) {
    if (p.head_dim != s.head_dim || p.seq <= 0 || s.seq <= 0) continue;
    const double d = std::abs(std::log(static_cast<double>(p.seq) / static_cast<double>(s.seq)));
    if (!best || d < best_distance) best = &p, best_distance = d;
  }
  return best;
}
}  // namespace

double analytic_seconds(const OpCall& call, const DeviceRates& rates) {
  double compute = 0;
  if (call.flops > 0) {
    const bool loss = call.name == "linear_cross_entropy" && rates.loss_flops_per_s > 0;
    const bool forward = call.name == "attention_forward", backward = call.name == "attention_backward";
    const AttentionRate* point = forward || backward ? nearest_attention_point(rates, call.attention) : nullptr;
    const double rate = point && forward ? point->forward_flops_per_s
                        : point          ? point->backward_flops_per_s
                        : forward        ? rates.attention_forward_flops_per_s
                        : backward       ? rates.attention_backward_flops_per_s
                        : loss           ? rates.loss_flops_per_s
                                         : rates.matmul_flops_per_s;
    compute = call.flops / rate;
  }
  return rates.kernel_overhead_s + std::max(compute, call.bytes / rates.memory_bytes_per_s);
}

TableCostModel::TableCostModel(std::map<std::string, double> seconds_per_call, DeviceRates fallback)
    : table_(std::move(seconds_per_call)), fallback_(std::move(fallback)) {
  check_rates(fallback_);
  for (const auto& [key, s] : table_)
    if (!(s >= 0) || !std::isfinite(s))
      throw ConfigError(fmt::format("op cost table: '{}': {} seconds per call: expected 0 or more", key, s));
}

namespace {
// The point of `g`'s form nearest to it (the least sum of |log| ratios of M, N and K) among those within 2x of it in
// each dim and those at least as large in each; nullptr when there is none.
const GemmPoint* nearest_gemm_point(const std::vector<GemmPoint>& points, const GemmKey& g) {
  const double limit = std::log(2.0) + 1e-9;
  const GemmPoint* best = nullptr;
  double best_distance = 0;
  for (const GemmPoint& p : points) {
    if (p.gemm.form != g.form) continue;
    double distance = 0;
    bool near = true, larger = true;
    for (auto [point, call] : {std::pair{p.gemm.m, g.m}, std::pair{p.gemm.n, g.n}, std::pair{p.gemm.k, g.k}}) {
      const double d = std::log(static_cast<double>(point) / static_cast<double>(call));
      near = near && std::abs(d) <= limit;
      larger = larger && d >= 0;
      distance += std::abs(d);
    }
    if ((near || larger) && (!best || distance < best_distance)) best = &p, best_distance = distance;
  }
  return best;
}
}  // namespace

TableCostModel::Lookup TableCostModel::lookup(const OpCall& call) const {
  const auto it = table_.find(call.key);
  std::lock_guard<std::mutex> lock(mutex_);
  if (it != table_.end()) {
    ++hits_[call.key];
    return {it->second * table_scale_, true};
  }
  Miss& m = missed_[call.key];
  if (m.calls++ == 0) {
    m.seconds_per_call = analytic_seconds(call, fallback_);
    const auto scale = memory_bound_scale_.find(call.name);
    if (call.flops == 0 && scale != memory_bound_scale_.end()) m.seconds_per_call *= scale->second;
    const std::optional<GemmKey> gemm = call.flops > 0 ? parse_gemm_key(call.key) : std::nullopt;
    if (const GemmPoint* p = gemm ? nearest_gemm_point(gemm_points_, *gemm) : nullptr) {
      m.seconds_per_call *= p->scale;
      m.like = p->key;
    }
  }
  return {m.seconds_per_call, false};
}

int64_t TableCostModel::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, calls] : hits_) n += calls;
  return n;
}

std::map<std::string, int64_t> TableCostModel::hit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

int64_t TableCostModel::misses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [key, m] : missed_) n += m.calls;
  return n;
}

std::map<std::string, TableCostModel::Miss> TableCostModel::missed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return missed_;
}

void TableCostModel::reset_counts() {
  std::lock_guard<std::mutex> lock(mutex_);
  hits_.clear();
  missed_.clear();
}

}  // namespace shardtrain::ops
