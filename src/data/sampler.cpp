// Distributed sampler (sampler.hpp): seeded epoch permutations and each rank's strided share of them.
#include "shardtrain/data/sampler.hpp"

#include <fmt/format.h>

#include <numeric>

#include "shardtrain/runtime/error.hpp"
#include "splitmix.hpp"

namespace shardtrain::data {
using detail::SplitMix64;

std::vector<uint64_t> shuffled_indices(size_t n, uint64_t seed) {
  std::vector<uint64_t> v(n);
  std::iota(v.begin(), v.end(), uint64_t{0});
  SplitMix64 rng{seed ^ 0x5348415244545241ull};  // "SHARDTRA"
  for (size_t i = n; i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
  return v;
}

DistributedSampler::DistributedSampler(SamplerOptions o) : options_(o) {
  if (o.dp_size < 1) throw ConfigError(fmt::format("sampler: data-parallel size must be >= 1 (got {})", o.dp_size));
  if (o.dp_rank < 0 || o.dp_rank >= o.dp_size)
    throw ConfigError(fmt::format("sampler: data-parallel rank {} is outside [0, {})", o.dp_rank, o.dp_size));
  if (o.micro_batch_size < 1) throw ConfigError(fmt::format("micro_batch_size must be >= 1 (got {})", o.micro_batch_size));
  const int per_step = o.micro_batch_size * o.dp_size;
  if (o.global_batch_size < per_step || o.global_batch_size % per_step != 0)
    throw ConfigError(
        fmt::format("global_batch_size {} must be a positive multiple of micro_batch_size x data-parallel size "
                    "= {} x {} = {}",
                    o.global_batch_size, o.micro_batch_size, o.dp_size, per_step));
  accumulation_ = o.global_batch_size / per_step;
  global_batches_ = o.num_samples / static_cast<size_t>(o.global_batch_size);
  if (global_batches_ == 0)
    throw ConfigError(
        fmt::format("the split has {} samples, fewer than one global batch of {}", o.num_samples, o.global_batch_size));
}

const std::vector<uint64_t>& DistributedSampler::order(uint64_t epoch) const {
  if (cached_epoch_ != epoch) {
    if (options_.shuffle) {
      cached_order_ = shuffled_indices(options_.num_samples, options_.seed * 0x100000001b3ull + epoch);
    } else {
      cached_order_.resize(options_.num_samples);
      std::iota(cached_order_.begin(), cached_order_.end(), uint64_t{0});
    }
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

void DistributedSampler::micro_batch(uint64_t epoch, uint64_t index, std::span<uint64_t> out) const {
  if (index >= micro_batches_per_epoch())
    throw InternalError(fmt::format("sampler: micro-batch {} is past the epoch's {}", index, micro_batches_per_epoch()));
  const auto& ord = order(epoch);
  const size_t b = static_cast<size_t>(options_.micro_batch_size), w = static_cast<size_t>(options_.dp_size);
  const size_t base = index * b * w + static_cast<size_t>(options_.dp_rank);
  for (size_t k = 0; k < b && k < out.size(); ++k) out[k] = ord[base + k * w];
}

SamplerPosition DistributedSampler::advance(SamplerPosition p) const {
  if (++p.index >= micro_batches_per_epoch()) {
    ++p.epoch;
    p.index = 0;
  }
  return p;
}

uint64_t DistributedSampler::samples_before(SamplerPosition p) const {
  return p.index * static_cast<uint64_t>(options_.micro_batch_size) * static_cast<uint64_t>(options_.dp_size);
}

SamplerPosition DistributedSampler::position_after(uint64_t epoch, uint64_t samples) const {
  const uint64_t per_step = static_cast<uint64_t>(options_.micro_batch_size) * static_cast<uint64_t>(options_.dp_size);
  SamplerPosition p{epoch, samples / per_step};
  if (p.index >= micro_batches_per_epoch()) p = {epoch + 1, 0};  // past this run's (shorter) epoch
  return p;
}

std::string to_string(const SamplerPosition& p) { return fmt::format("epoch {} index {}", p.epoch, p.index); }

}  // namespace shardtrain::data
