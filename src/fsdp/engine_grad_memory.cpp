// The FSDP engine's gradient shard memory (engine.hpp): each shard's own buffer, or, with gradients in activation
// memory (grad_placement.hpp), a place in the activation arena found anew each backward pass, the stage for early
// norm gradients, and the move to memory of their own when a step turns out to have several micro-batches.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "engine_unit.hpp"
#include "shardtrain/runtime/timing_device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::fsdp {

// Elements [begin, end) of the fp32 gradient g: a memset in host memory (offload's shards, the CPU backend), a fill
// kernel on the device.
void FsdpEngine::zero_grad_range(const ops::Tensor& g, int64_t begin, int64_t end) {
  if (end <= begin) return;
  const ops::Tensor t = ops::make_tensor(static_cast<float*>(g.data) + begin, DType::F32, {end - begin}, g.device);
  if (t.device == DeviceKind::Cpu) {
    // Offloaded shards on a timing device (`shardtrain predict`) hold no memory: nothing to write, and no time the
    // prediction counts (host work beside the device's).
    if (!timing::TimingDevice::is_host_address(t.data)) std::memset(t.data, 0, t.bytes());
  } else {
    ops_->fill(t, 0.0);
  }
}

void FsdpEngine::zero_shard_grad(Unit& u) {
  if (u.shard() > 0) zero_grad_range(grad_tensor(u), 0, u.shard());
}

// Everything of the unit's flat gradient `g` (padded_numel elements: the full gradient, or with S == 1 the shard)
// but the entries whose GEMMs write them whole (model::gemm_writes_gradient, bound GradWrite::Overwrite): the norms'
// and the embedding's (a tied lm_head's too), which their ops add into, the gaps alignment leaves between entries and
// the padding, which the reduction and the gradient norm read. One fill per run of such elements: for a decoder
// layer a few small ones where the whole layer was filled before.
void FsdpEngine::zero_for_backward(const Unit& u, const ops::Tensor& g) {
  const model::ModelSpec& spec = model_->spec();
  int64_t from = 0;  // the first element not yet zeroed or left to a GEMM
  for (const FlatEntry& e : u.layout.entries) {
    if (!model::gemm_writes_gradient(spec, e.param)) continue;
    zero_grad_range(g, from, e.offset);
    from = e.offset + e.numel;
  }
  zero_grad_range(g, from, g.numel());
}

ops::Tensor FsdpEngine::grad_tensor(const Unit& u, int64_t offset, ops::Shape shape) const {
  if (!u.grad_placed)
    throw InternalError(fmt::format("FSDP unit {} ({}): its gradient shard has no memory yet", u.spec->index, u.spec->name));
  const DeviceKind device = u.grad ? u.grad.device() : ops_->device();
  return ops::make_tensor(u.grad_data + offset, DType::F32, shape, device);
}

ops::Tensor FsdpEngine::grad_tensor(const Unit& u) const { return grad_tensor(u, 0, {u.shard()}); }

// Gradients in activation memory (grad_placement.hpp). A pass starts with no unit placed but those with memory of
// their own, over the arena of this micro-batch's shape.
void FsdpEngine::begin_grad_pass(const model::Batch& batch) {
  if (!grads_in_activations_) return;
  const model::ActivationPlan& plan = model_->prepare(batch.input_ids.shape[0], batch.input_ids.shape[1]);
  arena_base_ = static_cast<char*>(model_->arena_base());
  placer_.begin_pass(plan.freed_in_backward());
  for (auto& u : units_) {
    u->staged.clear();
    if (!u->grad) u->grad_placed = false;
  }
}

void FsdpEngine::set_grad_data(Unit& u, float* data) {
  u.grad_data = data;
  u.grad_placed = true;
  shard_views_[static_cast<size_t>(u.spec->index)].grad = data;  // the optimizer rebinds when it moved
}

// A place for the unit's gradient shard in what backward has freed so far; false when nothing fits.
bool FsdpEngine::place_in_arena(Unit& u) {
  const std::optional<size_t> at = placer_.place(static_cast<size_t>(u.shard()) * sizeof(float));
  if (at) set_grad_data(u, reinterpret_cast<float*>(arena_base_ + *at));
  return at.has_value();
}

