// The FSDP engine: unshard before use, reshard after, reduce gradients when a unit's backward ends.
// Units are visited through the model's module hooks; every parameter a module reads (ModuleInfo::uses)
// makes its unit gathered, which also covers tied weights and nested units.
#include "shardtrain/fsdp/engine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "engine_unit.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/model/init.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::fsdp {

// Overlap. Three streams beside compute (StreamRef{}: where the ops run):
//   gather:    all-gathers. Each waits for the cast of the master shard into the unshard buffer (on compute,
//              after every earlier use of that buffer), and compute waits for the gather before the unit's
//              first use (wait_gathered): prefetched units gather while the current one computes.
//   reduce:    reduce-scatters. Each waits for the unit's backward (grad_ready); a bf16 reduction's cast of the
//              full gradient runs there too (reduce_ops_). The unsharded gradient buffer returns to its pool with
//              a fence on the last stream that read it, one reduction late (grad_held_), so the next unit's
//              backward takes the other buffer and does not wait.
//   replicate: the hybrid strategies' all-reduce of the reduced shard, after the reduce-scatter (NO_SHARD's
//              whole all-reduce); reduce_shard_ alternates between two buffers there, each freed by an event.
// Whatever a reduction still has to do after its collectives (cast to fp32, add into the shard: a reduction in
// bf16, or a later one in the step) runs on the stream of its last collective, with that stream's own ops; the
// step's first fp32 reduction writes the gradient shard directly (zero + x = x). Compute waits for reductions
// only at the end of the step's last micro-batch (wait_reductions), before the optimizer reads the shards.
// The three are high-priority streams (as PyTorch FSDP's are): a collective ready to start is not queued
// behind compute's blocks.
struct FsdpEngine::Streams {
  CudaStream gather{StreamPriority::High}, reduce{StreamPriority::High}, replicate{StreamPriority::High};
  CudaEvent cast_done, grad_ready, scattered;
  CudaEvent slot_free[2];  // reduce_shard_[i] read for the last time (replicate stream)
  int next_slot = 0;
};

// Offload on a GPU. upload: a unit's master shard, host -> device, issued when the unit is unsharded (at
// prefetch time, before the current unit's compute is queued), then its cast to param_dtype on the same stream
// (upload_ops_), after the unshard buffer's previous reader on compute (its fence); the all-gather follows on the
// gather stream. All of it runs while the current unit computes, which waits by an event only at the unit's first
// use. download: reduced gradients, device -> pinned host, after an event on the stream that reduced them; the
// stream that writes the source next waits for the copy (an event), and the host waits once per step, for the
// download stream (release_all). Later reductions of a step (gradient accumulation) go down into a pinned stage and
// a host function adds them into the host shard, on the same stream.
struct FsdpEngine::OffloadStreams {
  CudaStream upload{StreamPriority::High}, download{StreamPriority::High};
  CudaEvent reduced;  // on the reducing stream: a reduction is complete
  CudaEvent staged;   // on download: a reduction was copied out of its device buffer
};

const char* unit_state_name(UnitState state) {
  switch (state) {
    case UnitState::Sharded: return "sharded";
    case UnitState::Gathered: return "gathered";
    case UnitState::InForward: return "in forward";
    case UnitState::InBackward: return "in backward";
  }
  return "unknown";
}

void check_unit_transition(int unit, std::string_view name, UnitState from, UnitState to) {
  bool legal = false;
  switch (to) {
    case UnitState::Sharded: legal = from != UnitState::Sharded; break;
    case UnitState::Gathered: legal = from == UnitState::Sharded; break;
    case UnitState::InForward: legal = from == UnitState::Gathered; break;
    case UnitState::InBackward: legal = from == UnitState::Gathered || from == UnitState::InForward; break;
  }
  if (!legal) {
    throw InternalError(fmt::format("FSDP unit {} ({}): illegal state change from {} to {}", unit, name,
                                    unit_state_name(from), unit_state_name(to)));
  }
}

