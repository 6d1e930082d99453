// The FSDP engine: owns each unit's flat shards (fp32 master and gradient), gathers units before the
// model uses them and releases them after, and reduces gradients over the mesh. It drives the model
// from outside through ModuleHooks and ParamBinding; the model never sees a communicator.
//
// On a GPU with device-memory communicators the collectives run on their own streams (engine.cpp,
// "Overlap"), so the next unit's all-gather and the last unit's reduce-scatter overlap compute.
//
// Per step: zero_grad(); forward_backward(micro_batch, scale, last) for each micro-batch; then the
// optimizer works on shards() (grad norm, clipping, AdamW).
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/comm/watchdog.hpp"
#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/fsdp/flat_storage.hpp"
#include "shardtrain/fsdp/grad_placement.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/memory_ledger.hpp"

namespace shardtrain::fsdp {

// One unit's shard as the optimizer and checkpoints see it: fp32, in host memory when offloaded.
struct ShardView {
  int unit = 0;
  float* param = nullptr;          // master shard
  float* grad = nullptr;           // gradient shard (reduced, accumulated over micro-batches)
  int64_t numel = 0;               // N / S, padding included
  int64_t flat_begin = 0;          // where the shard starts in the unit's flat buffer
  std::vector<ParamRange> ranges;  // parameter parts inside the shard, shard-relative offsets
  DeviceKind device = DeviceKind::Cpu;
};

// Whatever may still be writing master shards on the host while the engine runs: CPU offload's optimizer
// update on a worker thread (optim::AdamW::step_async), which overlaps the next forward. The engine waits
// for a unit's shard before it copies the shard to the device.
class PendingShardWrites {
 public:
  virtual void wait_shard(int unit) const = 0;

 protected:
  ~PendingShardWrites() = default;
};

// What the engine is about to queue, for tests of its schedule (tests/fsdp/overlap_test.cpp marks these points in
// the CUDA emulator's stream trace): called before a unit's all-gather is issued, once the unit's forward or
// backward may start computing (its gather waited for, its prefetches issued), and before its gradient reduction
// is issued.
enum class SchedulePoint { GatherIssued, ForwardBegins, BackwardBegins, ReductionIssued };
class ScheduleObserver {
 public:
  virtual void schedule_point(SchedulePoint what, int unit) = 0;

 protected:
  ~ScheduleObserver() = default;
};

// A unit's parameters through one pass of forward_backward or forward (docs/fsdp.md, "Unit lifecycle"). Every
// change goes through check_unit_transition, which throws InternalError on any other than these:
//   Sharded    -> Gathered    unshard: a prefetch, a recompute, or the unit's first use gathers the parameters
//   Gathered   -> InForward   its forward begins (its forward prefetches are issued then)
//   Gathered   -> InBackward  its backward begins (gradients bound to a buffer)
//   InForward  -> InBackward  the same, the unit kept gathered since its forward
//   Gathered, InForward, InBackward -> Sharded   reshard: after its forward, after its backward, release_all
// Its gradient shard's state over the step, and whether compute still has to wait for its gather's or its
// reduction's event, are separate (engine.cpp, struct Unit): a unit is gathered for the next micro-batch while
// its last reduction is still in flight.
enum class UnitState { Sharded, Gathered, InForward, InBackward };
const char* unit_state_name(UnitState state);
// Throws InternalError naming the unit (its index and name) and both states unless `from -> to` is one of the
// transitions above. Allocates nothing when it is.
void check_unit_transition(int unit, std::string_view name, UnitState from, UnitState to);

struct UnitStats {
  int gathers = 0;            // all-gathers issued this step
  int max_outstanding = 0;    // most non-root units gathered at once, since the last reset
  int forward_on_demand = 0;  // units no prefetch had gathered when their forward began, since the last reset
};

class FsdpEngine final : public model::ModuleHooks {
 public:
  FsdpEngine(model::LlamaModel& model, const DeviceMesh& mesh, MeshComms& comms, ops::Ops& ops, const FsdpConfig& config,
             MemoryLedger& ledger);
  ~FsdpEngine() override;

  // Each rank fills only its own slices with the model's counter-based init (no rank holds the model).
  void initialize(uint64_t seed);
  // Broadcasts replica 0's shards to the other replicas (weights that came from elsewhere).
  void sync_module_states();

  // One micro-batch: forward, backward, and (in lean mode, or on the last micro-batch) the gradient
  // reduction into the shards. loss_scale multiplies the summed token loss (1 / global tokens for a mean).
  // The loss returned is the backend's answer: with Ops::defer_loss on (as train::Replica sets it) it is zero,
  // and the real sum waits in the backend, added to its running total, until ops.take_loss().
  model::LossResult forward_backward(const model::Batch& batch, double loss_scale, bool last_micro_batch);
  // Loss only; every unit is released afterwards. Deferred as forward_backward's.
  model::LossResult forward(const model::Batch& batch);
  // The gradient shards count as zero from here; nothing is written (engine.cpp, zero_grad).
  void zero_grad();

