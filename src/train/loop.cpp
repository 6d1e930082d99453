// The training loop (trainer.hpp): steps of micro-batches accumulated to the global batch, the LR
// schedule, clipping, non-finite skipping, validation, metrics and hooks.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <new>
#include <thread>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/progress_view.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t axis_bytes(MeshComms& comms, MeshAxis axis) {
  uint64_t total = 0;
  for (int k = 0; k < kCollectiveKinds; ++k) total += comms.bytes(axis, static_cast<CollectiveKind>(k));
  return total;
}

}  // namespace

// What forward, backward and the decision made of a step.
struct Trainer::StepResult {
  double loss = 0, norm = 0, lr = 0;
  bool nonfinite = false;  // the loss or the gradient norm, on any rank
  bool skip = false;       // non-finite, or a loss spike
};

void Trainer::step_once(StepMetrics& m) {
  if (options_.faults.slow_step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options_.faults.slow_step_ms));
  const auto t0 = Clock::now();
  watchdog_->set_step(state_.step + 1);
  failure_record::set_step(state_.step + 1);
  if (const RankFault* f = options_.faults.rank_fault_at(runtime_->topology().world_rank, state_.step + 1)) inject(*f);
  const uint64_t shard0 = axis_bytes(*comms_, MeshAxis::Shard), rep0 = axis_bytes(*comms_, MeshAxis::Replicate),
                 world0 = axis_bytes(*comms_, MeshAxis::World);

  // The epoch of this step's micro-batches (of its first): after advance() the position is the next micro-batch's, and
  // the last step of an epoch read as the next epoch's (a 2-epoch run ended at "epoch 2").
  const uint64_t epoch = state_.sampler.epoch;
  StepInput in = take_step_input();
  timeline_->step_begins();
  StepResult r = forward_backward(in);
  const int64_t step_number = state_.step + 1;
  r.lr = schedule_->lr(state_.step);
  r.skip = decide_skip(r, step_number);
  const optim::AdamW::AsyncTimes update_times = update(r);
  timeline_->step_ends();
  advance(in, step_number);

  m = {};
  m.step = step_number;
  m.epoch = epoch;
  m.tokens = state_.tokens_seen;
  for (size_t k = 0; k + 1 < in.counted.size(); ++k) {
    const std::string path = json_recorded(sources_[k].dataset->path());  // as the checkpoint records it (resumed)
    m.tokens_by_source.emplace_back(path, state_.tokens_by_source[path]);
  }
  m.loss = r.loss;
  m.lr = r.lr;
  m.grad_norm = r.norm;
  m.skipped = r.skip;
  if (r.skip) m.skip_reason = r.nonfinite ? "nonfinite" : "loss_spike";
  m.step_time_s = seconds_since(t0);
  m.tokens_per_s = static_cast<double>(tokens_per_step_) / m.step_time_s;
  m.mfu = mfu_.mfu(m.tokens_per_s * flops_per_token_, runtime_->topology().world_size);
  m.mfu_measured_peak = mfu_.mfu_of_measured(m.tokens_per_s * flops_per_token_, runtime_->topology().world_size);
  // On a GPU: everything shardtrain allocated there (activations and op scratch too, which the ledger
  // does not count); on the CPU: what the ledger counts (FSDP buffers, optimizer states).
  m.peak_mem_bytes = ops_->device() == DeviceKind::Cuda ? static_cast<int64_t>(device_memory_stats().peak)
                                                        : replica_->ledger().peak_total();
  m.rss_peak_bytes = peak_rss_bytes();
  m.comm_shard_bytes = axis_bytes(*comms_, MeshAxis::Shard) - shard0;
  m.comm_replicate_bytes = axis_bytes(*comms_, MeshAxis::Replicate) - rep0;
  m.comm_world_bytes = axis_bytes(*comms_, MeshAxis::World) - world0;
  if (const std::optional<StepTimes> t = timeline_->read()) {
    m.gpu_busy_s = t->gpu_busy_s;
    m.gpu_idle_before_s = t->gpu_idle_before_s;
    m.host_queue_s = t->host_queue_s;
  }
  m.host_update_s = update_times.update_s;
  m.update_wait_s = update_times.waited_s;
  step_seconds_ += m.step_time_s;
}

