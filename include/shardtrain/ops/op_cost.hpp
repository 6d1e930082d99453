// What an op call costs in seconds on a device (the timing ops charge it, timing_ops.hpp): measured seconds per call
// from a profile (`bench ops --json`) where the profile has the call's key, an analytic estimate from the device's
// rates where it does not.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/ops/op_calls.hpp"

namespace shardtrain::ops {

class OpCostModel {
 public:
  virtual ~OpCostModel() = default;
  virtual double seconds(const OpCall& call) const = 0;
};

// Attention's rate measured at one shape: attention runs faster at longer sequences and larger head dims.
struct AttentionRate {
  int64_t head_dim = 0, seq = 0;
  double forward_flops_per_s = 0, backward_flops_per_s = 0;  // counted as OpCall counts them
};

// How fast a device runs each kind of work, counted as OpCall counts it (op_calls.hpp).
struct DeviceRates {
  std::string name;
  double matmul_flops_per_s = 0;              // GEMMs and the fused lm_head + loss
  double memory_bytes_per_s = 0;              // bytes read + written
  double attention_forward_flops_per_s = 0;   // forward counted 2 B H S^2 Dh
  double attention_backward_flops_per_s = 0;  // backward counted twice the forward (not FlashAttention's 2.5x)
  double kernel_overhead_s = 0;               // what the smallest kernel takes beyond its work
  // The fused lm_head + loss (linear_cross_entropy), counted 2 N D V (+4 N D V with the gradient): its chunked
  // logits, softmax and fp32 gradients run well below the GEMM ceiling. 0: the matmul rate.
  double loss_flops_per_s = 0;
  // Attention measured at these shapes: a call takes the rate of the point with its head dim and the nearest
  // sequence length (in log scale); a head dim no point has takes the rates above.
  std::vector<AttentionRate> attention_points;
  // The runtime's own memory-bound kernels, which no op call prices: the fused AdamW (28 bytes an element), the
  // gradient norm's sums of squares and device-to-device copies, at the fused AdamW's measured rate (bytes read +
  // written). 0: the timing device's default (timing::HostCosts::memory_bytes_per_s).
  double update_bytes_per_s = 0;
};

// The built-in rates by name ("h100-sxm", "h200"); UsageError naming the known ones for another name.
DeviceRates device_rates(std::string_view name);
std::vector<std::string> device_rates_names();

// kernel_overhead_s + max(flops / rate, bytes / memory_bytes_per_s); rate: the attention rates for
// attention_forward and attention_backward, the loss rate for linear_cross_entropy, the matmul rate for every other
// op with FLOPs.
double analytic_seconds(const OpCall& call, const DeviceRates& rates);

// A GEMM a profile measured: how its measured time compares with the analytic estimate at that profile's rates.
// Small GEMMs (short K, few output tiles) fall well short of the ceiling the rates take: at the seed's shape the
// profile's run at 45 to 97 % of it.
struct GemmPoint {
  std::string key;  // the profile's key; for a row without keys, its name and shapes ("q_proj fwd: x (...) W^T (...)")
  GemmKey gemm;
  double scale = 1;  // measured seconds / analytic seconds at the profile's rates
};

// Seconds per call from a table of keys (a profile's), the analytic estimate at `fallback` for the keys it lacks.
// Counts which calls came from where (the counts, not the costs, change under a const call; safe across threads).
class TableCostModel final : public OpCostModel {
 public:
  // ConfigError when a rate is not positive or the overhead negative (naming the rates' name and the field), or a
  // table entry is negative or not finite.
  TableCostModel(std::map<std::string, double> seconds_per_call, DeviceRates fallback);

  struct Lookup {
    double seconds = 0;
    bool from_table = false;
  };
  Lookup lookup(const OpCall& call) const;  // counted
  double seconds(const OpCall& call) const override { return lookup(call).seconds; }

  struct Miss {
    int64_t calls = 0;
    double seconds_per_call = 0;  // the analytic estimate (x a scale: the op's, or the nearest GEMM point's)
    std::string like;             // the GEMM point whose scale priced it; empty: none
  };
  int64_t hits() const;
  int64_t misses() const;
  std::map<std::string, Miss> missed() const;  // by key
  std::map<std::string, int64_t> hit() const;  // calls by key
  void reset_counts();

  // A memory-bound call (no FLOPs) the table lacks costs its analytic time x the scale of its op's name, when
  // given: how far that kernel fell short of the copy ceiling where it was measured (a profile's, op_profile.hpp).
  void set_memory_bound_scale(std::map<std::string, double> scale) { memory_bound_scale_ = std::move(scale); }
  // A GEMM the table lacks costs its analytic time x the scale of the nearest point of the same form (the least sum
  // of |log| ratios of M, N and K) among the points within 2x of it in each dim and the points at least as large in
  // each; else the analytic time at the rates' ceiling.
  // - Within 2x, a GEMM keeps about the tiles and the share of the ceiling of its neighbour.
  // - A GEMM's share of the ceiling grows with each dim (more tiles to fill the SMs, a longer K to hide each tile's
  //   start and end), so a larger GEMM's share bounds a smaller one's from above: nearer than the ceiling.
  // - A GEMM larger than every point (a larger model than the profile's) takes the ceiling: a smaller GEMM's share
  //   would bound it from below, and the ceiling is the nearer guess there.
  void set_gemm_points(std::vector<GemmPoint> points) { gemm_points_ = std::move(points); }
  // Every call the table has costs its seconds x `scale`: op times measured where a rank had a core to itself,
  // priced for ranks that share the cores (the CPU backend with more ranks than cores). 1 by default.
  void set_table_scale(double scale) { table_scale_ = scale; }

  const std::map<std::string, double>& table() const { return table_; }
  const DeviceRates& fallback() const { return fallback_; }

 private:
  std::map<std::string, double> table_;
  DeviceRates fallback_;
  std::map<std::string, double> memory_bound_scale_;
  std::vector<GemmPoint> gemm_points_;
  double table_scale_ = 1;
  mutable std::mutex mutex_;
  mutable std::map<std::string, int64_t> hits_;
  mutable std::map<std::string, Miss> missed_;
};

}  // namespace shardtrain::ops
