// AdamW on flat fp32 shards (PyTorch's torch.optim.AdamW update, decoupled weight decay), and the
// global L2 gradient norm with clipping. Works on host shards (CPU backend, CPU offload) with all
// cores; padding elements of a shard are never touched.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/ops/host_buffer.hpp"

namespace shardtrain::optim {

// Which parameters weight decay applies to. The seed decays everything; the common alternative exempts
// RMSNorm weights and the embedding (and a tied lm_head).
enum class DecayScope { All, ExemptNormsAndEmbeddings };
DecayScope parse_decay_scope(std::string_view text);  // "all" | "exempt_norms_and_embeddings"

struct AdamWConfig {
  double lr = 1e-3;  // the peak rate; the schedule scales it per step
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;
  DecayScope decay = DecayScope::All;
  void validate() const;  // throws ConfigError naming optim.<key>
};

// One contiguous run of a shard with its weight-decay factor.
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = true;
};

class AdamW {
 public:
  // exp_avg and exp_avg_sq live beside each shard (host memory; pinned when the shards are offloaded).
  AdamW(const fsdp::FsdpEngine& engine, const AdamWConfig& config, MemoryLedger* ledger);

  // One update at learning rate `lr` of every shard; grads are multiplied by grad_scale first
  // (clipping). Increments the step count used by bias correction.
  void step(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

  // The states of shard i (numel elements each), for checkpoints.
  float* exp_avg(size_t i) { return states_[i].exp_avg.as<float>(); }
  float* exp_avg_sq(size_t i) { return states_[i].exp_avg_sq.as<float>(); }
  const float* exp_avg(size_t i) const { return states_[i].exp_avg.as<float>(); }
  const float* exp_avg_sq(size_t i) const { return states_[i].exp_avg_sq.as<float>(); }
  const std::vector<DecayRange>& ranges(size_t i) const { return states_[i].ranges; }
  const AdamWConfig& config() const { return config_; }

 private:
  struct State {
    ops::HostBuffer exp_avg, exp_avg_sq;
    std::vector<DecayRange> ranges;  // the parameter parts of the shard (padding excluded)
    int64_t numel = 0;
  };
  AdamWConfig config_;
  std::vector<State> states_;
  int64_t steps_ = 0;
  MemoryLedger* ledger_;
  int64_t state_bytes_ = 0;
};

// Sum of squared gradients of this rank's shards (padding is zero and adds nothing).
double grad_sq_sum_local(const std::vector<fsdp::ShardView>& shards);
// The global L2 norm: local sums of squares all-reduced over the shard axis (replicas hold equal shards).
double grad_norm_global(const std::vector<fsdp::ShardView>& shards, Communicator& shard_axis);
// The factor that brings the norm down to max_norm (1 when already below, or when max_norm <= 0).
double clip_coefficient(double grad_norm, double max_norm);

}  // namespace shardtrain::optim
