// Choosing the next token from logits: greedy (temperature 0), or sampling at a temperature from the
// top-k most likely tokens, then from the smallest set whose probability reaches top-p (nucleus).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace shardtrain::model {

struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy
  int top_k = 40;            // 0: no limit
  double top_p = 0.95;       // 1: no limit
};

// Throws UsageError on a negative temperature or top_k, or a top_p outside (0, 1].
void validate(const SamplingOptions& o);
int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng);

}  // namespace shardtrain::model
