// Data mixtures: one stream of samples drawn from several prepared datasets in fixed proportions
// (docs/data.md, "Mixtures"). The loader and the distributed sampler see one index space of N samples per
// epoch, N = the sum of the sources' own sample counts; source k owns round(w_k N) of them (largest
// remainder), spread evenly over [0, N) by a deterministic interleave, so an unshuffled run also sees every
// global batch in proportion. Which of its samples source k gives in epoch e is position e*c_k + t of its own
// endless stream: passes over its samples, each pass a fresh seeded permutation (or file order without
// shuffle). So a source that is down-weighted shows every sample once before any repeats, and an up-weighted
// one repeats whole passes. A source whose share equals its size gives each sample once per epoch, in order;
// the single-dataset case is exactly that (a mixture of one), unchanged from before mixtures existed.
// Everything is a pure function of (seed, epoch, index): resume needs only the sampler position.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/dataset.hpp"

namespace shardtrain::data {

// One entry of data.mixture: "PATH:WEIGHT" (split at the last ':'; WEIGHT a positive number).
struct MixtureEntry {
  std::string path;
  double weight = 1.0;
};
// Throws ConfigError naming `field` (for example "data.mixture[1]") and the entry.
MixtureEntry parse_mixture_entry(std::string_view text, const std::string& field);

// A bijection of [0, n) chosen by `key`, evaluated one element at a time without a table: a six-round
// Feistel network on the smallest even number of bits that covers n, walking the cycle until the value
// falls inside [0, n) (under four steps on average). n must be in [1, 2^62).
uint64_t permute_index(uint64_t i, uint64_t n, uint64_t key);

// For messages: the path of one dataset, or "a mixture of N datasets (P1, P2...)".
std::string describe_sources(const std::vector<std::string>& paths);

struct MixtureComponent {
  std::shared_ptr<const TokenDataset> dataset;
  double weight = 1.0;
};

class MixedSource {
 public:
  // Throws ConfigError for a bad weight, a share that rounds to no sample, or more than 255 sources;
  // DataError for sources tokenized differently or a split without a sample (naming the file).
  MixedSource(std::vector<MixtureComponent> components, DatasetSplit split, BatchLayout layout, int seq_len, uint64_t seed,
              bool shuffle);

  size_t num_samples() const { return total_; }  // per epoch
  DatasetSplit split() const { return split_; }
  std::string describe() const;  // describe_sources() of the datasets
  // DataError naming the datasets when an epoch holds fewer samples than one global batch (no step at all).
  void require_global_batch(int global_batch_size) const;
  int seq_len() const { return seq_len_; }
  BatchLayout layout() const { return layout_; }
  size_t size() const { return parts_.size(); }  // sources

  const TokenDataset& dataset(size_t k) const { return *parts_[k].component.dataset; }
  double weight(size_t k) const { return parts_[k].weight; }                        // normalized: the weights sum to 1
  size_t source_samples(size_t k) const { return parts_[k].source.num_samples(); }  // what the source holds
  size_t samples_per_epoch(size_t k) const { return parts_[k].per_epoch; }          // what it gives per epoch
  double times_seen_per_epoch(size_t k) const;  // samples_per_epoch(k) / source_samples(k)
  // Source k's share for logs and reports: "weight 0.7: 700 of the epoch's 1000 samples; it holds 500, each seen 1.4
  // times per epoch".
  std::string share(size_t k) const;

  struct Draw {
    uint32_t source = 0;  // k
    uint64_t sample = 0;  // the source's own sample index
  };
  // Mixture sample i (< num_samples()) of `epoch`.
  Draw locate(uint64_t epoch, uint64_t i) const;
  // TokenDataset::check_unchanged() of every source.
  void check_unchanged() const;
  // Writes that sample into rows of seq_len; returns its source.
  uint32_t fill(uint64_t epoch, uint64_t i, int32_t* tokens, int32_t* targets, int32_t* doc_ids) const;

 private:
  struct Part {
    MixtureComponent component;
    SampleSource source;
    double weight = 0;
    size_t per_epoch = 0;
  };
  static constexpr uint64_t kBlock = 64;

  std::vector<Part> parts_;
  DatasetSplit split_;
  BatchLayout layout_;
  int seq_len_;
  uint64_t seed_;
  bool shuffle_;
  size_t total_ = 0;
  // With two or more sources: the source of every mixture index, and per block of kBlock indices and source,
  // how many of that source's indices come before the block (so locate() counts at most kBlock - 1 entries).
  std::vector<uint8_t> which_;
  std::vector<uint64_t> block_start_;
};

}  // namespace shardtrain::data
