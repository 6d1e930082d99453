// The held-out evaluation (evaluator.hpp): its loaders, and the loss of the replica's weights on them.
#include "shardtrain/train/evaluator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <span>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {

Evaluator::Evaluator(Replica& replica, const TrainConfig& config, const std::vector<data::MixtureComponent>& sources,
                     EvaluatorOptions options)
    : replica_(&replica) {
  const Topology& topo = replica.runtime().topology();
  const bool eval_only = options.use == EvaluatorOptions::Use::Evaluation;
  data::LoaderOptions eo;
  eo.split = options.split;
  eo.layout = config.data.layout;
  eo.seq_len = config.data.seq_len;
  eo.micro_batch_size = config.micro_batch_size_for(topo.world_size);
  eo.global_batch_size = eo.micro_batch_size * topo.world_size;
  eo.dp_rank = topo.world_rank;
  eo.dp_size = topo.world_size;
  eo.seed = config.data.seed;
  eo.shuffle = false;
  eo.prefetch = 2;
  batch_sequences_ = eo.global_batch_size;
  // Each source's split on its own (so a mixture reports a loss per source); a source with fewer samples than
  // one evaluation batch is left out, with a warning.
  const bool mixed = sources.size() > 1;
  // Every rank finds the same (the same files, the same split): rank 0 says it, once for the job.
  const bool say = topo.world_rank == 0;
  const char* const who = eval_only ? "evaluate" : "train";
  const char* const outcome = eval_only ? "not evaluated"
                              : mixed   ? "the validation loss leaves this source out"
                                        : "no validation loss";
  for (const auto& c : sources) {
    const std::string& path = c.dataset->path();
    size_t samples = 0;
    try {
      samples = data::SampleSource(*c.dataset, eo.split, eo.layout, eo.seq_len).num_samples();
    } catch (const DataError& e) {
      // An empty held-out split (prepared with --validation-fraction 0): what gives a training run one. evaluate says
      // what to do in its error (no source to evaluate).
      const bool no_validation = eo.split == data::DatasetSplit::Validation && c.dataset->split_documents(eo.split).empty();
      if (say)
        log::warn("{}: {}: {}{}", who, e.what(), outcome,
                  no_validation && !eval_only ? "; prepare the dataset with --validation-fraction above 0 for one" : "");
      continue;
    }
    if (samples < static_cast<size_t>(eo.global_batch_size)) {
      if (say)
        log::warn("{}: the {} split of {} has {} samples, fewer than one evaluation batch of {}: {}", who,
                  data::dataset_split_name(eo.split), path, samples, eo.global_batch_size, outcome);
      continue;
    }
    Source e;
    e.loader = std::make_unique<data::Loader>(c.dataset, eo);
    const auto per_epoch = static_cast<int64_t>(e.loader->micro_batches_per_epoch());
    e.micro_batches = options.micro_batches > 0 ? std::min<int64_t>(options.micro_batches, per_epoch) : per_epoch;
    e.weight = c.weight;
    sources_.push_back(std::move(e));
  }
  if (!eval_only && mixed && sources_.empty() && say)
    log::warn("train: no validation loss: no source has enough validation samples");
}

Evaluator::~Evaluator() = default;

std::vector<Evaluator::SourcePlan> Evaluator::plan() const {
  std::vector<SourcePlan> plan;
  for (const Source& e : sources_)
    plan.push_back({e.loader->source().dataset(0).path(), e.micro_batches, e.micro_batches * batch_sequences_,
                    static_cast<int64_t>(e.loader->source().num_samples()), e.weight});
  return plan;
}

double Evaluator::evaluate(int64_t* counted_tokens, std::vector<SourceLoss>* by_source,
                           const std::vector<uint32_t>* bytes_per_id) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  if (sources_.empty()) return nan;
  std::vector<double> sums;  // per source: loss sum, tokens
  std::vector<int64_t> bytes(sources_.size(), 0);
  for (size_t k = 0; k < sources_.size(); ++k) {
    Source& e = sources_[k];
    e.loader->seek({0, 0});  // the same held-out batches every time
    for (int64_t i = 0; i < e.micro_batches; ++i) {
      data::MicroBatch mb = e.loader->next();
      if (bytes_per_id) {
        for (const int32_t t : mb.targets)
          if (t >= 0 && static_cast<size_t>(t) < bytes_per_id->size()) bytes[k] += (*bytes_per_id)[static_cast<size_t>(t)];
      }
      replica_->engine().forward(replica_->model_batch(mb));
      if (replica_->ops().device() == DeviceKind::Cuda)
        stream_synchronize(replica_->ops().stream());  // the upload ran before the loader refills it
      e.loader->recycle(std::move(mb));
    }
    const ops::LossSums total = replica_->ops().take_loss();
    sums.push_back(total.loss_sum);
    sums.push_back(static_cast<double>(total.tokens));
  }
  replica_->comms().world().all_reduce(std::span<double>(sums), ReduceOp::Sum);
  if (bytes_per_id) replica_->comms().world().all_reduce(std::span<int64_t>(bytes), ReduceOp::Sum);
  double weighted = 0, weight = 0, tokens = 0;
  for (size_t k = 0; k < sources_.size(); ++k) {
    const double loss = sums[2 * k + 1] > 0 ? sums[2 * k] / sums[2 * k + 1] : nan;
    tokens += sums[2 * k + 1];
    if (sums[2 * k + 1] > 0) weighted += sources_[k].weight * loss, weight += sources_[k].weight;
    if (by_source)
      by_source->push_back(
          {sources_[k].loader->source().dataset(0).path(), loss, static_cast<int64_t>(sums[2 * k + 1]), bytes[k]});
  }
  if (counted_tokens) *counted_tokens = static_cast<int64_t>(tokens);
  if (sources_.size() == 1) return sums[1] > 0 ? sums[0] / sums[1] : nan;
  return weight > 0 ? weighted / weight : nan;
}

}  // namespace shardtrain::train
