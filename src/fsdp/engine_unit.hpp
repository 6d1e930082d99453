// The FSDP engine's private unit record, shared by its two translation units: engine.cpp (the schedule: unshard,
// reshard, reductions, hooks) and engine_grad_memory.cpp (where each gradient shard's memory is, pass by pass).
#pragma once

#include <utility>
#include <vector>

#include "shardtrain/fsdp/engine.hpp"

namespace shardtrain::fsdp {

struct FsdpEngine::Unit {
  const UnitSpec* spec = nullptr;
  FlatLayout layout;
  FlatBuffer master;  // (N/S) fp32
  FlatBuffer grad;    // (N/S) fp32: the gradient shard's own memory, when it has any
  // Where the gradient shard is: grad's memory, or (grads in activation memory) a place in the activation arena,
  // found again each pass (grad_placement.hpp). grad_placed: it has its memory in this pass (always, with grad).
  float* grad_data = nullptr;
  bool grad_placed = false;
  // Grads in the shard with grads in activation memory: parameters whose module ran backward before the shard
  // had a place, and where their gradients wait on the stage (byte offsets), until finish_staged.
  std::vector<std::pair<int, size_t>> staged;
  FlatBuffer full;                       // (N) param_dtype, while gathered
  FlatBuffer full_grad;                  // (N) fp32, from the unit's first backward until its reduction
  UnitState state = UnitState::Sharded;  // changed by move_to only
  // Not the parameters' lifecycle, so not in `state`: stream bookkeeping and the gradient shard's step.
  // Overlap: the all-gather's completion (on the gather stream; with offload, the upload's on the upload
  // stream) and whether compute has yet to wait for it (in any gathered state: a prefetch's gather lands
  // while other units compute); the gradient reduction's completion (on the reduce or replicate stream) and
  // whether compute has yet to wait for it (until the step's last micro-batch ends: the unit is gathered and
  // used again by later micro-batches meanwhile).
  CudaEvent gathered_event, reduced_event;
  bool gather_unwaited = false, reduction_unwaited = false;
  // The gradient shard holds this step's gradient already (reduced into, or zeroed for backward to accumulate
  // into it); false from zero_grad on: the shard counts as zero without being written. Per step, not per pass.
  bool reduced_this_step = false;
  int64_t shard() const { return layout.shard_numel(); }
  bool empty() const { return layout.entries.empty(); }
};

}  // namespace shardtrain::fsdp