  // With grads in activation memory (FsdpConfig::grads_in_activation_memory) a shard's `grad` points into the
  // model's activation arena, found anew by each forward_backward (the optimizer rebinds when it moved), and is
  // null before the first.
  const std::vector<ShardView>& shards() const { return shard_views_; }
  // Whether the gradient shards hold the last step's gradients: after forward_backward's last micro-batch and
  // until the next pass, or, with grads in activation memory, until any forward (an evaluation's included)
  // writes the memory they are in. The trainer checks it before the update.
  bool gradients_readable() const { return grads_readable_; }
  // Whether gradient shards are being placed in activation memory (it ends at a micro-batch that is not a step's
  // last: gradient accumulation needs them kept across forwards).
  bool grads_in_activations() const { return grads_in_activations_; }
  const std::vector<UnitSpec>& units() const { return unit_specs_; }
  const FlatLayout& layout(int unit) const;
  const FsdpConfig& config() const { return config_; }
  const model::ModelSpec& model_spec() const { return model_->spec(); }
  const DeviceMesh& mesh() const { return *mesh_; }
  MeshComms& comms() { return *comms_; }
  const UnitStats& stats() const { return stats_; }
  // Names the unit whose collectives are in flight, for the hang watchdog's message (not owned).
  void set_watchdog(CollectiveWatchdog* w) { watchdog_ = w; }
  // Master shards the host may still be writing (not owned; null: none). unshard and gather_unit wait.
  void set_pending_writes(const PendingShardWrites* w) { pending_writes_ = w; }
  void reset_stats() { stats_ = {}; }
  void set_schedule_observer(ScheduleObserver* o) { observer_ = o; }  // not owned; null: none

  // On a GPU, when the step reduced gradients: the sums of squares of this step's gradient shards, one double per
  // unit (units() order) in device memory, each taken on the stream of the unit's last reduction of the step as
  // soon as it was queued (with CPU offload, on its way down); they are complete once the work queued on the ops'
  // stream has run (the step's end waits for the reductions). Null when the step reduced nothing (one GPU, the
  // gradients written in place), or with offload when a unit's host shard is not one reduction (accumulation that
  // reduces every micro-batch): the norm must then read the shards.
  const double* device_grad_sq_sums() const;

  // Between steps, on the overlapped schedule (overlaps_communication): the units the next forward gathers first
  // (its first unit and that unit's forward prefetches), and their gathers issued now. The trainer calls it in
  // the middle of the update (optim::AdamW::step_split): once those units' master shards are updated, and while
  // the other units' update runs, so the next step's first all-gathers overlap it instead of waiting for it
  // after. Master shards written from outside before the next pass (a checkpoint load) need release_gathered.
  std::vector<int> first_forward_units() const;
  void gather_ahead();
  bool overlaps_communication() const { return streams_ != nullptr; }
  // Reshards every gathered unit, outside a pass: gathered copies of master shards about to be written.
  void release_gathered() { release_all(); }

  // The full fp32 parameters of a unit (N elements, padding included), all-gathered over the shard
  // axis from the master shards: for tests, checkpoints and export. Collective over the shard axis.
  std::vector<float> gather_unit(int unit);
  // The same for any state laid out as the unit's master shard: `local` holds this rank's shard of it (n elements,
  // host memory; AdamW's moments read with read_state). Collective over the shard axis.
  std::vector<float> gather_unit_values(int unit, std::span<const float> local);

  // Prefetch schedule: the units to all-gather right after `unit` in forward / backward (the seeds'
  // set_modules_to_forward_prefetch / set_modules_to_backward_prefetch). Defaults come from the depths.
  void set_forward_prefetch(int unit, std::vector<int> units);
  void set_backward_prefetch(int unit, std::vector<int> units);
  const std::vector<int>& backward_prefetch(int unit) const { return backward_prefetch_.at(static_cast<size_t>(unit)); }

  // ModuleHooks
  void before_forward(int module, model::ForwardPhase phase) override;
  void after_forward(int module, model::ForwardPhase phase) override;
  void before_backward(int module) override;
  void after_backward(int module) override;