namespace {
constexpr StreamRef kCompute{};
bool same(StreamRef a, StreamRef b) { return a.handle == b.handle; }

void host_add(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
}  // namespace

FsdpEngine::FsdpEngine(model::LlamaModel& model, const DeviceMesh& mesh, MeshComms& comms, ops::Ops& ops,
                       const FsdpConfig& config, MemoryLedger& ledger)
    : model_(&model),
      mesh_(&mesh),
      comms_(&comms),
      ops_(&ops),
      config_(config),
      ledger_(&ledger),
      param_pool_(ops.device(), &ledger, MemoryCategory::UnshardedParams),
      grad_pool_(ops.device(), &ledger, MemoryCategory::UnshardedGrads),
      upload_pool_(ops.device(), &ledger, MemoryCategory::CommBuffers) {
  config_.validate();
  if (config_.strategy != mesh.strategy()) {
    throw InternalError(fmt::format("FSDP config strategy {} differs from the mesh's {}",
                                    sharding_strategy_name(config_.strategy), sharding_strategy_name(mesh.strategy())));
  }
  const model::ModelSpec& spec = model.spec();
  grads_in_shard_ = grads_live_in_shards(config_, mesh.shard_size(), mesh.replicate_size());
  grads_in_activations_ = config_.places_grads_in_activations();
  grads_readable_ = !grads_in_activations_;  // zeroed shards; in activation memory, none before the first backward
  placer_ = GradPlacer(GradPlacer::stage_capacity(spec));
  layer_of_module_.assign(spec.modules().size(), -1);
  for (const model::ModuleInfo& m : spec.modules())
    if (m.cls == model::ModuleClass::LlamaDecoderLayer) layer_of_module_[static_cast<size_t>(m.index)] = m.layer;
  unit_specs_ = plan_units(spec, config_.wrap);
  unit_of_param_.assign(spec.params().size(), -1);
  first_use_unit_.assign(spec.modules().size(), -1);
  const int S = mesh.shard_size();
  const int my = mesh.coord().shard;
  const Placement shard_place = config_.offload_params ? Placement::PinnedHost : Placement::Compute;
  for (const UnitSpec& us : unit_specs_) {
    auto u = std::make_unique<Unit>();
    u->spec = &us;
    u->layout = make_flat_layout(spec, us.params, S);
    for (int p : us.params) unit_of_param_[p] = us.index;
    if (us.first_use >= 0) first_use_unit_[us.first_use] = us.index;
    const size_t shard_bytes = static_cast<size_t>(u->shard()) * sizeof(float);
    u->master = FlatBuffer(ops.device(), shard_place, shard_bytes, &ledger, MemoryCategory::ShardedParams);
    if (!grads_in_activations_) {
      u->grad = FlatBuffer(ops.device(), shard_place, shard_bytes, &ledger, MemoryCategory::ShardedGrads);
      u->grad_data = static_cast<float*>(u->grad.data());
      u->grad_placed = true;
    }
    ShardView v;
    v.unit = us.index;
    v.param = static_cast<float*>(u->master.data());
    v.grad = u->grad_data;  // null until the first backward places it (grads in activation memory)
    v.numel = u->shard();
    v.flat_begin = u->layout.shard_begin(my);
    v.ranges = u->layout.ranges(v.flat_begin, v.flat_begin + v.numel);
    for (ParamRange& r : v.ranges) {
      r.begin -= v.flat_begin;
      r.end -= v.flat_begin;
    }
    v.device = u->master.device();
    shard_views_.push_back(std::move(v));
    units_.push_back(std::move(u));
  }
  // Default prefetch schedules: the next units in forward order, and in backward order.
  const int n = static_cast<int>(units_.size());
  std::vector<int> backward_order(n);
  for (int i = 0; i < n; ++i) backward_order[i] = i;
  std::sort(backward_order.begin(), backward_order.end(),
            [&](int a, int b) { return unit_specs_[a].last_use > unit_specs_[b].last_use; });
  forward_prefetch_.assign(n, {});
  backward_prefetch_.assign(n, {});
  // On the overlapped schedule a unit whose uses span the others' (the base model: the final norm at the start of
  // backward, the embedding at its end) does not count toward the backward depth: its work at the start is one
  // norm, so the lm_head's backward prefetches the last layer too, whose gather would otherwise be issued only
  // when that norm begins and queue behind the lm_head's reduce-scatter. The gathered buffers stay within the
  // plan's bound ((1 + depth) units, the spanning ones and the root). Overlapped: on a GPU whose collectives
  // take device memory, with a mesh of several ranks (the streams below).
  const bool overlapped = ops.device() == DeviceKind::Cuda && comms.shard().space() == MemorySpace::Device &&
                          (mesh.shard_size() > 1 || mesh.replicate_size() > 1);
  std::vector<bool> spans(static_cast<size_t>(n), false);
  for (const UnitSpec& u : unit_specs_)
    for (const UnitSpec& o : unit_specs_)
      if (o.index != u.index && !o.params.empty() && o.first_use > u.first_use && o.first_use < u.last_use)
        spans[static_cast<size_t>(u.index)] = !u.params.empty();
  for (int i = 0; i < n; ++i) {
    for (int k = 1; k <= config_.forward_prefetch && i + k < n; ++k) forward_prefetch_[i].push_back(i + k);
    int depth = 0;
    for (int k = i + 1; k < n && depth < config_.backward_prefetch; ++k) {
      const int v = backward_order[k];
      backward_prefetch_[backward_order[i]].push_back(v);
      if (!(overlapped && spans[static_cast<size_t>(v)])) ++depth;
    }
  }
  // Scratch for reduce_dtype buffers, sized once for the largest unit.
  int64_t max_n = 0, max_shard = 0;
  for (const auto& u : units_) {
    max_n = std::max(max_n, u->layout.padded_numel);
    max_shard = std::max(max_shard, u->shard());
  }
  // Only what this mesh and config use (plan.cpp counts the same): on one GPU the two shard-sized buffers
  // would be 2 x 307 MB of nothing for the seed model.
  if (config_.reduce_dtype != DType::F32 || (config_.offload_params && mesh.replicate_size() > 1)) {
    stage_ = FlatBuffer(ops.device(), Placement::Compute, static_cast<size_t>(max_shard) * 4, &ledger,
                        MemoryCategory::CommBuffers);
  }
  for (int i = 0; i < (S > 1 ? (mesh.replicate_size() > 1 ? 2 : 1) : 0); ++i) {
    reduce_shard_[i] = FlatBuffer(ops.device(), Placement::Compute, static_cast<size_t>(max_shard) * 4, &ledger,
                                  MemoryCategory::CommBuffers);
  }
  if (config_.reduce_dtype != DType::F32) {
    reduce_full_ =
        FlatBuffer(ops.device(), Placement::Compute, static_cast<size_t>(max_n) * dtype_size(config_.reduce_dtype), &ledger,
                   MemoryCategory::CommBuffers);
  }
  if (config_.offload_params) {
    host_stage_ = FlatBuffer(ops.device(), Placement::PinnedHost, static_cast<size_t>(max_shard) * 4, &ledger,
                             MemoryCategory::CommBuffers);
  }
  if (overlapped) {
    streams_ = std::make_unique<Streams>();
    // No cuBLASLt workspace: they cast and add only.
    reduce_ops_ = ops.make_side_ops();
    reduce_ops_->set_stream(streams_->reduce.ref());
    replicate_ops_ = ops.make_side_ops();
    replicate_ops_->set_stream(streams_->replicate.ref());
  }
  if (ops.device() == DeviceKind::Cuda && config_.offload_params) {
    offload_streams_ = std::make_unique<OffloadStreams>();
    upload_ops_ = ops.make_side_ops();
    upload_ops_->set_stream(offload_streams_->upload.ref());
  }
  if (ops.device() == DeviceKind::Cuda && !grads_in_shard_) {
    // The gradient norm's sums, one double per unit, each taken as the unit's last reduction of the step lands
    // (device_grad_sq_sums); a unit without parameters keeps its zero.
    unit_sq_sums_ =
        FlatBuffer(ops.device(), Placement::Compute, units_.size() * sizeof(double), &ledger, MemoryCategory::CommBuffers);
    const std::vector<double> zeros(units_.size(), 0.0);
    copy_async(unit_sq_sums_.data(), zeros.data(), zeros.size() * sizeof(double), {});
    stream_synchronize({});
    for (const auto& u : units_) nonempty_units_ += u->empty() ? 0 : 1;
  }
  for (auto& u : units_)
    if (u->grad_placed) zero_shard_grad(*u);  // defined values before the first step
  zero_grad();
}

FsdpEngine::~FsdpEngine() {
  model_->set_hooks(nullptr);
  for (const model::ParamInfo& p : model_->spec().params()) model_->binding().unbind(p.index);
}

const FlatLayout& FsdpEngine::layout(int unit) const { return units_.at(static_cast<size_t>(unit))->layout; }

void FsdpEngine::initialize(uint64_t seed) {
  release_all();  // nothing gathered may hold the old master shards
  const model::ModelSpec& spec = model_->spec();
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = *units_[i];
    const ShardView& v = shard_views_[i];
    std::vector<float> host(static_cast<size_t>(v.numel), 0.0f);  // padding stays zero
    for (const ParamRange& r : v.ranges) {
      model::init_param_slice(spec.param(r.param), seed, r.param_offset,
                              ops::make_tensor(host.data() + r.begin, DType::F32, {r.end - r.begin}));
    }
    copy_async(u.master.data(), host.data(), host.size() * sizeof(float), {});
  }
  stream_synchronize({});
  if (config_.sync_module_states) sync_module_states();
}

