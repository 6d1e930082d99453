// What a user configures about FSDP (the seeds' options, natively): strategy, resharding, wrapping,
// mixed precision, offload, prefetch, gradient accumulation mode, activation checkpointing.
#pragma once

#include <optional>
#include <string_view>

#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/mesh/strategy.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::fsdp {

// How gradients of several micro-batches are accumulated.
enum class GradAccumulation {
  ReduceEachMicroBatch,  // lean: reduce-scatter (and all-reduce over replicas) after every micro-batch into the fp32 shard
  NoSync,                // keep full unsharded fp32 gradients until the last micro-batch (one reduction, +4P bytes/rank);
                         // FSDP2's set_requires_gradient_sync(False) on every micro-batch but the last
  AllReduceLast,         // reduce-scatter every micro-batch, all-reduce the accumulated shard over replicas on the last
                         // only (FSDP2's set_requires_all_reduce(False)); the same as reduce_each without replicas
};
const char* grad_accumulation_name(GradAccumulation g);
GradAccumulation parse_grad_accumulation(std::string_view text);  // "reduce_each" | "no_sync" | "all_reduce_last"

// When compute waits for a unit's gradient reduction (on a GPU with device-memory communicators; elsewhere the
// reductions run in call order anyway). Async: never, until the optimizer needs the shards or a buffer the
// reduction reads is reused. Synchronous: right after issuing it, as an engine without overlap would; for the
// schedule tests (tests/fsdp/overlap_test.cpp) and for comparisons, not a configuration key.
enum class ReduceSchedule { Async, Synchronous };

struct FsdpConfig {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int shard_size = 0;                         // hybrid only (0: ranks per node)
  std::optional<bool> reshard_after_forward;  // unset: the strategy's default (FULL_SHARD/HYBRID_SHARD: true)
  WrapConfig wrap;
  DType param_dtype = DType::F32;   // gathered and computed with: f32 or bf16
  DType reduce_dtype = DType::F32;  // gradients reduced in: f32 or bf16
  bool offload_params = false;      // master, gradient and optimizer shards in pinned host memory
  int forward_prefetch = 1;         // units all-gathered ahead in forward (FSDP2's implicit prefetch)
  int backward_prefetch = 1;        // units all-gathered ahead in backward (BACKWARD_PRE)
  GradAccumulation accumulation = GradAccumulation::ReduceEachMicroBatch;
  ReduceSchedule reduce_schedule = ReduceSchedule::Async;
  bool activation_checkpointing = false;  // per decoder layer
  bool sync_module_states = false;        // broadcast replica 0's shards after init/load
  // Gradient shards in the activation memory backward is done with (fsdp/grad_placement.hpp), where they fit: for
  // one micro-batch per step (train::engine_config turns it off for more; an engine that meets a micro-batch that
  // is not a step's last moves them out), not with offload_params.
  bool grads_in_activation_memory = true;

  bool places_grads_in_activations() const { return grads_in_activation_memory && !offload_params; }
  bool reshards_after_forward() const { return reshard_after_forward.value_or(strategy_reshards_after_forward(strategy)); }
  void validate() const;  // throws ConfigError naming the field
};

}  // namespace shardtrain::fsdp