 private:
  struct Unit;
  struct Streams;
  struct OffloadStreams;
  void unshard(Unit& u);
  void all_gather_unit(Unit& u, StreamRef stream);
  std::vector<float> gather_flat(Unit& u, const void* local);
  void wait_gathered(Unit& u);
  void wait_reductions();
  void reshard(Unit& u);
  void move_to(Unit& u, UnitState to);  // check_unit_transition, then the new state
  void begin_unit_backward(Unit& u, int module);
  ops::Tensor grad_tensor(const Unit& u) const;  // the whole shard
  ops::Tensor grad_tensor(const Unit& u, int64_t offset, ops::Shape shape) const;
  void begin_grad_pass(const model::Batch& batch);
  void set_grad_data(Unit& u, float* data);
  bool place_in_arena(Unit& u);
  void place_grad(Unit& u);
  bool place_or_stage(Unit& u, int module);
  void finish_staged(Unit& u);
  void leave_activation_memory();
  void reduce_gradients(Unit& u);
  void ensure_forward(int module);
  void ensure_backward(int module);
  void release_all();
  void zero_shard_grad(Unit& u);
  void zero_for_backward(const Unit& u, const ops::Tensor& g);
  void zero_grad_range(const ops::Tensor& g, int64_t begin, int64_t end);
  void* host_stage_scratch(size_t floats);  // host memory for shards whose communicator wants host buffers

  model::LlamaModel* model_;
  const DeviceMesh* mesh_;
  MeshComms* comms_;
  ops::Ops* ops_;
  FsdpConfig config_;
  MemoryLedger* ledger_;
  std::vector<UnitSpec> unit_specs_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<int> unit_of_param_;
  std::vector<int> first_use_unit_;  // per module: units whose first use is this module
  std::vector<ShardView> shard_views_;
  std::vector<std::vector<int>> forward_prefetch_, backward_prefetch_;
  FlatPool param_pool_, grad_pool_;
  FlatPool upload_pool_;  // offload: (N/S) fp32 device copies of master shards, from upload to their cast
  FlatBuffer stage_;      // (N/S) fp32 on the compute device: reduce_dtype casts
  // (N/S) reduce_dtype: the reduce-scatter output; two with replicas (hybrid), used in turn, so that a unit's
  // reduce-scatter does not wait for the previous unit's all-reduce over replicas.
  FlatBuffer reduce_shard_[2];
  // The full gradient buffer of the unit reduced last, held back from the pool until the next unit's reduction
  // is issued: the unit whose backward starts next takes another buffer, so compute does not wait for the
  // reduction just issued (double buffering; the plan counts it).
  FlatBuffer grad_held_;
  // On a GPU with overlap: ops on the reduce and replicate streams (their own contexts, so that compute never
  // waits for them through a stream switch): the casts and adds of reductions run there, beside compute.
  std::unique_ptr<ops::Ops> reduce_ops_, replicate_ops_;
  std::unique_ptr<ops::Ops> upload_ops_;  // offload on a GPU: casts of uploaded master shards, on the upload stream
  ScheduleObserver* observer_ = nullptr;
  FlatBuffer reduce_full_;   // (N) reduce_dtype when it is not fp32
  FlatBuffer host_stage_;    // (N/S) fp32 pinned host: reduced gradients on their way to offloaded shards
  FlatBuffer unit_sq_sums_;  // a GPU with reductions: one f64 per unit, device_grad_sq_sums
  int unit_sums_taken_ = 0, nonempty_units_ = 0;
  std::vector<float> host_scratch_;
  bool last_micro_batch_ = true;
  // grads_live_in_shards (plan.hpp): backward accumulates into the gradient shards themselves, with no full
  // gradient buffer and no reduction (one rank: a 1 x 1 mesh).
  bool grads_in_shard_ = false;
  // Gradient shards in activation memory that backward is done with (grad_placement.hpp): the config's choice
  // until a micro-batch that is not a step's last. The placer decides per pass; arena_base_ is the model's
  // arena for the pass; the stage holds early gradients (the final norm's) until their shard has a place.
  bool grads_in_activations_ = false;
  bool grads_readable_ = true;
  GradPlacer placer_;
  char* arena_base_ = nullptr;
  FlatBuffer grad_stage_;
  std::vector<int> layer_of_module_;     // per module: its decoder layer when it is a LlamaDecoderLayer, else -1
  bool offload_copies_pending_ = false;  // reduced gradients on their way down to offloaded shards
  CollectiveWatchdog* watchdog_ = nullptr;
  const PendingShardWrites* pending_writes_ = nullptr;
  UnitStats stats_;
  // The overlapped schedule (a GPU with device-memory communicators, shards not offloaded): all-gathers,
  // reduce-scatters and replica all-reduces on streams of their own, ordered against the compute stream
  // (the ops' stream) by events. Null: everything in call order on the compute stream.
  std::unique_ptr<Streams> streams_;
  // Offload on a GPU: master shards go up on the upload stream when a unit is unsharded (prefetched), and
  // first reductions go down on the download stream; compute waits by events only. Null on the CPU.
  std::unique_ptr<OffloadStreams> offload_streams_;
};

}  // namespace shardtrain::fsdp