void FsdpEngine::sync_module_states() {
  if (mesh_->replicate_size() == 1) return;
  release_all();  // nothing gathered may hold the old master shards
  Communicator& rep = comms_->replicate();
  const bool comm_on_device = rep.space() == MemorySpace::Device;
  for (auto& u : units_) {
    const size_t n = static_cast<size_t>(u->shard());
    const bool master_on_device = u->master.device() == DeviceKind::Cuda;
    if (master_on_device == comm_on_device) {
      rep.broadcast(u->master.data(), n, DType::F32, 0);
      continue;
    }
    // The shard and the communicator's buffers live in different memories: go through a staging copy.
    void* staging = comm_on_device ? stage_.data() : host_stage_scratch(n);
    copy_async(staging, u->master.data(), n * sizeof(float), {});
    stream_synchronize({});
    rep.broadcast(staging, n, DType::F32, 0);
    copy_async(u->master.data(), staging, n * sizeof(float), {});
    stream_synchronize({});
  }
}

void* FsdpEngine::host_stage_scratch(size_t floats) {
  if (host_scratch_.size() < floats) host_scratch_.resize(floats);
  return host_scratch_.data();
}

// Marks every gradient shard zero without writing it: the step's first reduction into a shard writes it
// (zero + x = x), and forward_backward zeroes the shards no reduction reached by the end of the step. A pass of
// zeros over every shard would cost a write of N/S floats per unit, and with CPU offload a single-threaded
// host memset before the step's first kernel, while the previous update may still read the gradients.
void FsdpEngine::zero_grad() {
  unit_sums_taken_ = 0;
  if (grad_held_) grad_pool_.release(std::move(grad_held_));
  for (auto& u : units_) {
    if (u->full_grad) grad_pool_.release(std::move(u->full_grad));
    u->reduced_this_step = false;
  }
}

