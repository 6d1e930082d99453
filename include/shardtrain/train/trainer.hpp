// The training loop (docs/training.md): from a TrainConfig, a Replica (mesh, communicators, model, FSDP engine:
// replica.hpp), AdamW, the training loader and an Evaluator for validation (evaluator.hpp); then steps of
// micro-batches accumulated to the global batch, with the LR schedule, clipping, skipping of non-finite steps,
// periodic validation, progress and metrics. Test faults (SHARDTRAIN_FAULT) come in through faults.hpp.
//
// Checkpointing plugs in from outside through TrainerHooks (train/checkpointing.hpp, the one part of the layer
// that uses the checkpoint library): on_start() may restore() a saved TrainerState and the shards,
// on_step_end() saves when checkpoint.every_n_steps says so or save_requested() is set, on_end() makes the
// final save.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/data/loader.hpp"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/optim/schedule.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/config.hpp"
#include "shardtrain/train/evaluator.hpp"
#include "shardtrain/train/faults.hpp"
#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/mfu.hpp"
#include "shardtrain/train/replica.hpp"
#include "shardtrain/train/step_timeline.hpp"

namespace shardtrain::train {

// Everything beyond the shards and AdamW states that a resumed run needs to continue exactly.
struct TrainerState {
  int64_t step = 0;                   // steps taken (skipped ones included): the schedule's position
  int64_t tokens_seen = 0;            // input tokens of all ranks
  data::SamplerPosition sampler{};    // the train loader's next micro-batch
  int64_t sampler_samples = -1;       // samples of the epoch taken before it, by all ranks (-1: not recorded)
  int64_t optimizer_steps = 0;        // AdamW updates (its bias-correction count)
  int64_t consecutive_nonfinite = 0;  // skipped steps in a row (non-finite or loss spikes)
  int64_t skipped_steps = 0;
  std::map<std::string, int64_t> tokens_by_source;  // a data mixture's input tokens per source path (else empty)
  int64_t rollbacks = 0;                            // optim.on_divergence = rollback: rollbacks so far
  int64_t last_rollback_to = -1;                    // the step of the checkpoint the last rollback went back to (-1: none)
  std::vector<double> recent_losses;                // optim.loss_spike_factor: the last updated steps' losses, oldest first
};

// TrainerState as the JSON a checkpoint stores ({"step":..,"tokens_seen":..,"sampler":{"epoch":..,"index":..},...}),
// and back: a missing field or wrong type is a CheckpointError naming `source` and the field.
std::string trainer_state_to_json(const TrainerState& s);
TrainerState trainer_state_from_json(std::string_view json, const std::string& source);

class Trainer;
class DirLock;
class ProgressView;
class StartupWatch;

// A checkpoint a diverged run goes back to (optim.on_divergence = rollback), loaded by a hook.
struct RollbackPoint {
  TrainerState state;  // the checkpoint's
  std::string path;
};

// Callbacks at fixed points of the loop, on every rank (they may run collectives).
class TrainerHooks {
 public:
  virtual ~TrainerHooks() = default;
  virtual void on_start(Trainer& trainer) {}                                 // after init, before step 1
  virtual void on_step_end(Trainer& trainer, const StepMetrics& metrics) {}  // after each step's update and eval
  virtual void on_end(Trainer& trainer) {}                                   // after the last step
  // The run diverged and optim.on_divergence = rollback: load the checkpoint to go back to into the engine and
  // the optimizer and return its state, or nullopt when this hook has none (the first hook that has one wins).
  virtual std::optional<RollbackPoint> load_rollback_point(Trainer& trainer) { return std::nullopt; }
  // Host values every rank must agree on at each step (a signal flag), summed over the world in the step's own
  // all-reduce, so that a hook issues no collective of its own at each step: agreed_slots() doubles, filled by
  // contribute() on every rank just before that all-reduce (after the step's backward, before its update), the
  // sums handed to agreed() right after it, before on_step_end. The count must not change during a run.
  virtual size_t agreed_slots() const { return 0; }
  virtual void contribute(std::span<double> mine) {}
  virtual void agreed(std::span<const double> sums) {}
};

struct TrainerOptions {
  FaultPlan faults;
  std::string config_source;  // shown in the log: "configs/tiny-cpu.toml + overrides"
  // When set, the backend's ops pass through it before the replica is built, and the step runs on what it returns
  // (`bench step --ops-profile`: ops::make_timed_ops). Unset: the backend's ops, untouched.
  std::function<std::unique_ptr<ops::Ops>(std::unique_ptr<ops::Ops>)> wrap_ops;
  // The datasets, opened already, and the run's length checked on them (check_run_length: train does both before it
  // claims the checkpoint directory); empty: the trainer opens data.path or data.mixture itself and checks.
  std::vector<data::MixtureComponent> sources;
  // Whether the run directory existed before this start made anything in it: train looks before the checkpoint
  // directory's claim creates it; unset, the trainer looks itself. Into a directory that existed nothing is written
  // before start() has validated the run (run_dir.hpp).
  std::optional<bool> run_dir_existed;
  // The start-up's watch (startup.hpp), owned by the command: the trainer and its hooks name their stages on it until
  // the first step. None: nothing is timed but what the collective watchdog watches.
  StartupWatch* startup = nullptr;
};

struct TrainSummary {
  int64_t first_step = 0;    // the run's step when this start began (0, or the step resumed from)
  int64_t steps = 0;         // steps this start took (rolled-back ones included)
  int64_t tokens = 0;        // input tokens of those steps, all ranks
  int64_t tokens_total = 0;  // input tokens over the run's life (TrainerState::tokens_seen), resumed starts included
  double first_loss = 0, last_loss = 0;
  double last_val_loss = 0;  // NaN when never evaluated
  double seconds = 0;
  double tokens_per_s = 0;  // tokens / time spent in steps
  int64_t skipped_steps = 0;
  int64_t rollbacks = 0;  // over the run's life (optim.on_divergence = rollback)
  std::string run_dir;
  std::string metrics_path;
};

class Trainer {
 public:
  // Collective over the world: validates the config against it, opens the datasets and checks the run's length,
  // makes the run directory (rank 0 writes config.toml into one it made; into one that existed, start() does),
  // builds everything and initializes the parameters. Out of host memory while building is a device error (7)
  // naming what was being allocated.
  Trainer(const Runtime& runtime, const TrainConfig& config, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_hooks(TrainerHooks* hooks);  // not owned; called in the order added
  // The hooks' on_start (a checkpoint directory's checks, the resume), then the run directory is the run's: rank 0
  // writes config.toml (when start-up left it to now), removes an earlier start's result.json, and opens the metrics
  // (the hooks' events so far go first). A start refused before that has written nothing into the directory.
  // Called by run() when it was not called before.
  void start();
  TrainSummary run();

  const TrainerState& state() const { return state_; }
  // Continues from `s` (after the shards and AdamW states were loaded): seeks the loader, sets AdamW's step.
  void restore(const TrainerState& s);
  void request_save() { save_requested_ = true; }  // e.g. from a signal handler's flag, or a hook
  bool save_requested() const { return save_requested_; }
  void clear_save_request() { save_requested_ = false; }
  void request_stop() { stop_requested_ = true; }  // ends the loop after the current step
  // One more line of metrics.jsonl (a JSON object with a "kind"), from a hook: written by the rank that keeps
  // the file, ignored on the others.
  void record_event(const std::string& json_line);

  // Rank 0 (others: true): whether the run directory is still this run's, keeping it so. Removed while the run held it
  // (`rm -rf RUN_DIR`, which takes its lock, config.toml and metrics with it), it is made again, locked again, given
  // config.toml again and new metrics, with a warning; a metrics file removed alone is opened again. False once another
  // run claimed it meanwhile: this run then writes nothing more there (no metrics, no result.json), so the two runs'
  // files never sit side by side. Called before each step's metrics line, and before result.json.
  bool keep_run_dir();

  const TrainConfig& config() const { return config_; }
  const std::string& run_dir() const { return run_dir_; }
  const std::string& resolved_config_toml() const { return resolved_toml_; }
  // With CPU offload on a GPU a step returns while its host update still runs (the next step's forward
  // waits for it unit by unit). These two wait for the whole update first, so a hook that saves, loads or
  // reads the shards sees them settled.
  fsdp::FsdpEngine& engine() {
    adamw_->wait();
    return *engine_;
  }
  optim::AdamW& optimizer() {
    adamw_->wait();
    return *adamw_;
  }
  // The validation (schedule.eval_batches > 0): null when it is off.
  Evaluator* evaluator() { return evaluator_.get(); }
  Replica& replica() { return *replica_; }
  const optim::LrSchedule& schedule() const { return *schedule_; }
  const DeviceMesh& mesh() const { return replica_->mesh(); }
  MeshComms& comms() { return *comms_; }
  const Runtime& runtime() const { return *runtime_; }
  StartupWatch* startup_watch() const { return options_.startup; }
  const data::TokenDataset& dataset() const { return *sources_.front().dataset; }  // the first of sources()
  const std::vector<data::MixtureComponent>& sources() const { return sources_; }  // data.path or data.mixture
  int64_t total_steps() const { return total_steps_; }
  int accumulation_steps() const { return accumulation_; }
  const MfuMeter& mfu_meter() const { return mfu_; }

 private:
  // A step's micro-batches and what they count. The next step's are read while this one runs (read ahead), so
  // their counts travel in this step's one world all-reduce (loop.cpp).
  struct StepInput {
    std::vector<data::MicroBatch> mbs;
    data::SamplerPosition start;   // the loader's position before them
    data::SamplerPosition end;     // and after them: the state's position once the step is taken
    std::vector<int64_t> counted;  // the targets that take a loss, then with a mixture each source's input tokens
    int64_t global_tokens = 0;     // counted[0] over all ranks (once reduced): the loss is the mean over these
  };
  struct StepResult;
  void make_run_dir();  // the run directory, the failure records, and config.toml in a new directory
  void write_config_toml() const;
  void commit_run_dir();  // start(): config.toml in a directory that existed, result.json cleared, the metrics opened
  void log_start(int64_t steps_per_epoch) const;
  void step_once(StepMetrics& m);
  // The next A micro-batches off the loader, counted on this rank only (no collective).
  StepInput read_micro_batches();
  // The step's input: the one read ahead, or (first step, after a restore or rollback) read now and its counts
  // all-reduced on their own.
  StepInput take_step_input();
  void drop_read_ahead();  // its micro-batches back to the loader (the loader is about to seek)
  StepResult forward_backward(StepInput& in);
  bool decide_skip(const StepResult& r, int64_t step_number);  // whether the step is skipped; logs it, or stops the run
  optim::AdamW::AsyncTimes update(const StepResult& r);
  void advance(StepInput& in, int64_t step_number);
  // Whether step `m` was a spike: its loss above optim.loss_spike_factor x the recent mean (window full).
  bool loss_spike(double loss, double* mean) const;
  void remember_loss(double loss);
  // After a divergence with optim.on_divergence = rollback: back to a hook's checkpoint, past the data read
  // since, or the Diverged error when there is none or max_rollbacks are spent.
  void roll_back(const std::string& why);
  void maybe_evaluate(bool force);
  void report(const StepMetrics& m);
  bool due(int64_t every) const { return every > 0 && state_.step % every == 0; }

  const Runtime* runtime_;
  TrainConfig config_;
  TrainerOptions options_;
  std::string run_dir_, resolved_toml_;
  std::unique_ptr<DirLock> run_dir_lock_;  // rank 0's: one run writes the run directory at a time
  std::unique_ptr<Replica> replica_;
  // The replica's parts the loop uses at every step (owned by replica_).
  CollectiveWatchdog* watchdog_ = nullptr;
  MeshComms* comms_ = nullptr;
  ops::Ops* ops_ = nullptr;
  fsdp::FsdpEngine* engine_ = nullptr;
  std::unique_ptr<optim::AdamW> adamw_;
  optim::GradNorm grad_norm_;
  std::vector<data::MixtureComponent> sources_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<Evaluator> evaluator_;  // null: no validation
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<MetricsWriter> metrics_;   // rank 0's, from start() on
  std::vector<std::string> pending_events_;  // rank 0: record_event() lines before the metrics opened
  bool started_ = false, config_written_ = false;
  bool run_dir_lost_ = false;  // rank 0: another run claimed the run directory after it was removed (keep_run_dir)
  std::unique_ptr<ProgressView> progress_;
  std::vector<TrainerHooks*> hooks_;
  TrainerState state_;
  // The next step's input, read during this step with its counts reduced in this step's all-reduce; empty before
  // the first step, after the last, and after a restore (the loader moved).
  std::optional<StepInput> read_ahead_;
  std::vector<double> step_values_;  // the step's all-reduce buffer (forward_backward), kept to allocate once
  int micro_batch_ = 1, accumulation_ = 1;
  bool async_update_ = false;  // AdamW::step_async (CPU offload on a GPU)
  int64_t total_steps_ = 0, tokens_per_step_ = 0;
  double flops_per_token_ = 0;
  MfuMeter mfu_;                            // the peak MFU is reported against, labelled
  std::unique_ptr<StepTimeline> timeline_;  // the GPU's busy and idle time around the host's phases
  int64_t last_eval_step_ = -1;
  double last_val_loss_;
  bool save_requested_ = false, stop_requested_ = false;
  std::string divergence_;  // set by step_once when the run diverged and should roll back: why
  double loop_seconds_ = 0, step_seconds_ = 0;
};

}  // namespace shardtrain::train
