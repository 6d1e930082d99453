// The training loop (docs/training.md): builds the mesh, communicators, model, FSDP engine, AdamW and
// loaders from a TrainConfig, then runs steps of micro-batches accumulated to the global batch, with the
// LR schedule, clipping, skipping of non-finite steps, periodic validation, progress and metrics.
//
// Checkpointing plugs in from outside through TrainerHooks (the train layer does not depend on the
// checkpoint layer): on_start() may restore() a saved TrainerState and the shards, on_step_end() saves
// when checkpoint.every_n_steps says so or save_requested() is set, on_end() makes the final save.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/comm/watchdog.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/optim/schedule.hpp"
#include "shardtrain/runtime/memory_ledger.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/config.hpp"
#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/mfu.hpp"
#include "shardtrain/train/step_timeline.hpp"

namespace shardtrain::train {

// Everything beyond the shards and AdamW states that a resumed run needs to continue exactly.
struct TrainerState {
  int64_t step = 0;                 // steps taken (skipped ones included): the schedule's position
  int64_t tokens_seen = 0;          // input tokens of all ranks
  data::SamplerPosition sampler{};  // the train loader's next micro-batch
  int64_t sampler_samples = -1;     // samples of the epoch taken before it, by all ranks (-1: not recorded)
  int64_t optimizer_steps = 0;      // AdamW updates (its bias-correction count)
  int64_t consecutive_nonfinite = 0;  // skipped steps in a row (non-finite or loss spikes)
  int64_t skipped_steps = 0;
  std::map<std::string, int64_t> tokens_by_source;  // a data mixture's input tokens per source path (else empty)
  int64_t rollbacks = 0;              // optim.on_divergence = rollback: rollbacks so far
  int64_t last_rollback_to = -1;      // the step of the checkpoint the last rollback went back to (-1: none)
  std::vector<double> recent_losses;  // optim.loss_spike_factor: the last updated steps' losses, oldest first
};

// TrainerState as the JSON a checkpoint stores ({"step":..,"tokens_seen":..,"sampler":{"epoch":..,"index":..},...}),
// and back: a missing field or wrong type is a CheckpointError naming `source` and the field.
std::string trainer_state_to_json(const TrainerState& s);
TrainerState trainer_state_from_json(std::string_view json, const std::string& source);

// One rank's fault before a (1-based) step: "stall:RANK@STEP" sleeps in the loop (the watchdog thread
// still answers), "kill:RANK@STEP" raises SIGKILL on the process, "freeze:RANK@STEP" raises SIGSTOP
// (every thread stops: a rank that no longer makes MPI progress), "device_error:RANK@STEP" throws the device
// error a failing GPU gives (exit code 7), "mce:RANK@STEP" sends the rank the SIGBUS (BUS_MCEERR_AR) the kernel
// sends on an uncorrectable host memory error. "...@STEP@NODE" strikes only where the rank runs on NODE
// (failure_record::node_name: Slurm's node name, else the host name): a bad node, gone once the job moves.
struct RankFault {
  enum class Kind { Stall, Kill, Freeze, DeviceError, MachineCheck };
  Kind kind = Kind::Stall;
  int rank = 0;
  int64_t step = 1;
  std::string node;  // "" = on any node
};
const char* rank_fault_name(RankFault::Kind k);  // "stall", "kill", "freeze", "device_error", "mce"

// Faults injected for tests, from SHARDTRAIN_FAULT (docs/training.md): faults separated by ';', each
// "nan_grad:3,5,7-9" (a NaN in every rank's gradient shard after the backward of those steps),
// "slow_update:MS" (the host update on its worker thread sleeps MS ms before each shard: CPU offload's
// overlap with a slow host, which any read of a shard before its update is done turns into wrong losses) or a
// RankFault, e.g. "nan_grad:2;kill:1@5".
// "bad_data:FIRST-LAST" poisons the gradient of every step whose global batch reads any of the samples
// FIRST..LAST (0-based, counted over all ranks in the first epoch's order): bad data rather than a bad step, so
// it strikes again unless a rollback skips that data.
struct FaultPlan {
  std::vector<int64_t> nan_grad_steps;
  std::vector<std::pair<uint64_t, uint64_t>> bad_samples;  // [first, last] of epoch 0
  int slow_update_ms = 0;
  int slow_step_ms = 0;  // "slow_step:MS": every rank sleeps MS ms before each step (outside its timing), so a
                         // test can signal a run of a tiny model part-way on any machine
  std::vector<RankFault> rank_faults;
  static FaultPlan parse(const std::string& spec);  // "" = none; throws UsageError naming SHARDTRAIN_FAULT
  bool nan_grad_at(int64_t step) const;
  // Whether a global batch of epoch `epoch` covering samples [first, first + count) reads bad data.
  bool bad_data_in(uint64_t epoch, uint64_t first, uint64_t count) const;
  const RankFault* rank_fault_at(int rank, int64_t step) const;  // nullptr: none
  void check_ranks(int world_size) const;  // throws UsageError for a rank outside the world
};

class Trainer;
class ProgressView;

// A checkpoint a diverged run goes back to (optim.on_divergence = rollback), loaded by a hook.
struct RollbackPoint {
  TrainerState state;  // the checkpoint's
  std::string path;
};

// Callbacks at fixed points of the loop, on every rank (they may run collectives).
class TrainerHooks {
 public:
  virtual ~TrainerHooks() = default;
  virtual void on_start(Trainer& trainer) {}                               // after init, before step 1
  virtual void on_step_end(Trainer& trainer, const StepMetrics& metrics) {}  // after each step's update and eval
  virtual void on_end(Trainer& trainer) {}                                 // after the last step
  // The run diverged and optim.on_divergence = rollback: load the checkpoint to go back to into the engine and
  // the optimizer and return its state, or nullopt when this hook has none (the first hook that has one wins).
  virtual std::optional<RollbackPoint> load_rollback_point(Trainer& trainer) { return std::nullopt; }
};

struct TrainerOptions {
  FaultPlan faults;
  std::string config_source;  // shown in the log: "configs/tiny-cpu.toml + overrides"
  // Evaluation only (`shardtrain evaluate`): the mesh, model, engine and held-out loaders, nothing else: no
  // run directory or metrics file, no AdamW states, no training loader; run() is refused. The loaders read
  // `eval_split` of every source, `eval_micro_batches` micro-batches per rank each (0: the whole split).
  bool evaluation_only = false;
  data::DatasetSplit eval_split = data::DatasetSplit::Validation;
  int64_t eval_micro_batches = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  double first_loss = 0, last_loss = 0;
  double last_val_loss = 0;  // NaN when never evaluated
  double seconds = 0;
  double tokens_per_s = 0;   // tokens / time spent in steps
  int64_t skipped_steps = 0;
  int64_t rollbacks = 0;     // over the run's life (optim.on_divergence = rollback)
  std::string run_dir;
  std::string metrics_path;
};

class Trainer {
 public:
  // Collective over the world: validates the config against it, makes the run directory (rank 0
  // writes config.toml there), opens the dataset, builds everything and initializes the parameters.
  Trainer(const Runtime& runtime, const TrainConfig& config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_hooks(TrainerHooks* hooks);  // not owned; called in the order added
  TrainSummary run();

  // Validation loss on the held-out split (collective); NaN when evaluation is off or impossible. Each
  // source's held-out samples give its own loss (into by_source, one entry per evaluated source), and with
  // a data mixture the result is their mean in the mixture's weights: the expected loss of a token drawn as
  // training draws them. `bytes_per_id` (a tokenizer's byte length of each id, 0 for special tokens) adds
  // up the counted targets' bytes into by_source, for bits per byte.
  double evaluate(int64_t* counted_tokens = nullptr, std::vector<SourceLoss>* by_source = nullptr,
                  const std::vector<uint32_t>* bytes_per_id = nullptr);

  const TrainerState& state() const { return state_; }
  // Continues from `s` (after the shards and AdamW states were loaded): seeks the loader, sets AdamW's step.
  void restore(const TrainerState& s);
  void request_save() { save_requested_ = true; }          // e.g. from a signal handler's flag, or a hook
  bool save_requested() const { return save_requested_; }
  void clear_save_request() { save_requested_ = false; }
  void request_stop() { stop_requested_ = true; }          // ends the loop after the current step
  // One more line of metrics.jsonl (a JSON object with a "kind"), from a hook: written by the rank that keeps
  // the file, ignored on the others.
  void record_event(const std::string& json_line) {
    if (metrics_) metrics_->write(json_line);
  }

  const TrainConfig& config() const { return config_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& resolved_config_toml() const { return resolved_toml_; }
  // With CPU offload on a GPU a step returns while its host update still runs (the next step's forward
  // waits for it unit by unit). These two wait for the whole update first, so a hook that saves, loads or
  // reads the shards sees them settled.
  fsdp::FsdpEngine& engine() {
    if (adamw_) adamw_->wait();
    return *engine_;
  }
  optim::AdamW& optimizer();  // InternalError in evaluation_only mode, which has none
  // The held-out loaders evaluate() reads: one per source with enough samples, each with its micro-batches
  // per rank and its sequences over all ranks.
  struct EvalPlan {
    std::string path;
    int64_t micro_batches = 0;  // per rank
    int64_t sequences = 0;      // over all ranks
    int64_t samples = 0;        // in the split (the last partial batch is not read)
    double weight = 1;          // in the mixture
  };
  std::vector<EvalPlan> eval_plan() const;
  const optim::LrSchedule& schedule() const { return *schedule_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  MeshComms& comms() { return *comms_; }
  const Runtime& runtime() const { return *runtime_; }
  const data::TokenDataset& dataset() const { return *sources_.front().dataset; }  // the first of sources()
  const std::vector<data::MixtureComponent>& sources() const { return sources_; }   // data.path or data.mixture
  int64_t total_steps() const { return total_steps_; }
  int accumulation_steps() const { return accumulation_; }
  const MfuMeter& mfu_meter() const { return mfu_; }

 private:
  void step_once(StepMetrics& m);
  // Whether step `m` was a spike: its loss above optim.loss_spike_factor x the recent mean (window full).
  bool loss_spike(double loss, double* mean) const;
  void remember_loss(double loss);
  // After a divergence with optim.on_divergence = rollback: back to a hook's checkpoint, past the data read
  // since, or the Diverged error when there is none or max_rollbacks are spent.
  void roll_back(const std::string& why);
  // The micro-batch as the model reads it: host views on the CPU backend; on a GPU, copied into device
  // buffers (asynchronously, in stream order) that the next call reuses.
  model::Batch model_batch(data::MicroBatch& mb);
  void maybe_evaluate(bool force);
  void report(const StepMetrics& m);
  bool due(int64_t every) const { return every > 0 && state_.step % every == 0; }

  const Runtime* runtime_;
  TrainConfig config_;
  TrainerOptions options_;
  std::string run_dir_, resolved_toml_;
  std::unique_ptr<DeviceMesh> mesh_;
  // Before comms_, so it is destroyed after them: a communicator's destructor unregisters itself from the
  // watchdog (NCCL's asynchronous-error source).
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::unique_ptr<MeshComms> comms_;
  std::unique_ptr<ops::Ops> ops_;
  DeviceBuffer batch_ids_, batch_targets_, batch_docs_;  // the micro-batch on the GPU
  std::unique_ptr<model::LlamaModel> model_;
  MemoryLedger ledger_;
  std::unique_ptr<fsdp::FsdpEngine> engine_;
  std::unique_ptr<optim::AdamW> adamw_;
  optim::GradNorm grad_norm_;
  std::vector<data::MixtureComponent> sources_;
  std::unique_ptr<data::Loader> loader_;
  struct EvalSource {  // one per source with held-out samples
    std::unique_ptr<data::Loader> loader;
    int64_t micro_batches = 0;
    double weight = 1;
  };
  std::vector<EvalSource> eval_sources_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<ProgressView> progress_;
  std::vector<TrainerHooks*> hooks_;
  TrainerState state_;
  int micro_batch_ = 1, accumulation_ = 1;
  bool async_update_ = false;  // AdamW::step_async (CPU offload on a GPU)
  int64_t total_steps_ = 0, tokens_per_step_ = 0;
  double flops_per_token_ = 0;
  MfuMeter mfu_;  // the peak MFU is reported against, labelled
  std::unique_ptr<StepTimeline> timeline_;  // the GPU's busy and idle time around the host's phases
  int64_t last_eval_step_ = -1;
  double last_val_loss_;
  bool save_requested_ = false, stop_requested_ = false;
  std::string divergence_;  // set by step_once when the run diverged and should roll back: why
  double loop_seconds_ = 0, step_seconds_ = 0;
};

}  // namespace shardtrain::train