void FsdpEngine::unshard(Unit& u) {
  if (u.state != UnitState::Sharded || u.empty()) return;
  const DType pd = config_.param_dtype;
  const int64_t N = u.layout.padded_numel, n = u.shard();
  const size_t bytes = static_cast<size_t>(N) * dtype_size(pd);
  if (u.spec->is_root) {
    // Allocated once and kept (reshard leaves it): freeing device memory synchronizes the device, once per
    // step here. The memory plan counts the root's buffer for the whole step anyway (plan.cpp).
    if (!u.full) u.full = FlatBuffer(ops_->device(), Placement::Compute, bytes, ledger_, MemoryCategory::UnshardedParams);
  } else {
    u.full = param_pool_.acquire(bytes);
    stats_.max_outstanding = std::max(stats_.max_outstanding, param_pool_.outstanding());
  }
  StreamRef cast_stream = kCompute;
  if (config_.offload_params) {
    // The master shard lives on the host: copy it up, and cast it into the unshard buffer, on the upload stream.
    // The previous step's update of this shard may still be running on the host (optim::AdamW::step_async): wait.
    if (pending_writes_) pending_writes_->wait_shard(u.spec->index);
    FlatBuffer upload = upload_pool_.acquire(static_cast<size_t>(n) * 4);
    ops::Ops* up_ops = ops_;
    if (offload_streams_) {
      cast_stream = offload_streams_->upload.ref();
      up_ops = upload_ops_.get();
      u.full.fence.wait(cast_stream);  // compute's last read of this unshard buffer
    }
    copy_async(upload.data(), u.master.data(), static_cast<size_t>(n) * 4, cast_stream);
    up_ops->copy(upload.view(DType::F32, 0, {n}), u.full.view(pd, mesh_->coord().shard * n, {n}));
    upload_pool_.release(std::move(upload));  // its next upload is queued on this same stream, after the cast
    if (offload_streams_) {
      u.gathered_event.record(cast_stream);
      u.gather_unwaited = true;
    }
  } else {
    ops_->copy(u.master.view(DType::F32, 0, {n}), u.full.view(pd, mesh_->coord().shard * n, {n}));
  }
  if (mesh_->shard_size() > 1) {
    StreamRef stream = kCompute;
    if (streams_) {
      stream = streams_->gather.ref();
      streams_->cast_done.record(cast_stream);
      streams_->cast_done.wait(stream);
    } else if (offload_streams_) {  // MPI staging: the gather on compute, after the cast
      u.gathered_event.wait(kCompute);
      u.gather_unwaited = false;
    }
    all_gather_unit(u, stream);
    if (streams_) {
      u.gathered_event.record(stream);
      u.gather_unwaited = true;
    }
  }
  const model::ModelSpec& spec = model_->spec();
  for (const FlatEntry& e : u.layout.entries) {
    model_->binding().bind_param(e.param, u.full.view(pd, e.offset, model::param_shape(spec.param(e.param))), &u);
  }
  move_to(u, UnitState::Gathered);
}

void FsdpEngine::wait_gathered(Unit& u) {
  if (!u.gather_unwaited) return;
  u.gathered_event.wait(kCompute);
  u.gather_unwaited = false;
}

void FsdpEngine::move_to(Unit& u, UnitState to) {
  check_unit_transition(u.spec->index, u.spec->name, u.state, to);
  u.state = to;
}

// The all-gather of a unit whose own shard is already in its slice of the unshard buffer, on `stream`.
void FsdpEngine::all_gather_unit(Unit& u, StreamRef stream) {
  const DType pd = config_.param_dtype;
  const int64_t n = u.shard();
  if (observer_) observer_->schedule_point(SchedulePoint::GatherIssued, u.spec->index);
  if (watchdog_) watchdog_->set_unit(fmt::format("{} ({}, all-gather)", u.spec->index, u.spec->name));
  comms_->shard().all_gather(u.full.view(pd, mesh_->coord().shard * n, {n}).data, u.full.data(), static_cast<size_t>(n), pd,
                             stream);
  if (watchdog_) watchdog_->set_unit("");
  ++stats_.gathers;
}

void FsdpEngine::wait_reductions() {
  for (auto& u : units_) {
    if (!u->reduction_unwaited) continue;
    u->reduced_event.wait(kCompute);
    u->reduction_unwaited = false;
  }
}