Trainer::StepInput Trainer::read_micro_batches() {
  StepInput in;
  std::vector<data::MicroBatch>& mbs = in.mbs;
  mbs.reserve(static_cast<size_t>(accumulation_));
  in.start = loader_->position();
  // counted: the targets that take a loss, then with a mixture each source's input tokens (one row, one source).
  const size_t mixed = sources_.size() > 1 ? sources_.size() : 0;
  std::vector<int64_t>& counted = in.counted;
  counted.assign(1 + mixed, 0);
  for (int a = 0; a < accumulation_; ++a) {
    mbs.push_back(loader_->next());
    counted[0] += static_cast<int64_t>(mbs.back().loss_tokens());
    if (mixed)
      for (uint32_t s : mbs.back().sources) counted[1 + s] += mbs.back().seq;
  }
  in.end = loader_->position();
  return in;
}

Trainer::StepInput Trainer::take_step_input() {
  StepInput in;
  if (read_ahead_) {  // the steady state: read during the last step, counted over all ranks in its all-reduce
    in = std::move(*read_ahead_);
    read_ahead_.reset();
  } else {  // the first step, or the first after a restore: nothing read ahead, the counts reduced on their own
    in = read_micro_batches();
    comms_->world().all_reduce(std::span<int64_t>(in.counted), ReduceOp::Sum);
    in.global_tokens = in.counted[0];
  }
  // The loss is the mean over every counted target of the global batch.
  if (in.global_tokens == 0)
    throw DataError(fmt::format("{}: a global batch without any target to learn from", config_.data.describe()));
  return in;
}

void Trainer::drop_read_ahead() {
  if (!read_ahead_) return;
  for (auto& mb : read_ahead_->mbs) loader_->recycle(std::move(mb));
  read_ahead_.reset();
}

// Forward and backward of every micro-batch, then the step's loss and gradient norm, the same on every rank; and
// the next step's micro-batches read ahead, their counts reduced with this step's loss.
Trainer::StepResult Trainer::forward_backward(StepInput& in) {
  const int64_t global_tokens = in.global_tokens;
  const data::SamplerPosition start = in.start;
  engine_->zero_grad();
  for (int a = 0; a < accumulation_; ++a) {
    const model::Batch batch = replica_->model_batch(in.mbs[static_cast<size_t>(a)]);
    engine_->forward_backward(batch, 1.0 / static_cast<double>(global_tokens), a == accumulation_ - 1);
  }
  const int64_t step_number = state_.step + 1;
  const data::DistributedSampler& sampler = loader_->sampler();
  const uint64_t first_sample = sampler.samples_before(start);
  const bool poisoned =
      options_.faults.nan_grad_at(step_number) ||
      options_.faults.bad_data_in(
          start.epoch, first_sample,
          sampler.samples_before({start.epoch, start.index + static_cast<uint64_t>(accumulation_)}) - first_sample);
  if (poisoned) optim::poison_first_gradient(engine_->shards());
  // On a GPU, one synchronization for both values: the norm is queued first, the loss read (deferred,
  // replica.hpp: one read for the whole step) waits for the stream it was queued on. Where the step reduced
  // gradients the engine took each unit's sum of squares on the device as its reduction landed, so only their
  // copy is left (unless the nan_grad fault just wrote a shard on the host). This rank's part only: the parts are
  // summed in the step's one all-reduce below.
  grad_norm_.start_local(*engine_, poisoned);
  timeline_->work_queued();
  // The next step's micro-batches, read now (on a GPU while the device still runs this step): their counts are
  // known before this step's all-reduce, so they travel in it, and the next forward is queued right after this
  // update with nothing to wait for. Not past the run's last step. The loader's position the state records stays
  // this step's end (advance()), so a checkpoint, a rollback or a stop never counts these as consumed.
  std::optional<StepInput> ahead;
  if (step_number < total_steps_) ahead = read_micro_batches();
  const double loss_sum = ops_->take_loss().loss_sum;
  const double sq_sum = grad_norm_.sum_of_squares();
  // The step's one host all-reduce, over the world: [0] the loss sum, [1] the non-finite flag (every rank decides
  // the same way), [2] the gradient norm's square (optim::world_part), the hooks' agreed values (the preemption
  // flag), then the next step's counted targets (and per-source tokens), exact in doubles (far below 2^53).
  std::vector<double>& values = step_values_;
  values.assign(3, 0.0);
  values[0] = loss_sum;
  values[1] = std::isfinite(loss_sum) && std::isfinite(sq_sum) ? 0.0 : 1.0;
  values[2] = optim::world_part(sq_sum, comms_->replicate());
  for (TrainerHooks* h : hooks_) {
    const size_t at = values.size(), n = h->agreed_slots();
    values.resize(at + n, 0.0);
    h->contribute(std::span<double>(values).subspan(at, n));
  }
  const size_t counts_at = values.size();
  if (ahead)
    for (const int64_t c : ahead->counted) values.push_back(static_cast<double>(c));
  comms_->world().all_reduce(std::span<double>(values), ReduceOp::Sum);
  for (size_t at = 3; TrainerHooks * h : hooks_) {
    const size_t n = h->agreed_slots();
    h->agreed(std::span<const double>(values).subspan(at, n));
    at += n;
  }
  if (ahead) {
    for (size_t k = 0; k < ahead->counted.size(); ++k) ahead->counted[k] = static_cast<int64_t>(values[counts_at + k]);
    ahead->global_tokens = ahead->counted[0];
    read_ahead_ = std::move(ahead);
  }
  const double loss = values[0] / static_cast<double>(global_tokens);
  const double norm = std::sqrt(values[2]);
  const bool nonfinite = values[1] > 0 || !std::isfinite(loss) || !std::isfinite(norm);
  return {loss, norm, 0.0, nonfinite, false};
}