// The unit's gradient shard gets memory for this pass: a place in what backward has freed so far, or its own
// memory when nothing fits (kept from then on: the same rules decide the same each pass).
void FsdpEngine::place_grad(Unit& u) {
  if (u.grad_placed) return;
  if (u.shard() == 0) {  // a unit without parameters: nothing to place
    set_grad_data(u, nullptr);
    return;
  }
  if (place_in_arena(u)) return;
  u.grad = FlatBuffer(ops_->device(), Placement::Compute, static_cast<size_t>(u.shard()) * sizeof(float), ledger_,
                      MemoryCategory::ShardedGrads);
  set_grad_data(u, static_cast<float*>(u.grad.data()));
}

// One rank with grads in activation memory: when the unit's backward begins at `module` and nothing freed fits
// its shard yet, the gradients of that module's parameters may wait on the stage (GradPlacer::stage_request: the
// base model's final norm, whose embedding runs backward last); returns whether the shard has its memory now.
bool FsdpEngine::place_or_stage(Unit& u, int module) {
  if (u.grad_placed) return true;
  if (place_in_arena(u)) return true;
  std::vector<int> staged;
  for (const auto& s : u.staged) staged.push_back(s.first);
  const model::ModelSpec& spec = model_->spec();
  const auto request = placer_.stage_request(u.layout, spec.module(module), staged);
  if (!request) {
    place_grad(u);  // its own memory (the arena has nothing for it: tried above)
    return true;
  }
  if (!grad_stage_)
    grad_stage_ =
        FlatBuffer(ops_->device(), Placement::Compute, placer_.stage_capacity(), ledger_, MemoryCategory::ShardedGrads);
  for (const FlatEntry* e : *request) {
    const auto at = static_cast<int64_t>(*placer_.stage(static_cast<size_t>(e->numel) * sizeof(float)) / sizeof(float));
    ops_->fill(grad_stage_.view(DType::F32, at, {e->numel}), 0.0);
    model_->binding().bind_grad(e->param, grad_stage_.view(DType::F32, at, model::param_shape(spec.param(e->param))),
                                model::GradWrite::Accumulate, &grad_stage_);
    u.staged.emplace_back(e->param, static_cast<size_t>(at) * sizeof(float));
  }
  return false;
}

// The staged unit's shard has its memory: zeroed, the staged gradients copied into their places, every
// parameter's gradient bound to the shard.
void FsdpEngine::finish_staged(Unit& u) {
  place_grad(u);
  zero_shard_grad(u);
  const model::ModelSpec& spec = model_->spec();
  for (const auto& [param, at] : u.staged) {
    const auto e =
        std::find_if(u.layout.entries.begin(), u.layout.entries.end(), [&](const FlatEntry& f) { return f.param == param; });
    ops_->copy(grad_stage_.view(DType::F32, static_cast<int64_t>(at / sizeof(float)), {e->numel}),
               grad_tensor(u, e->offset, {e->numel}));
  }
  u.staged.clear();
  u.reduced_this_step = true;
  if (u.state == UnitState::InBackward) {
    for (const FlatEntry& e : u.layout.entries)
      model_->binding().bind_grad(e.param, grad_tensor(u, e.offset, model::param_shape(spec.param(e.param))),
                                  model::GradWrite::Accumulate, &u);
  }
}

// A micro-batch that is not the step's last, with gradients in activation memory: the next forward would
// overwrite them, so every shard moves to memory of its own, for the rest of the run.
void FsdpEngine::leave_activation_memory() {
  log::warn(
      "FSDP: gradient accumulation over micro-batches: the gradient shards move out of activation memory "
      "(fsdp.grads_in_activation_memory applies to one micro-batch per step)");
  for (auto& u : units_)
    if (!u->staged.empty()) finish_staged(*u);
  grad_stage_ = FlatBuffer();  // in stream order: the copies out of it are queued before any later use of its memory
  wait_reductions();           // reductions on their own streams write the shards
  for (auto& u : units_) {
    if (u->grad || u->empty()) continue;
    const size_t bytes = static_cast<size_t>(u->shard()) * sizeof(float);
    FlatBuffer own(ops_->device(), Placement::Compute, bytes, ledger_, MemoryCategory::ShardedGrads);
    if (u->grad_placed) ops_->copy(grad_tensor(*u), own.view(DType::F32, 0, {u->shard()}));
    u->grad = std::move(own);
    set_grad_data(*u, static_cast<float*>(u->grad.data()));
  }
  grads_in_activations_ = false;
}

}  // namespace shardtrain::fsdp