void FsdpEngine::reshard(Unit& u) {
  if (u.state == UnitState::Sharded) return;
  wait_gathered(u);  // a prefetched unit nobody used: its gather must land before the buffer is reused
  for (const FlatEntry& e : u.layout.entries) model_->binding().unbind(e.param);
  // With offload the next cast into this buffer runs on the upload stream: it waits for compute's reads.
  if (offload_streams_) u.full.fence.record(kCompute);
  if (!u.spec->is_root) param_pool_.release(std::move(u.full));
  move_to(u, UnitState::Sharded);
}

void FsdpEngine::begin_unit_backward(Unit& u, int module) {
  unshard(u);
  if (u.state == UnitState::InBackward || u.empty()) return;
  move_to(u, UnitState::InBackward);
  const model::ModelSpec& spec = model_->spec();
  // A gradient that holds nothing yet (the step's first backward into it): the GEMMs write their parameters'
  // gradients whole, and only the rest is zeroed (zero_for_backward).
  model::ParamBinding& binding = model_->binding();
  auto write_of = [&](const FlatEntry& e, bool fresh) {
    return fresh && model::gemm_writes_gradient(spec, e.param) ? model::GradWrite::Overwrite : model::GradWrite::Accumulate;
  };
  if (grads_in_shard_) {  // the shard is the whole flat gradient (S == 1): backward accumulates into it
    const bool fresh = !u.reduced_this_step;
    if (fresh) {
      if (!place_or_stage(u, module)) return;  // this module's gradients wait on the stage
      zero_for_backward(u, grad_tensor(u));
      u.reduced_this_step = true;
    }
    for (const FlatEntry& e : u.layout.entries)
      binding.bind_grad(e.param, grad_tensor(u, e.offset, model::param_shape(spec.param(e.param))), write_of(e, fresh), &u);
    return;
  }
  const bool fresh = !u.full_grad;  // in no_sync mode it survives from the previous micro-batch
  if (fresh) {
    u.full_grad = grad_pool_.acquire(static_cast<size_t>(u.layout.padded_numel) * 4);
    u.full_grad.fence.wait(kCompute);  // a reduce-scatter may still read it for another unit
    zero_for_backward(u, u.full_grad.view(DType::F32, 0, {u.layout.padded_numel}));
  }
  for (const FlatEntry& e : u.layout.entries) {
    binding.bind_grad(e.param, u.full_grad.view(DType::F32, e.offset, model::param_shape(spec.param(e.param))),
                      write_of(e, fresh), &u);
  }
}