// Whether step `step_number` is skipped (its loss or norm non-finite, or its loss a spike): logged, and after
// too many in a row the Diverged error, or with optim.on_divergence = rollback a divergence run() acts on.
bool Trainer::decide_skip(const StepResult& r, int64_t step_number) {
  const double loss = r.loss, norm = r.norm;
  const bool nonfinite = r.nonfinite;
  double recent_mean = 0;
  const bool spike = !nonfinite && loss_spike(loss, &recent_mean);
  const bool skip = nonfinite || spike;
  if (skip) {
    ++state_.consecutive_nonfinite;
    ++state_.skipped_steps;
    const bool rollback = config_.optim.on_divergence == DivergencePolicy::Rollback;
    const std::string then = rollback ? "rolls back" : "stops";
    // Every rank decides alike (the decision is all-reduced): rank 0 says it once for the job, not once per rank.
    const bool say = runtime_->topology().world_rank == 0;
    if (say && nonfinite) {
      log::warn("train: step {} skipped: non-finite {} (loss {}, grad norm {}); {} in a row, the run {} at {}", step_number,
                std::isfinite(norm) ? "loss" : "gradient norm", loss, norm, state_.consecutive_nonfinite, then,
                config_.optim.max_consecutive_nonfinite);
    } else if (say) {
      log::warn(
          "train: step {} skipped: loss {:.4f} is {:.2f}x the mean {:.4f} of the last {} updated steps (optim.loss_spike_factor = {}); "
          "{} in a row, the run {} at {}",
          step_number, loss, loss / recent_mean, recent_mean, state_.recent_losses.size(), config_.optim.loss_spike_factor,
          state_.consecutive_nonfinite, then, config_.optim.max_consecutive_nonfinite);
    }
    if (state_.consecutive_nonfinite >= config_.optim.max_consecutive_nonfinite) {
      const std::string why =
          fmt::format("{} steps in a row (up to step {}) had {} (optim.max_consecutive_nonfinite = {})",
                      state_.consecutive_nonfinite, step_number,
                      config_.optim.loss_spike_factor > 0 ? "a non-finite loss or gradient norm, or a loss spike"
                                                          : "a non-finite loss or gradient norm",
                      config_.optim.max_consecutive_nonfinite);
      // (No "training diverged: " of its own: the exit code's name heads the logged line.)
      if (!rollback)
        throw Error(ExitCode::Diverged, fmt::format("{}; lower optim.lr, resume from an earlier checkpoint, or set "
                                                    "optim.on_divergence = \"rollback\"",
                                                    why));
      divergence_ = why;  // run() rolls back once this step is reported
    }
  }
  return skip;
}

