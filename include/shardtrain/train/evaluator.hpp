// The held-out evaluation (docs/training.md, "Validation" and "Evaluating weights"): a loader per source with
// enough samples of the split, and the loss of a replica's current weights on them, per source and in the
// mixture's weights. Training's validation and `shardtrain evaluate` are this one class over the same kind of
// replica, so on the same ranks, weights and batches they give the same loss bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/loader.hpp"
#include "shardtrain/data/mixture.hpp"
#include "shardtrain/train/config.hpp"
#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/replica.hpp"

namespace shardtrain::train {

struct EvaluatorOptions {
  // Who reads the losses, for the words of the warning on a source left out: the trainer's validation (the
  // run goes on without that source's loss) or `shardtrain evaluate` (the source is not evaluated).
  enum class Use { Validation, Evaluation };
  Use use = Use::Validation;
  data::DatasetSplit split = data::DatasetSplit::Validation;
  int64_t micro_batches = 0;  // per rank and source (at most the split's); 0: the whole split
};

class Evaluator {
 public:
  // Opens a loader on `options.split` of each source with at least one evaluation batch (micro-batch x world
  // sequences; a source with fewer is left out, with a warning). The loaders read in order, unshuffled, and
  // start again from the first batch at every evaluate(). `replica` must outlive the evaluator.
  Evaluator(Replica& replica, const TrainConfig& config, const std::vector<data::MixtureComponent>& sources,
            EvaluatorOptions options = {});
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // The loss of the replica's weights (collective over the world); NaN when no source has an evaluation batch.
  // Each source's samples give its own loss (into by_source, one entry per evaluated source, in plan() order),
  // and with a data mixture the result is their mean in the mixture's weights: the expected loss of a token
  // drawn as training draws them. `bytes_per_id` (a tokenizer's byte length of each id, 0 for special tokens)
  // adds up the counted targets' bytes into by_source, for bits per byte.
  double evaluate(int64_t* counted_tokens = nullptr, std::vector<SourceLoss>* by_source = nullptr,
                  const std::vector<uint32_t>* bytes_per_id = nullptr);

  // The sources evaluate() reads, each with its micro-batches per rank and its sequences over all ranks.
  struct SourcePlan {
    std::string path;
    int64_t micro_batches = 0;  // per rank
    int64_t sequences = 0;      // over all ranks
    int64_t samples = 0;        // in the split (the last partial batch is not read)
    double weight = 1;          // in the mixture
  };
  std::vector<SourcePlan> plan() const;
  bool empty() const { return sources_.empty(); }
  int64_t batch_sequences() const { return batch_sequences_; }  // one evaluation batch: micro-batch x world

 private:
  Replica* replica_;
  struct Source {
    std::unique_ptr<data::Loader> loader;
    int64_t micro_batches = 0;
    double weight = 1;
  };
  std::vector<Source> sources_;
  int64_t batch_sequences_ = 0;
};

}  // namespace shardtrain::train
