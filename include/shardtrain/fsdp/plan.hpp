// What FSDP will hold and send, computed without running anything: the unit layout of a model on a
// mesh, the bytes each rank keeps, and the bytes each collective moves per micro-batch. `shardtrain
// plan` prints it; the accounting tests check that the engine's ledger and counters agree with it.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"

namespace shardtrain::fsdp {

struct UnitPlan {
  UnitSpec spec;
  FlatLayout layout;
};

struct FsdpPlan {
  MeshLayout mesh;
  std::vector<UnitPlan> units;  // units holding parameters
  // Per rank.
  int64_t sharded_param_bytes = 0;         // fp32 master shards: sum of 4 * N/S
  int64_t sharded_state_bytes = 0;         // fp32 param, grad, exp_avg, exp_avg_sq: 16 * N/S
  int64_t unsharded_param_bytes = 0;       // gathered param_dtype buffers at most at once
  int64_t unsharded_grad_bytes = 0;        // fp32 full gradient buffers alive at once: the root's and one
                                           // other unit's (reduce_each), every unit's (no_sync)
  int64_t offload_upload_bytes = 0;        // with offload_params: fp32 device copies of master shards from
                                           // their upload to the unit's first use: the root's and at most
                                           // 1 + prefetch depth others'
  // Per micro-batch, per rank, as the communicators count them (with no_sync, the reductions happen once
  // per step, on the last micro-batch).
  uint64_t shard_all_gather_bytes = 0;
  uint64_t shard_reduce_scatter_bytes = 0;
  uint64_t replicate_all_reduce_bytes = 0;
};

// Throws ConfigError when the mesh does not fit (the same errors as the engine).
FsdpPlan plan_fsdp(const model::ModelSpec& spec, const FsdpConfig& config, int world_size, int ranks_per_node);

}  // namespace shardtrain::fsdp