// AdamW on the shards unless the step is skipped; the previous step's host update times (CPU offload).
optim::AdamW::AsyncTimes Trainer::update(const StepResult& r) {
  const bool skip = r.skip;
  const double loss = r.loss, norm = r.norm, lr = r.lr;
  // The previous step's host update (CPU offload) finished during this step's forward, before its last unit
  // was uploaded: taken now, before this step's update starts.
  const optim::AdamW::AsyncTimes update_times = async_update_ ? adamw_->take_async_times() : optim::AdamW::AsyncTimes{};
  if (!skip) {
    state_.consecutive_nonfinite = 0;
    remember_loss(loss);
    const double clip = optim::clip_coefficient(norm, config_.optim.max_grad_norm);
    // With gradients in activation memory (fsdp.grads_in_activation_memory) nothing may run a forward between
    // the step's backward and this update.
    if (!engine_->gradients_readable())
      throw InternalError("the gradient shards were overwritten before the update (a forward ran after the backward)");
    if (async_update_) {
      adamw_->step_async(engine_->shards(), lr, clip);  // still running when the step returns (trainer.hpp)
    } else {
      update_shards(*adamw_, *engine_, lr, clip);  // the next step's first gathers overlap it (replica.hpp)
    }
    state_.optimizer_steps = adamw_->steps();
  }
  return update_times;
}

// Past the step: its micro-batches back to the loader, the state one step on.
void Trainer::advance(StepInput& in, int64_t step_number) {
  const size_t mixed = in.counted.size() - 1;
  const std::vector<int64_t>& counted = in.counted;
  std::vector<data::MicroBatch>& mbs = in.mbs;
  for (auto& mb : mbs) loader_->recycle(std::move(mb));
  state_.step = step_number;
  state_.tokens_seen += tokens_per_step_;
  for (size_t k = 0; k < mixed; ++k) state_.tokens_by_source[json_recorded(sources_[k].dataset->path())] += counted[1 + k];
  state_.sampler = in.end;  // not the loader's position: that is past the next step's input, read ahead
  state_.sampler_samples = static_cast<int64_t>(loader_->sampler().samples_before(state_.sampler));
}

bool Trainer::loss_spike(double loss, double* mean) const {
  const std::vector<double>& recent = state_.recent_losses;
  if (config_.optim.loss_spike_factor <= 0 || recent.size() < static_cast<size_t>(config_.optim.loss_spike_window))
    return false;
  double sum = 0;
  for (const double l : recent) sum += l;  // oldest first: the same sum on every rank, and after a resume
  *mean = sum / static_cast<double>(recent.size());
  return loss > config_.optim.loss_spike_factor * *mean;
}

void Trainer::remember_loss(double loss) {
  if (config_.optim.loss_spike_factor <= 0) return;
  std::vector<double>& recent = state_.recent_losses;
  recent.push_back(loss);
  const auto window = static_cast<size_t>(config_.optim.loss_spike_window);
  if (recent.size() > window) recent.erase(recent.begin(), recent.end() - static_cast<std::ptrdiff_t>(window));
}

void Trainer::roll_back(const std::string& why) {
  const TrainerState at = state_;  // after the diverged step: its data read
  auto stop = [&](const std::string& more) { return Error(ExitCode::Diverged, fmt::format("{}; {}", why, more)); };
  if (at.rollbacks >= config_.optim.max_rollbacks)
    throw stop(
        fmt::format("the run has rolled back {} times already (optim.max_rollbacks = {}); lower optim.lr or resume from an "
                    "earlier checkpoint",
                    at.rollbacks, config_.optim.max_rollbacks));
  adamw_->wait();
  std::optional<RollbackPoint> point;
  for (TrainerHooks* h : hooks_)
    if ((point = h->load_rollback_point(*this))) break;
  if (!point) throw stop("there is no checkpoint to roll back to yet (optim.on_divergence = \"rollback\")");
  restore(point->state);

  // Past the data since the checkpoint: from where the diverged step stopped reading, and
  // optim.rollback_skip_steps global batches further.
  // Arithmetic, not one advance per micro-batch: rollback_skip_steps is at most the run's length or an epoch
  // (check_run_length), but that may be billions of micro-batches.
  const data::DistributedSampler& sampler = loader_->sampler();
  const uint64_t per_epoch_micro = sampler.micro_batches_per_epoch();
  const uint64_t index =
      at.sampler.index + static_cast<uint64_t>(config_.optim.rollback_skip_steps) * static_cast<uint64_t>(accumulation_);
  data::SamplerPosition p{at.sampler.epoch + index / per_epoch_micro, index % per_epoch_micro};
  const uint64_t per_epoch = sampler.samples_before({0, per_epoch_micro});
  auto absolute = [&](data::SamplerPosition q) { return q.epoch * per_epoch + sampler.samples_before(q); };
  if (absolute(p) < absolute(state_.sampler))
    p = state_.sampler;  // a checkpoint ahead in the data (another run's): from there
  RollbackMetrics r;
  r.step = at.step;
  r.to_step = state_.step;
  r.checkpoint = point->path;
  r.skipped_samples = absolute(p) - absolute(state_.sampler);
  r.rollbacks = at.rollbacks + 1;
  r.reason = why;
  loader_->seek(p);
  state_.sampler = p;
  state_.sampler_samples = static_cast<int64_t>(sampler.samples_before(p));
  state_.rollbacks = r.rollbacks;
  state_.last_rollback_to = r.to_step;
  state_.skipped_steps = at.skipped_steps;  // a count over the run's life, as rollbacks are
  state_.consecutive_nonfinite = 0;
  if (runtime_->topology().world_rank == 0)  // every rank rolled back alike
    log::warn("train: {}: rolled back to step {} ({}), skipping {} samples of data past it (rollback {} of at most {})", why,
              r.to_step, r.checkpoint, r.skipped_samples, r.rollbacks, config_.optim.max_rollbacks);
  if (metrics_) metrics_->write(to_json_line(r));
}

