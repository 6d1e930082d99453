// What FSDP will hold and send, computed without running anything: the unit layout of a model on a
// mesh, the bytes each rank keeps, and the bytes each collective moves per micro-batch. `shardtrain
// plan` prints it; the accounting tests check that the engine's ledger and counters agree with it.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/ops/cuda_ops.hpp"

namespace shardtrain::fsdp {

struct UnitPlan {
  UnitSpec spec;
  FlatLayout layout;
};

struct FsdpPlan {
  MeshLayout mesh;
  std::vector<UnitPlan> units;  // units holding parameters
  // Per rank.
  int64_t sharded_param_bytes = 0;    // fp32 master shards: sum of 4 * N/S
  int64_t sharded_state_bytes = 0;    // fp32 param, grad, exp_avg, exp_avg_sq: 16 * N/S
  int64_t unsharded_param_bytes = 0;  // gathered param_dtype buffers at most at once
  int64_t unsharded_grad_bytes = 0;   // fp32 full gradient buffers alive at once (reduce_each, all_reduce_last:
                                      // the root's, the unit's in backward and the one whose reduction was
                                      // issued last, held back one reduction; no_sync: every unit's)
  int64_t offload_upload_bytes = 0;   // with offload_params: the fp32 device copy of a master shard between
                                      // its upload and its cast (on the upload stream, one at a time): the
                                      // largest shard
  int64_t comm_scratch_bytes = 0;     // fixed scratch on the compute device, one largest shard or unit each:
                                      // the reduce-scatter output (S > 1; two with replicas), the fp32 stage (a reduce_dtype
                                      // other than fp32, or offload with replicas), the reduce_dtype copy
                                      // of a full gradient (reduce_dtype other than fp32)
  int64_t offload_stage_bytes = 0;    // with offload_params: the pinned host stage (one largest shard)
  // Per micro-batch, per rank, as the communicators count them (with no_sync, the reductions happen once
  // per step, on the last micro-batch).
  uint64_t shard_all_gather_bytes = 0;
  uint64_t shard_reduce_scatter_bytes = 0;
  uint64_t replicate_all_reduce_bytes = 0;
};

// One rank (a 1 x 1 mesh), fp32 reductions and shards on the compute device: a unit's gradient shard is its
// whole gradient, so backward accumulates into the shard itself (no full gradient buffer, no reduction copy).
inline bool grads_live_in_shards(const FsdpConfig& config, int shard_size, int replicate_size) {
  return shard_size == 1 && replicate_size == 1 && config.reduce_dtype == DType::F32 && !config.offload_params;
}

// Throws ConfigError when the mesh does not fit (the same errors as the engine).
FsdpPlan plan_fsdp(const model::ModelSpec& spec, const FsdpConfig& config, int world_size, int ranks_per_node);

// Memory per rank for micro-batches of `micro_batch` x `seq` tokens on the CUDA backend: the plan's sharded
// state (in host memory with offload_params) and buffers, the activations of the model's activation plan
// (config.activation_checkpointing), and the backend's op scratch (the fused loss's chunk, kernel and
// cuBLASLt workspaces). What `shardtrain plan` and `shardtrain check --gpu-memory` hold against a GPU.
struct MemoryEstimate {
  double state = 0;                 // fp32 param, grad, exp_avg, exp_avg_sq shards (less the grads in activation memory)
  double grads_in_activations = 0;  // gradient shards placed in activation memory backward is done with
  double buffers = 0;  // gathered parameters, full gradients, communication scratch, offload uploads
  double activations = 0;
  double op_scratch = 0;
  double device = 0;  // the total on the GPU
  double host = 0;    // with offload_params: the state and the pinned stage
};
// Where the gradient shards go (config.grads_in_activation_memory, fsdp/grad_placement.hpp), as the engine
// decides it for micro-batches of the activation plan's shape: memory of their own, the activation memory that
// backward is done with, and the stage for early gradients (whole when used). Without the option: all their own.
struct GradShardMemory {
  int64_t own = 0, in_activations = 0, stage = 0;
};
GradShardMemory place_grad_shards(const model::ModelSpec& spec, const FsdpConfig& config, const FsdpPlan& plan,
                                  const model::ActivationPlan& act);
MemoryEstimate estimate_memory(const model::ModelSpec& spec, const FsdpConfig& config, const FsdpPlan& plan,
                               int64_t micro_batch, int64_t seq);
// The op scratch part of it, item by item.
ops::CudaScratchBytes op_scratch_bytes(const model::ModelSpec& spec, DType param_dtype, int64_t micro_batch, int64_t seq);

}  // namespace shardtrain::fsdp
