// The one typed configuration of a training run (docs/training.md): sections model, fsdp, optim,
// schedule, data, checkpoint, logging. Loaded from TOML (config_io.hpp), adjusted by the seeds'
// Hugging Face files (hf_configs.hpp) and --section.key overrides, validated here in one place, printed
// resolved at start and written to the run directory (and, later, into every checkpoint).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/checkpoint/checkpoint.hpp"

#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/mixture.hpp"
#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/model/config.hpp"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/optim/schedule.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace shardtrain::train {

// [fsdp]: the engine's options plus the world the config was written for (Accelerate's num_processes
// and num_machines; 0 = any), checked against the MPI world at start.
struct FsdpSection {
  fsdp::FsdpConfig engine;
  int num_processes = 0;
  int num_machines = 0;
  double collective_timeout = 600;  // seconds a collective may take before the watchdog ends the job; 0 = off
  // Seconds a stage of the start-up may take (train/startup.hpp): a rank held up before the first step, or one that
  // never reaches a start-up collective, ends the job with exit 10 instead of holding it until its time limit. Longer
  // than a collective's: a stage does work too (a large model's initialization, NCCL's start on many nodes). 0 = off
  double startup_timeout = 1800;
  // Who carries the collectives: auto = NCCL when every rank has a GPU of its own, else MPI (host memory, or
  // device memory staged through pinned host buffers when ranks share a GPU).
  CommBackendPreference comm_backend = CommBackendPreference::Auto;
};

// What a diverged run does (optim.on_divergence): stop with exit 9, or go back to its newest checkpoint and
// skip the data that led there (docs/training.md, "Divergence").
enum class DivergencePolicy { Stop, Rollback };
const char* divergence_policy_name(DivergencePolicy p);  // "stop", "rollback"

// [optim]: AdamW, clipping, and what to do about bad steps.
struct OptimSection {
  optim::AdamWConfig adamw;
  double max_grad_norm = 1.0;  // clip_grad_norm_ max_norm; 0 = no clipping
  // A skipped step is one with a non-finite loss or gradient norm, or (loss_spike_factor > 0) a loss above
  // loss_spike_factor x the mean loss of the last loss_spike_window steps that updated. This many skipped
  // steps in a row is a divergence.
  int max_consecutive_nonfinite = 5;
  double loss_spike_factor = 0;  // 0 = no spike detection; else > 1
  int loss_spike_window = 100;   // updated steps whose mean loss a spike is measured against
  DivergencePolicy on_divergence = DivergencePolicy::Stop;
  int max_rollbacks = 3;            // rollbacks in the run's life (resumes included) before a divergence stops it
  int64_t rollback_skip_steps = 0;  // global batches skipped past the diverged step's data, beyond those it read
};

// [schedule]: the LR schedule, when the run stops, and when it evaluates.
struct ScheduleSection {
  optim::ScheduleConfig lr;
  int64_t max_steps = 0;     // optimizer steps; 0 = no limit from this key
  int64_t max_tokens = 0;    // input tokens of all ranks; 0 = no limit
  int64_t epochs = 0;        // passes over the training split; 0 = no limit
  int64_t eval_every = 0;    // validation loss every N steps (and at the end); 0 = only at the end
  int64_t eval_batches = 8;  // micro-batches per rank per evaluation; 0 = no evaluation at all
};

// [data]
struct DataSection {
  std::string path;                  // the dataset (prepare-data's HDF5 file); relative to the working directory
  std::vector<std::string> mixture;  // or several, "PATH:WEIGHT" each, sampled in those shares (data/mixture.hpp)
  // The datasets to train on: `path` with weight 1, or the parsed `mixture` (ConfigError naming the entry).
  std::vector<data::MixtureEntry> sources() const;
  std::string describe() const;  // `path`, or "a mixture of N datasets (P1, P2...)" for messages
  data::BatchLayout layout = data::BatchLayout::Packed;
  // packed: attention and RoPE positions restart at each document (false: one causal sequence per row, as
  // torchtitan and Hugging Face treat packed rows)
  bool document_mask = true;
  int seq_len = 512;
  int micro_batch_size = 0;    // per rank; 0 = global_batch_size / world (no accumulation)
  int global_batch_size = 64;  // sequences per optimizer step, all ranks and micro-batches together
  uint64_t seed = 1234;        // sampler shuffle
  bool shuffle = true;
  int prefetch = 4;  // micro-batches the loader thread keeps ready (1..kMaxPrefetch)
};

// "PATH:WEIGHT" entries parsed as data.mixture is: each entry's weight, no file twice however spelled, a finite sum.
// ConfigError naming `field(i)` for entry i ("data.mixture[1]"; `dataset info`'s "argument 2").
std::vector<data::MixtureEntry> parse_mixture(const std::vector<std::string>& entries,
                                              const std::function<std::string(size_t)>& field);
