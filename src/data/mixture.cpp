// Data mixtures (mixture.hpp): shares, the interleave, and each source's endless stream of passes.
#include "shardtrain/data/mixture.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "shardtrain/runtime/error.hpp"
#include "splitmix.hpp"

namespace shardtrain::data {
namespace {
__extension__ typedef __int128 int128;  // exact deficits: c_k (i + 1) may pass 2^63 for N > 3e9
}  // namespace

MixtureEntry parse_mixture_entry(std::string_view text, const std::string& field) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    throw ConfigError(fmt::format(
        "{}: expected PATH:WEIGHT (a prepared dataset and its share, e.g. \"data/web.h5:0.7\"), got \"{}\"", field, text));
  MixtureEntry e;
  e.path = std::string(text.substr(0, colon));
  const std::string w(text.substr(colon + 1));
  char* end = nullptr;
  e.weight = std::strtod(w.c_str(), &end);
  if (end != w.c_str() + w.size() || !std::isfinite(e.weight) || e.weight <= 0)
    throw ConfigError(fmt::format("{}: the weight of {} must be a positive number, got \"{}\"", field, e.path, w));
  return e;
}

uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key) {
  if (n == 0 || n >= (uint64_t{1} << 62) || i >= n)
    throw InternalError(fmt::format("permute_index: index {} of a domain of {}", i, n));
  if (n == 1) return 0;
  int bits = 2;
  while ((uint64_t{1} << bits) < n) ++bits;
  bits += bits & 1;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = i;
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 6; ++round) {
      const uint64_t f = detail::mix64(key ^ (right * 0x9e3779b97f4a7c15ull) ^ (round << 58)) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

std::string describe_sources(const std::vector<std::string>& paths) {
  if (paths.size() == 1) return paths.front();
  return fmt::format("a mixture of {} datasets ({})", paths.size(), fmt::join(paths, ", "));
}

std::string MixedSource::describe() const {
  std::vector<std::string> paths;
  for (const Part& p : parts_) paths.push_back(p.component.dataset->path());
  return describe_sources(paths);
}

double MixedSource::times_seen_per_epoch(size_t k) const {
  return static_cast<double>(samples_per_epoch(k)) / static_cast<double>(source_samples(k));
}

std::string MixedSource::share(size_t k) const {
  return fmt::format("weight {:.4g}: {} of the epoch's {} samples; it holds {}, each seen {:.3g} times per epoch", weight(k),
                     samples_per_epoch(k), num_samples(), source_samples(k), times_seen_per_epoch(k));
}

void MixedSource::require_global_batch(int global_batch_size) const {
  if (total_ < static_cast<size_t>(global_batch_size))
    throw DataError(fmt::format("{}: the {} split has {} samples of {} tokens, fewer than one global batch of {}",
                                describe(), dataset_split_name(split_), total_, seq_len_, global_batch_size));
}

MixedSource::MixedSource(std::vector<MixtureComponent> components, DatasetSplit split, BatchLayout layout, int seq_len,
                         uint64_t seed, bool shuffle)
    : split_(split), layout_(layout), seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  if (components.empty()) throw ConfigError("data: no dataset to draw samples from");
  if (components.size() > 255)
    throw ConfigError(fmt::format("data.mixture: {} sources; at most 255 are supported", components.size()));
  double weight_sum = 0;
  for (const auto& c : components) {
    if (!(std::isfinite(c.weight) && c.weight > 0))
      throw ConfigError(
          fmt::format("data.mixture: the weight of {} must be a positive number, got {}", c.dataset->path(), c.weight));
    weight_sum += c.weight;
  }
  // Each finite, their sum too: each share is w / sum, and a sum past the largest double makes every share 0 (and
  // every loss a mean over nothing).
  if (!std::isfinite(weight_sum))
    throw ConfigError(
        fmt::format("data.mixture: the weights sum to {} (each is finite, their sum is not); expected "
                    "weights whose sum is a finite number, such as 0.7 and 0.3 (only their ratios matter)",
                    weight_sum));
  const DatasetInfo& first = components.front().dataset->info();
  for (const auto& c : components) {
    const DatasetInfo& info = c.dataset->info();
    if (!same_tokenizer(info.tokenizer_hash, info.tokenizer_encoding_hash, first.tokenizer_hash,
                        first.tokenizer_encoding_hash))
      throw DataError(fmt::format(
          "{}: tokenized with {} ({}), but {} with {} ({}); every source of a mixture must use the same tokenizer",
          c.dataset->path(), info.tokenizer_name, info.tokenizer_hash, components.front().dataset->path(),
          first.tokenizer_name, first.tokenizer_hash));
    SampleSource source(*c.dataset, split, layout, seq_len);
    total_ += source.num_samples();
    parts_.push_back(Part{c, std::move(source), c.weight / weight_sum, 0});
  }

  // Shares: round(w_k N), the remainder to the largest fractional parts (the earlier source on a tie).
  const size_t k_count = parts_.size();
  std::vector<double> exact(k_count);
  size_t given = 0;
  for (size_t k = 0; k < k_count; ++k) {
    exact[k] = parts_[k].weight * static_cast<double>(total_);
    parts_[k].per_epoch = std::min(total_, static_cast<size_t>(std::floor(exact[k])));
    given += parts_[k].per_epoch;
  }
  std::vector<size_t> by_fraction(k_count);
  std::iota(by_fraction.begin(), by_fraction.end(), size_t{0});
  std::stable_sort(by_fraction.begin(), by_fraction.end(),
                   [&](size_t a, size_t b) { return exact[a] - std::floor(exact[a]) > exact[b] - std::floor(exact[b]); });
  for (size_t j = 0; given < total_; j = (j + 1) % k_count, ++given) ++parts_[by_fraction[j]].per_epoch;
  for (size_t j = k_count; given > total_ && j-- > 0;)  // floors past N (weights summing to 1 + rounding)
    if (parts_[by_fraction[j]].per_epoch > 0) --parts_[by_fraction[j]].per_epoch, --given;
  for (const Part& p : parts_)
    if (p.per_epoch == 0)
      throw ConfigError(
          fmt::format("data.mixture: the share {:.3g} of {} is less than one of the epoch's {} samples; "
                      "raise its weight or leave it out",
                      p.weight, p.component.dataset->path(), total_));
  if (k_count == 1) return;

  // The interleave: index i goes to the source furthest behind its share of the first i + 1 indices, that
  // is the largest c_k (i + 1) - N count_k (exact integers), the earlier source on a tie. Every prefix then
  // holds each source's share to within one sample, and source k ends with exactly c_k indices.
  which_.resize(total_);
  block_start_.resize((total_ + kBlock - 1) / kBlock * k_count);
  std::vector<uint64_t> count(k_count, 0);
  const auto n = static_cast<int128>(total_);
  for (size_t i = 0; i < total_; ++i) {
    if (i % kBlock == 0)
      std::copy(count.begin(), count.end(), block_start_.begin() + static_cast<ptrdiff_t>(i / kBlock * k_count));
    size_t best = 0;
    int128 best_deficit = 0;
    for (size_t k = 0; k < k_count; ++k) {
      const int128 deficit = static_cast<int128>(parts_[k].per_epoch) * static_cast<int128>(i + 1) - n * count[k];
      if (k == 0 || deficit > best_deficit) best = k, best_deficit = deficit;
    }
    which_[i] = static_cast<uint8_t>(best);
    ++count[best];
  }
}