// Reduce-scatter (shard axis) in reduce_dtype, all-reduce of the shard (replicate axis), then add into
// the fp32 gradient shard. Each rank's contribution is already scaled by 1 / (global tokens), so the
// sums are the global mean gradient. With overlap every step of it runs on the reduce and replicate streams
// (see "Overlap" above); compute waits for it at the end of the step.
void FsdpEngine::reduce_gradients(Unit& u) {
  for (const FlatEntry& e : u.layout.entries)  // bound to be overwritten: a GEMM must have written it whole
    if (model_->binding().grad_unwritten(e.param))
      throw InternalError(fmt::format("FSDP unit {} ({}): the gradient of {} was never written in its backward",
                                      u.spec->index, u.spec->name, model_->spec().param(e.param).name));
  if (grads_in_shard_) return;  // nothing to reduce: backward wrote the shard itself
  if (observer_) observer_->schedule_point(SchedulePoint::ReductionIssued, u.spec->index);
  const DType rd = config_.reduce_dtype;
  const int64_t N = u.layout.padded_numel, n = u.shard();
  const int S = mesh_->shard_size(), R = mesh_->replicate_size();
  // all_reduce_last: replicas all-reduce only on the last micro-batch, the shard accumulated over the step; when
  // earlier micro-batches reduced into it already, that all-reduce follows the add (accumulated_all_reduce).
  const bool all_reduce_last = config_.accumulation == GradAccumulation::AllReduceLast;
  const bool replicas = R > 1 && (!all_reduce_last || last_micro_batch_);
  const bool accumulated_all_reduce = replicas && all_reduce_last && u.reduced_this_step;
  const bool collective = S > 1 || (replicas && !accumulated_all_reduce);  // one on the full gradient
  // The stream of the latest work on this unit's gradient, and the ops that queue there.
  StreamRef last = kCompute;
  ops::Ops* last_ops = ops_;
  if (streams_ && collective) {
    last = S > 1 ? streams_->reduce.ref() : streams_->replicate.ref();
    last_ops = S > 1 ? reduce_ops_.get() : replicate_ops_.get();
    streams_->grad_ready.record(kCompute);
    streams_->grad_ready.wait(last);
  }
  ops::Tensor full = u.full_grad.view(DType::F32, 0, {N});
  if (rd != DType::F32 && collective) {
    const ops::Tensor cast = reduce_full_.view(rd, 0, {N});
    last_ops->copy(full, cast);
    full = cast;
  }
  // Overlap, first fp32 reduction of the step: the collectives write the gradient shard itself.
  const bool direct = streams_ && collective && rd == DType::F32 && !u.reduced_this_step && !config_.offload_params;
  place_grad(u);
  const ops::Tensor grad = grad_tensor(u);
  if (watchdog_) watchdog_->set_unit(fmt::format("{} ({}, gradient reduction)", u.spec->index, u.spec->name));
  ops::Tensor shard = full;  // S == 1: the whole buffer is this rank's shard
  int slot = 0;
  if (S > 1) {
    if (streams_ && R > 1) {  // the previous user of this reduce buffer was an all-reduce on the replicate stream
      slot = streams_->next_slot;
      streams_->next_slot ^= 1;
      streams_->slot_free[slot].wait(last);
    }
    shard = direct ? grad : reduce_shard_[slot].view(rd, 0, {n});
    comms_->shard().reduce_scatter(full.data, shard.data, static_cast<size_t>(n), rd, ReduceOp::Sum, last);
    u.full_grad.fence.record(last);  // its next user waits for the collective (or cast) that read it last
  }
  if (replicas && !accumulated_all_reduce) {
    void* out = direct ? grad.data : shard.data;  // S == 1 and direct: from the full gradient into the shard
    if (streams_ && S > 1) {
      const StreamRef replicate = streams_->replicate.ref();
      streams_->scattered.record(last);
      streams_->scattered.wait(replicate);
      last = replicate;
      last_ops = replicate_ops_.get();
    }
    comms_->replicate().all_reduce(shard.data, out, static_cast<size_t>(n), rd, ReduceOp::Sum, last);
    if (direct) shard = grad;
  }
  if (watchdog_) watchdog_->set_unit("");
  // S == 1: the collective and the finish below read the full gradient buffer itself; this is the stream of the
  // last of them (the download stream when offload copies the buffer down from there).
  StreamRef full_grad_reader = last;
  if (!direct) {
    ops::Tensor shard_f32 = shard;
    if (shard.dtype != DType::F32) {
      shard_f32 = stage_.view(DType::F32, 0, {n});
      last_ops->copy(shard, shard_f32);
    }
    if (config_.offload_params) {
      // Down into pinned host memory on the download stream, after the reducing stream's event; the stream that
      // writes the source next (the reducing stream, or compute for a full gradient buffer) waits for the copy.
      // The step's first reduction goes straight into the host shard (zero + x = x); when it is also the step's
      // only one (in the last micro-batch), its sum of squares is taken first on the device, for the gradient norm
      // (device_grad_sq_sums). A later one goes into the pinned stage and a host function on the same stream adds
      // it into the host shard (which also keeps the next copy out of the stage until the add has read it). The
      // host waits once, at the end of the step (release_all).
      const bool first = !u.reduced_this_step;
      if (first && unit_sq_sums_ && last_micro_batch_) {
        last_ops->sum_squares(shard_f32, unit_sq_sums_.view(DType::F64, u.spec->index, {1}), ops::SumInto::Overwrite);
        ++unit_sums_taken_;
      }
      const StreamRef down = offload_streams_ ? offload_streams_->download.ref() : kCompute;
      if (offload_streams_) {
        offload_streams_->reduced.record(last);
        offload_streams_->reduced.wait(down);
      }
      copy_async(first ? static_cast<void*>(u.grad_data) : host_stage_.data(), shard_f32.data, static_cast<size_t>(n) * 4,
                 down);
      if (offload_streams_) {
        if (shard_f32.data == u.full_grad.data()) {
          full_grad_reader = down;  // its next user (compute, through the pool) waits for the copy
        } else {
          offload_streams_->staged.record(down);
          offload_streams_->staged.wait(last);
        }
      }
      if (!first) {
        host_callback(down, [stage = static_cast<const float*>(host_stage_.data()), grad = u.grad_data, n] {
          host_add(stage, grad, n);
        });
      }
      offload_copies_pending_ = true;
    } else if (!u.reduced_this_step) {
      last_ops->copy(shard_f32, grad);  // the step's first reduction: zero + x
    } else {
      last_ops->add(shard_f32, grad);
    }
  }
  if (S == 1) u.full_grad.fence.record(full_grad_reader);
  if (accumulated_all_reduce) {
    // The shard holds this replica's sum over the step: all-reduce it once, in reduce_dtype, in place.
    StreamRef replicate = kCompute;
    ops::Ops* replicate_ops = ops_;
    if (streams_) {
      replicate = streams_->replicate.ref();
      replicate_ops = replicate_ops_.get();
      if (!same(last, replicate)) {
        streams_->scattered.record(last);
        streams_->scattered.wait(replicate);
      }
    }
    last = replicate;
    last_ops = replicate_ops;
    if (watchdog_) watchdog_->set_unit(fmt::format("{} ({}, replica all-reduce)", u.spec->index, u.spec->name));
    if (rd == DType::F32) {
      comms_->replicate().all_reduce(grad.data, grad.data, static_cast<size_t>(n), rd, ReduceOp::Sum, last);
    } else {
      // A reduce_dtype buffer of n elements used on the replicate stream only: the slot (S > 1, freed by its
      // event below) or the full-gradient cast buffer (S == 1: NO_SHARD, whose casts run on this stream too).
      const ops::Tensor t = S > 1 ? reduce_shard_[slot].view(rd, 0, {n}) : reduce_full_.view(rd, 0, {n});
      replicate_ops->copy(grad, t);
      comms_->replicate().all_reduce(t.data, t.data, static_cast<size_t>(n), rd, ReduceOp::Sum, last);
      replicate_ops->copy(t, grad);
    }
    if (watchdog_) watchdog_->set_unit("");
  }
  if (unit_sq_sums_ && last_micro_batch_ && !config_.offload_params && !u.empty()) {
    // The step's last reduction into this shard has been queued: its sum of squares for the gradient norm, on
    // the stream that wrote it last, so that the norm's sums overlap the backward of the units still to come
    // instead of following the step's last reduction (device_grad_sq_sums).
    last_ops->sum_squares(grad, unit_sq_sums_.view(DType::F64, u.spec->index, {1}), ops::SumInto::Overwrite);
    ++unit_sums_taken_;
  }
  if (streams_) {
    if (S > 1 && R > 1) streams_->slot_free[slot].record(last);
    if (!same(last, kCompute)) {
      u.reduced_event.record(last);
      u.reduction_unwaited = true;
      if (config_.reduce_schedule == ReduceSchedule::Synchronous) wait_reductions();
    }
  }
  u.reduced_this_step = true;
  // Held back one reduction (grad_held_): the next unit's backward takes another buffer.
  if (grad_held_) grad_pool_.release(std::move(grad_held_));
  grad_held_ = std::move(u.full_grad);
}

