// Where gradient shards live when they do not need memory of their own (docs/fsdp.md, "Gradient memory"). A
// unit's gradient shard is written from its backward (one rank: backward accumulates into it) or its reduction
// on (several ranks) until the optimizer has read it; the next forward does not need it. A decoder layer's
// saved activations are dead from the end of that layer's backward until the next forward. So once layers
// l+1.. have run backward, layer l's gradient shard can sit in their activation memory, as PyTorch's caching
// allocator lets `zero_grad(set_to_none=True)` gradients take memory that backward has freed. Only the units
// written before any layer is done (the lm_head, the last layer) need memory of their own.
//
// GradPlacer makes the decisions, pass by pass, for the engine (engine.cpp) and for the memory plan
// (plan.cpp, which replays the hooks' order): the same rules give the same placement, so `shardtrain plan`
// counts what the engine's ledger will hold.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/model/spec.hpp"

namespace shardtrain::fsdp {

// A byte span [begin, end) from the activation arena's start.
struct ArenaSpan {
  size_t begin = 0, end = 0;
};

// The highest `align`-aligned start of `bytes` bytes inside the union of `free` that overlaps no span of
// `taken`; none when nothing fits. Spans may touch: adjacent free spans form one.
std::optional<size_t> highest_fit(std::vector<ArenaSpan> free, std::vector<ArenaSpan> taken, size_t bytes, size_t align);

class GradPlacer {
 public:
  static constexpr size_t kAlignment = model::ActivationPlan::kAlignment;
  // Gradients of an RMSNorm whose module runs backward before its unit's shard has a place (the final norm of
  // the base model unit, whose embedding is the last module of backward) wait on a stage of their own, as large
  // as every RMSNorm weight of the model (each rounded up to kAlignment): a few hundred KiB for an 8B model.
  static size_t stage_capacity(const model::ModelSpec& spec);
  static size_t rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  explicit GradPlacer(size_t stage_capacity = 0) : stage_capacity_(stage_capacity) {}
  // A new pass over this arena layout: no layer done, nothing placed, the stage empty.
  void begin_pass(const std::vector<model::FreedInBackward>& freed);
  // Decoder layer `layer`'s backward is done: its freed spans may take gradient shards from now on.
  void layer_done(int layer);
  // A place for `bytes` in the memory freed so far and not taken this pass (taken when found).
  std::optional<size_t> place(size_t bytes);
  // Room on the stage for `bytes` more (taken when there is): its offset in the stage.
  std::optional<size_t> stage(size_t bytes);
  // When a unit's backward reaches `module` before its shard has a place: the entries of `layout` whose gradients
  // go to the stage now (the module's parameters not on it yet, `staged` says which are), or none when they may
  // not: the module is not an RMSNorm (a projection group's gradients must stay adjacent for its fused GEMM), or
  // there is no room. Then the shard takes memory of its own. Takes nothing on the stage itself (stage() does).
  std::optional<std::vector<const FlatEntry*>> stage_request(const FlatLayout& layout, const model::ModuleInfo& module,
                                                             const std::vector<int>& staged) const;
  size_t stage_used() const { return stage_used_; }
  size_t stage_capacity() const { return stage_capacity_; }

 private:
  std::vector<model::FreedInBackward> freed_;
  std::vector<bool> done_;  // per freed span
  std::vector<ArenaSpan> taken_;
  size_t stage_capacity_ = 0;
  size_t stage_used_ = 0;
};

}  // namespace shardtrain::fsdp