MixedSource::Draw MixedSource::locate(uint64_t epoch, uint64_t i) const {
  if (i >= total_) throw InternalError(fmt::format("mixture: sample {} of an epoch of {}", i, total_));
  Draw d;
  uint64_t t = i;  // the source's t-th index of this epoch
  if (parts_.size() > 1) {
    d.source = which_[i];
    const uint64_t block = i / kBlock;
    t = block_start_[block * parts_.size() + d.source];
    for (uint64_t j = block * kBlock; j < i; ++j) t += which_[j] == d.source;
  }
  const Part& p = parts_[d.source];
  const uint64_t n = p.source.num_samples(), c = p.per_epoch;
  if (c == n) {  // every sample once per epoch: the sampler's own shuffle is enough
    d.sample = t;
    return d;
  }
  const uint64_t stream = epoch * c + t;  // position in the source's endless stream of passes
  const uint64_t pass = stream / n, r = stream % n;
  const uint64_t key = detail::mix64(detail::mix64(seed_ ^ 0x4d49585455524531ull) ^ (uint64_t{d.source} << 48) ^ pass);
  d.sample = shuffle_ ? permute_index(r, n, key) : r;
  return d;
}

void MixedSource::check_unchanged() const {
  for (const Part& p : parts_) p.component.dataset->check_unchanged();
}

uint32_t MixedSource::fill(uint64_t epoch, uint64_t i, int32_t* tokens, int32_t* targets, int32_t* doc_ids) const {
  const Draw d = locate(epoch, i);
  parts_[d.source].source.fill(d.sample, tokens, targets, doc_ids);
  return d.source;
}

}  // namespace shardtrain::data