// A unit's forward prefetches are issued at its first use, whether a prefetch gathered it already or not: so
// with depth 1 every unit is gathered while the one before it computes, not every other one.
void FsdpEngine::ensure_forward(int module) {
  const std::vector<int>& uses = model_->spec().module(module).uses;
  for (int p : uses) {
    Unit& u = *units_[unit_of_param_[p]];
    if (u.state == UnitState::InForward) continue;
    if (u.state == UnitState::Sharded) ++stats_.forward_on_demand;  // a unit holding a used parameter is not empty
    unshard(u);
    move_to(u, UnitState::InForward);
    for (int v : forward_prefetch_[u.spec->index]) unshard(*units_[v]);
  }
  for (int p : uses) wait_gathered(*units_[unit_of_param_[p]]);  // after the prefetches were issued
  if (observer_ && first_use_unit_[module] >= 0)
    observer_->schedule_point(SchedulePoint::ForwardBegins, first_use_unit_[module]);
}

void FsdpEngine::ensure_backward(int module) {
  for (int p : model_->spec().module(module).uses) {
    Unit& u = *units_[unit_of_param_[p]];
    if (u.state == UnitState::InBackward) {
      if (!u.staged.empty() && place_or_stage(u, module)) finish_staged(u);
      continue;
    }
    begin_unit_backward(u, module);
    for (int v : backward_prefetch_[u.spec->index]) unshard(*units_[v]);
  }
  for (int p : model_->spec().module(module).uses) wait_gathered(*units_[unit_of_param_[p]]);
  if (observer_) {
    for (const UnitSpec& us : unit_specs_)
      if (us.last_use == module) observer_->schedule_point(SchedulePoint::BackwardBegins, us.index);
  }
}

void FsdpEngine::before_forward(int module, model::ForwardPhase phase) {
  if (phase == model::ForwardPhase::Recompute) {
    for (int p : model_->spec().module(module).uses) {
      unshard(*units_[unit_of_param_[p]]);
      wait_gathered(*units_[unit_of_param_[p]]);
    }
    return;
  }
  ensure_forward(module);
}

void FsdpEngine::after_forward(int module, model::ForwardPhase phase) {
  if (phase == model::ForwardPhase::Recompute || !config_.reshards_after_forward()) return;
  for (auto& u : units_) {
    if (u->spec->last_use == module && !u->spec->is_root && u->state != UnitState::InBackward) reshard(*u);
  }
}

void FsdpEngine::before_backward(int module) { ensure_backward(module); }

void FsdpEngine::after_backward(int module) {
  if (grads_in_activations_ && layer_of_module_[static_cast<size_t>(module)] >= 0)
    placer_.layer_done(layer_of_module_[static_cast<size_t>(module)]);
  const int ui = first_use_unit_[module];
  if (ui < 0) return;
  Unit& u = *units_[ui];
  if (config_.accumulation != GradAccumulation::NoSync || last_micro_batch_) reduce_gradients(u);
  reshard(u);
}

