// Greedy, top-k and nucleus sampling.
#include "shardtrain/model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0)) throw UsageError(fmt::format("--temperature {}: expected 0 (greedy) or more", o.temperature));
  if (o.top_k < 0) throw UsageError(fmt::format("--top-k {}: expected 0 (no limit) or more", o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) throw UsageError(fmt::format("--top-p {}: expected a value in (0, 1]", o.top_p));
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  const auto n = static_cast<int32_t>(logits.size());
  if (o.temperature == 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int32_t k = o.top_k > 0 ? std::min(o.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
  order.resize(static_cast<size_t>(k));
  std::vector<double> p(order.size());
  const double top = logits[static_cast<size_t>(order[0])];
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i)
    sum += p[i] = std::exp((logits[static_cast<size_t>(order[i])] - top) / o.temperature);
  // Nucleus: the most likely tokens until their probability reaches top_p (at least one).
  size_t keep = 0;
  double mass = 0;
  while (keep < p.size() && (keep == 0 || mass < o.top_p * sum)) mass += p[keep++];
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng);
  for (size_t i = 0; i < keep; ++i) {
    if ((r -= p[i]) <= 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace shardtrain::model
