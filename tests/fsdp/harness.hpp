// A small training driver for the FSDP tests: a tiny Llama, deterministic synthetic batches, and
// steps of zero_grad / micro-batches / clip / AdamW on any communicator (MPI_COMM_WORLD for the run
// under test, MPI_COMM_SELF for the one-rank reference on the same global batch).
#pragma once

#include <mpi.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/optim/adamw.hpp"

namespace shardtrain::testing_fsdp {

model::LlamaConfig tiny_config();

struct RunOptions {
  model::LlamaConfig model = tiny_config();
  fsdp::FsdpConfig fsdp;
  int steps = 3;
  int global_batch = 8;   // sequences per step, split evenly over the world's ranks
  int micro_batches = 2;  // per rank per step
  int seq = 9;
  double max_grad_norm = 1.0;
  double lr = 1e-2;
  // Checkpoint hooks (tests/checkpoint): run steps [first_step, steps), optionally after loading a
  // checkpoint, and call `after_step(step, engine, adamw)` after each step's update.
  int first_step = 0;
  std::function<void(fsdp::FsdpEngine&, optim::AdamW&)> before_first_step;
  std::function<void(int, fsdp::FsdpEngine&, optim::AdamW&)> after_step;
  std::function<void(int)> after_micro_batch;
  bool gather_params =
      true;  // fill RunResult::params and layouts at the end (collectives over every unit)  // after each forward_backward, with the micro-batch's index
  // fsdp.grads_in_activation_memory applies, as train::engine_config has it, to one micro-batch per step; true:
  // left on with several (the engine moves the shards out at the first micro-batch that is not a step's last).
  bool grads_in_activations_with_accumulation = false;
  // On the overlapped schedule, the update in two parts with the next step's first units gathered between them
  // (FsdpEngine::gather_ahead), as the trainer does it.
  bool gather_ahead = true;
};

struct RunResult {
  std::vector<double> losses;                // global mean loss per step
  std::map<int, std::vector<float>> params;  // full final value of every parameter
  std::vector<double> grad_norms;
  int unit_sum_norms = 0;            // steps whose norm came from the engine's per-unit device sums
  double unit_sum_norm_diff = 0;     // their largest relative difference from the host shards' norm
  int64_t sharded_param_bytes = 0;   // ledger, this rank
  int64_t unsharded_param_peak = 0;  // ledger, this rank
  int64_t comm_buffer_peak = 0;      // ledger, this rank, during training: staging, uploads
  int64_t unsharded_grad_peak = 0;   // ledger, this rank
  int64_t sharded_grad_bytes = 0;    // ledger, this rank, at the end: gradient shards in memory of their own
  int grads_in_arena = 0;            // units whose gradient shard is in the model's activation arena at the end
  bool grads_in_activations = false;  // the engine's FsdpEngine::grads_in_activations() at the end
  int max_outstanding = 0;           // non-root units gathered at once
  int forward_on_demand = 0;         // units not prefetched when their forward began
  std::vector<fsdp::FlatLayout> layouts;
  std::vector<bool> unit_is_root;
  uint64_t shard_gather_bytes = 0, shard_reduce_scatter_bytes = 0, replicate_all_reduce_bytes = 0;
};

// SHARDTRAIN_TEST_DEVICE=cuda: every run on the GPU (CudaOps, device shards, MPI staging device buffers).
bool test_on_gpu();

// Trains `options.steps` steps on `world` (every rank of it takes its share of each global batch).
RunResult run_training(MPI_Comm world, int ranks_per_node, const RunOptions& options);

}  // namespace shardtrain::testing_fsdp