model::LossResult FsdpEngine::forward_backward(const model::Batch& batch, double loss_scale, bool last_micro_batch) {
  last_micro_batch_ = last_micro_batch;
  model_->set_hooks(this);
  model::StepOptions step;
  step.loss_scale = loss_scale;
  grads_readable_ = false;
  begin_grad_pass(batch);
  const model::LossResult r = model_->forward_backward(batch, step);
  release_all();
  if (grads_in_activations_) {
    for (auto& u : units_)
      if (!u->staged.empty()) finish_staged(*u);
    if (!last_micro_batch) leave_activation_memory();
  }
  if (last_micro_batch) {  // a shard no reduction reached this step (zero_grad did not write it)
    for (auto& u : units_) {
      if (!u->reduced_this_step) {
        place_grad(*u);
        zero_shard_grad(*u);
      }
      u->reduced_this_step = true;
    }
    grads_readable_ = true;
  }
  return r;
}

model::LossResult FsdpEngine::forward(const model::Batch& batch) {
  if (grads_in_activations_) grads_readable_ = false;  // the arena they live in is written
  model_->set_hooks(this);
  const model::LossResult r = model_->forward(batch);
  release_all();
  return r;
}

void FsdpEngine::release_all() {
  for (auto& u : units_) reshard(*u);
  if (grad_held_) grad_pool_.release(std::move(grad_held_));
  // No host synchronization: every buffer goes back to its pool in stream order (or with its fence), and, at
  // the end of the step, compute waits on the device for the reductions still in flight, so the optimizer sees
  // final shards. Between micro-batches it does not: the next micro-batch's forward overlaps them, and its
  // reductions into the same shards queue behind them on the same streams.
  if (last_micro_batch_) wait_reductions();
  if (offload_copies_pending_ && last_micro_batch_) {  // the host optimizer reads the offloaded shards next
    // The copies down are on compute and on the download stream: the download stream waits for compute,
    // and the host for it, once per step (earlier micro-batches' copies and adds are ordered before the
    // later ones on the device; nothing on the host reads the shards in between).
    if (offload_streams_) {
      const StreamRef down = offload_streams_->download.ref();
      offload_streams_->reduced.record(kCompute);
      offload_streams_->reduced.wait(down);
      stream_synchronize(down);
    } else {
      stream_synchronize({});
    }
    offload_copies_pending_ = false;
  }
}

std::vector<int> FsdpEngine::first_forward_units() const {
  int first = -1;
  for (const auto& u : units_)
    if (!u->empty() && (first < 0 || u->spec->first_use < unit_specs_[static_cast<size_t>(first)].first_use))
      first = u->spec->index;
  std::vector<int> out;
  if (first < 0) return out;
  out.push_back(first);
  for (int v : forward_prefetch_[static_cast<size_t>(first)])
    if (!units_[static_cast<size_t>(v)]->empty()) out.push_back(v);
  return out;
}

void FsdpEngine::gather_ahead() {
  for (int v : first_forward_units()) unshard(*units_[static_cast<size_t>(v)]);
}

std::vector<float> FsdpEngine::gather_unit(int unit) {
  Unit& u = *units_.at(static_cast<size_t>(unit));
  if (pending_writes_) pending_writes_->wait_shard(unit);
  return gather_flat(u, u.master.data());
}

std::vector<float> FsdpEngine::gather_unit_values(int unit, std::span<const float> local) {
  Unit& u = *units_.at(static_cast<size_t>(unit));
  if (static_cast<int64_t>(local.size()) != u.shard())
    throw InternalError(
        fmt::format("gather_unit_values: unit {} has shards of {} elements, {} given", unit, u.shard(), local.size()));
  return gather_flat(u, local.data());
}

// The unit's whole flat buffer from each shard rank's `local` shard (device or host memory).
std::vector<float> FsdpEngine::gather_flat(Unit& u, const void* local) {
  const int64_t N = u.layout.padded_numel, n = u.shard();
  std::vector<float> out(static_cast<size_t>(N));
  FlatBuffer full(ops_->device(), Placement::Compute, static_cast<size_t>(N) * 4, ledger_, MemoryCategory::CommBuffers);
  float* slice = static_cast<float*>(full.data()) + mesh_->coord().shard * n;
  copy_async(slice, local, static_cast<size_t>(n) * 4, {});
  if (mesh_->shard_size() > 1) comms_->shard().all_gather(slice, full.data(), static_cast<size_t>(n), DType::F32);
  copy_async(out.data(), full.data(), out.size() * 4, {});
  stream_synchronize({});
  return out;
}

const double* FsdpEngine::device_grad_sq_sums() const {
  if (!unit_sq_sums_ || unit_sums_taken_ != nonempty_units_) return nullptr;
  return static_cast<const double*>(unit_sq_sums_.data());
}

void FsdpEngine::set_forward_prefetch(int unit, std::vector<int> units) {
  forward_prefetch_.at(static_cast<size_t>(unit)) = std::move(units);
}
void FsdpEngine::set_backward_prefetch(int unit, std::vector<int> units) {
  backward_prefetch_.at(static_cast<size_t>(unit)) = std::move(units);
}

}  // namespace shardtrain::fsdp
