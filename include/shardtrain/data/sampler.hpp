// The distributed sampler, with the seed's DistributedSampler semantics made exact and resumable:
// every epoch is a permutation of the samples keyed by (seed, epoch) (or the identity without shuffle);
// micro-step j of the epoch takes the permutation's slice [j*B*W, (j+1)*B*W) and data-parallel rank r
// gets its elements r, r+W, r+2W, ... (B = micro-batch size, W = data-parallel world size). Incomplete
// global batches at the end of an epoch are dropped (drop_last), so all ranks take the same number of
// micro-batches and each global batch is B*W*A samples (A = gradient accumulation steps).
// The sampler sees plain (rank, world_size): the caller passes the data-parallel coordinates; every rank
// of the replicate x shard mesh is a data-parallel rank.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace shardtrain::data {

// Where a rank is in the stream of micro-batches: `index` micro-batches of epoch `epoch` were taken.
struct SamplerPosition {
  uint64_t epoch = 0;
  uint64_t index = 0;
  bool operator==(const SamplerPosition&) const = default;
};

struct SamplerOptions {
  size_t num_samples = 0;
  int micro_batch_size = 1;   // B, per rank
  int global_batch_size = 1;  // B * W * A
  int dp_rank = 0;
  int dp_size = 1;  // W
  uint64_t seed = 0;
  bool shuffle = true;
};

// A permutation of [0, n) from a counter-free, platform-independent generator (splitmix64 +
// Fisher-Yates with unbiased bounded draws): the same on every compiler and standard library.
std::vector<uint64_t> shuffled_indices(size_t n, uint64_t seed);

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);  // validates; throws ConfigError naming the field

  const SamplerOptions& options() const { return options_; }
  int accumulation_steps() const { return accumulation_; }
  size_t global_batches_per_epoch() const { return global_batches_; }
  size_t micro_batches_per_epoch() const { return global_batches_ * static_cast<size_t>(accumulation_); }

  // The samples of this rank's micro-batch `index` in `epoch` (B of them, into out).
  void micro_batch(uint64_t epoch, uint64_t index, std::span<uint64_t> out) const;
  // The position after `p`, rolling over to the next epoch.
  SamplerPosition advance(SamplerPosition p) const;
  // Positions in units that do not depend on the world: the samples of the epoch's order that all ranks
  // together took before `p` (micro-step j covers the order's slice [j B W, (j+1) B W)), and the position
  // that follows `samples` of `epoch` here (rounded down to a micro-step of this sampler's B x W). A step
  // covers the same slice of the order at every world size, so a checkpoint's sample count resumes at
  // the same data on another number of ranks.
  uint64_t samples_before(SamplerPosition p) const;
  SamplerPosition position_after(uint64_t epoch, uint64_t samples) const;

 private:
  const std::vector<uint64_t>& order(uint64_t epoch) const;

  SamplerOptions options_;
  int accumulation_ = 1;
  size_t global_batches_ = 0;
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::vector<uint64_t> cached_order_;
};

std::string to_string(const SamplerPosition& p);  // "epoch 2 index 17"

}  // namespace shardtrain::data