void Trainer::maybe_evaluate(bool force) {
  if (!evaluator_ || evaluator_->empty() || last_eval_step_ == state_.step) return;
  if (!force && !due(config_.schedule.eval_every)) return;
  const auto t0 = Clock::now();
  EvalMetrics e;
  e.val_loss = evaluator_->evaluate(&e.val_tokens, &e.by_source);
  if (sources_.size() == 1) e.by_source.clear();  // one source: its loss is val_loss
  e.step = state_.step;
  e.tokens = state_.tokens_seen;
  e.eval_time_s = seconds_since(t0);
  last_eval_step_ = state_.step;
  last_val_loss_ = e.val_loss;
  if (metrics_) metrics_->write(to_json_line(e));
  progress_->eval(e);
}

void Trainer::report(const StepMetrics& m) {
  keep_run_dir();
  if (metrics_) metrics_->write(to_json_line(m));
  progress_->step(m);
}

TrainSummary Trainer::run() {
  start();
  const auto began = Clock::now();
  TrainSummary s;
  s.first_step = state_.step;
  s.first_loss = s.last_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: no step taken (nothing was left)
  StepMetrics m;
  int64_t steps_run = 0;  // not state_.step's advance: a rollback takes the count back
  while (state_.step < total_steps_ && !stop_requested_) {
    try {
      step_once(m);
    } catch (const std::bad_alloc&) {  // what the steps allocate themselves: out of memory, not a bug
      throw Error(ExitCode::Device,
                  fmt::format("out of host memory in step {} (std::bad_alloc): a micro-batch of {} x {} tokens needs more "
                              "than this rank has; lower data.micro_batch_size or set fsdp.activation_checkpointing = true",
                              state_.step + 1, micro_batch_, config_.data.seq_len));
    }
    ++steps_run;
    m.elapsed_s = seconds_since(began);
    if (std::isnan(s.first_loss) && !m.skipped) s.first_loss = m.loss;
    s.last_loss = m.loss;
    report(m);
    if (!divergence_.empty()) {  // optim.on_divergence = rollback
      const std::string why = std::move(divergence_);
      divergence_.clear();
      roll_back(why);
      continue;
    }
    maybe_evaluate(false);
    for (TrainerHooks* h : hooks_) h->on_step_end(*this, m);
  }
  adamw_->wait();  // the last step's update, if it runs on (step_async), ends inside the run
  // A stop (preemption) is not the end: its validation would stand between the save and result.json, inside the
  // launcher's grace before its kill (a job killed there has a checkpoint and no record of the stop); the resumed start
  // validates at its own end.
  if (!stop_requested_) maybe_evaluate(true);
  progress_->finish();
  for (TrainerHooks* h : hooks_) h->on_end(*this);
  loop_seconds_ = seconds_since(began);

  s.steps = steps_run;
  s.tokens = steps_run * tokens_per_step_;
  s.tokens_total = state_.tokens_seen;
  s.last_val_loss = last_val_loss_;
  s.seconds = loop_seconds_;
  s.tokens_per_s = step_seconds_ > 0 ? static_cast<double>(s.steps * tokens_per_step_) / step_seconds_ : 0;
  s.skipped_steps = state_.skipped_steps;
  s.rollbacks = state_.rollbacks;
  s.run_dir = run_dir_;
  s.metrics_path = metrics_ ? metrics_->path() : std::string();
  return s;
}

}  // namespace shardtrain::train