// data.prefetch's bound: each micro-batch kept ready is a buffer made at start.
inline constexpr int kMaxPrefetch = 1024;

// The checkpoint layer's names (SHARDED_STATE_DICT, FULL_STATE_DICT; also sharded|full|LOCAL_STATE_DICT).
using checkpoint::parse_state_dict_type;
using checkpoint::state_dict_type_name;
using checkpoint::StateDictType;

// [checkpoint]: read and validated here; the checkpoint layer acts on it through Trainer hooks.
struct CheckpointSection {
  std::string dir;            // "" = <run_dir>/checkpoints
  int64_t every_n_steps = 0;  // 0 = no periodic saves
  int keep_last = 0;          // 0 = keep all
  int64_t keep_every = 0;     // checkpoints at multiples of this step survive keep_last (0 = none)
  StateDictType state_dict_type = StateDictType::Sharded;
  std::string resume;     // "" = start fresh; "auto" = the newest complete checkpoint in dir; or a path
  std::string init_from;  // weights to start from when not resuming: a checkpoint, consolidated .h5 or HF directory
  bool cpu_ram_efficient_loading = false;  // init_from: one rank per node reads, the others receive
  bool async_save = false;     // periodic sharded saves write on a thread while training goes on (checkpoint::AsyncSave)
  int max_failed_saves = 3;    // periodic saves that may fail in a row (disk full...) while training goes on; 0 = none
  double save_timeout = 3600;  // seconds a save may take before the job is ended (a stuck file system); 0 = off
};

// [logging]
struct LoggingSection {
  std::string name;     // run name; "" = the config file's stem
  std::string run_dir;  // "" = <runs_root>/<name>-<YYYYmmdd-HHMMSS>
  std::string runs_root = "runs";
  int64_t log_every = 10;  // plain progress lines (no terminal) every N steps
  ProgressStyle progress = ProgressStyle::Auto;
  std::string metrics_file = "metrics.jsonl";  // inside the run directory
  bool tensorboard = true;                     // also TensorBoard event files in the run directory (train/tensorboard.hpp)
  double peak_flops = 0;                       // per rank, FLOP/s, for MFU; 0 = measure an sgemm at start
};

struct TrainConfig {
  model::LlamaConfig model;
  FsdpSection fsdp;
  OptimSection optim;
  ScheduleSection schedule;
  DataSection data;
  CheckpointSection checkpoint;
  LoggingSection logging;

  // Every check that needs no MPI world: throws ConfigError naming section.key and what was expected.
  void validate() const;
  // The part of validate() that `shardtrain evaluate` needs: the model, fsdp and data keys (and
  // checkpoint.save_timeout, a load's deadline), not the schedule, optimizer, checkpointing, logging or the training
  // batch's rules (global_batch_size a multiple of the micro-batch): evaluation takes no step.
  void validate_for_evaluation() const;
  // The checks against the running world (num_processes, num_machines, batch divisibility, the mesh).
  void validate_for_world(int world_size, int node_count) const;
  // Those evaluate needs: num_processes, num_machines, and at least one sequence per rank in a micro-batch.
  void validate_evaluation_for_world(int world_size, int node_count) const;
  // The model's parameter count, computed from its sizes in floating point (no overflow), before anything exists.
  double parameter_estimate() const;
  // Before anything is allocated: throws ConfigError, naming the size key furthest above its usual value, when
  // one rank's share of the fp32 training state (16 bytes per parameter over `shard_ranks`) cannot fit
  // `memory_bytes`, the memory `memory_name` has for this rank.
  void validate_memory(int shard_ranks, double memory_bytes, std::string_view memory_name) const;
  // Micro-batch size per rank and accumulation steps for `world_size` data-parallel ranks.
  int micro_batch_size_for(int world_size) const;
  int accumulation_steps_for(int world_size) const;

 private:
  // The parts validate() and validate_for_evaluation() share, written once.
  void validate_finite_floats(bool evaluation) const;  // evaluation: only the keys it reads
  void validate_shared() const;
  void validate_mesh_for_world(int world_size, int node_count) const;
};

// The parameter count of a model's sizes, in floating point (no overflow), before any spec exists.
double model_parameter_estimate(const model::LlamaConfig& model);
// "model.KEY = VALUE" of the size key furthest above its usual value (LlamaConfig's defaults): what a message names
// when the model is too large for something.
std::string largest_model_size_key(const model::LlamaConfig& model);
// Sizes no machine could hold or describe: at most 65536 layers, int32 positions, 2^50 parameters. Throws
// ConfigError naming the key (for the parameters, the size key furthest above its usual value).
void validate_model_size(const model::LlamaConfig& model);

bool operator==(const TrainConfig& a, const TrainConfig& b);  // field by field, via the printed form

}  // namespace shardtrain::train
