// The step-time prediction (predict.hpp): the training step of train/loop.cpp (zero_grad, the micro-batches'
// forward_backward, the gradient norm, the loss read, the one host all-reduce, AdamW) issued against the timing
// device, and read off its clocks.
#include "shardtrain/train/predict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <span>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/mesh/device_mesh.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/memory_ledger.hpp"
#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/replica.hpp"

namespace shardtrain::train {
namespace {

int nodes_spanned(const std::vector<int>& positions, int ranks_per_node) {
  std::set<int> nodes;
  for (const int p : positions) nodes.insert(p / ranks_per_node);
  return static_cast<int>(nodes.size());
}

// Names the tasks after the unit the engine is working on, so that each collective's wait is told apart.
class UnitLabels final : public fsdp::ScheduleObserver {
 public:
  UnitLabels(timing::TimingDevice& device, const std::vector<fsdp::UnitSpec>& units) : device_(&device), units_(&units) {}
  void schedule_point(fsdp::SchedulePoint, int unit) override { device_->set_context((*units_)[unit].name); }

 private:
  timing::TimingDevice* device_;
  const std::vector<fsdp::UnitSpec>* units_;
};

// The CPU backend's host work outside the ops (the gradient norm of host shards, the AdamW loop), run for real
// and its wall time put on the host's clock.
template <typename F>
void on_host(timing::TimingDevice& t, bool measure, double contention, const char* what, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  if (measure)
    t.host_work(contention * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), what,
                timing::WorkKind::Compute);
}

}  // namespace

Prediction predict_step(const TrainConfig& config, const PredictSetup& s) {
  if (!s.op_costs || !s.links) throw InternalError("predict_step: no op costs or links given");
  const int world = s.nodes * s.ranks_per_node;
  config.validate_for_world(world, s.nodes);
  Prediction p;
  p.layout = make_mesh_layout(MeshSpec{config.fsdp.engine.strategy, config.fsdp.engine.shard_size}, world, s.ranks_per_node);
  p.micro_batch = config.micro_batch_size_for(world);
  p.accumulation = config.accumulation_steps_for(world);
  p.seq = config.data.seq_len;
  const DeviceMesh mesh(p.layout, MeshCoord{0, 0});

  timing::HostCosts host = s.host;
  if (s.device == DeviceKind::Cpu) {  // the CPU backend runs its ops as calls: no launches, no device synchronizations
    host.launch_s = 0;
    host.comm_launch_s = 0;
    host.sync_s = 0;
  }
  timing::TimingDevice t(host);
  timing::TimingScope scope(t);
  const size_t memory_before = device_memory_stats().in_use;
  reset_device_memory_peak();
  const bool gpu = s.device == DeviceKind::Cuda;
  const MemorySpace space = gpu ? MemorySpace::Device : MemorySpace::Host;
  const CommBackend backend = gpu ? CommBackend::Nccl : CommBackend::Mpi;
  std::vector<int> everyone(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) everyone[static_cast<size_t>(r)] = r;
  auto make = [&](MeshAxis axis, const std::vector<int>& group, MemorySpace where, CommBackend how) {
    const int n = static_cast<int>(group.size());
    GroupLinks links = s.links(axis, n, nodes_spanned(group, s.ranks_per_node));
    p.links_described +=
        fmt::format("{}{}: {} ranks, {}", p.links_described.empty() ? "" : "; ", mesh_axis_name(axis), n, links.source);
    return make_sim_communicator(axis, 0, n, where, how, std::move(links));
  };
  // As MeshComms makes them: the world axis carries host values over MPI whatever the backend.
  MeshComms comms(backend, make(MeshAxis::World, everyone, MemorySpace::Host, CommBackend::Mpi),
                  make(MeshAxis::Shard, p.layout.shard_group(0), space, backend),
                  make(MeshAxis::Replicate, p.layout.replicate_group(0), space, backend));

  std::unique_ptr<ops::Ops> ops = ops::make_timing_ops(s.device, *s.op_costs);
  ops->defer_loss(true);
  model::LlamaModel model(config.model, *ops, model_options(config));
  MemoryLedger ledger;
  fsdp::FsdpEngine engine(model, mesh, comms, *ops, engine_config(config, world), ledger);
  UnitLabels labels(t, engine.units());
  engine.set_schedule_observer(&labels);
  if (s.engine_setup) s.engine_setup(engine);
  optim::AdamW adamw(engine, config.optim.adamw, &ledger);
  // The CUDA backend's own scratch (the fused loss's chunk, the kernel and cuBLASLt workspaces), which the timing
  // ops do not allocate: held as the backend holds it, from the same formula `plan` counts it with.
  const DeviceBuffer op_scratch(
      gpu ? fsdp::op_scratch_bytes(model.spec(), config.fsdp.engine.param_dtype, p.micro_batch, p.seq).total() : 0);
  optim::GradNorm grad_norm;

  // The micro-batch: token 0 everywhere (its values change no time), copied up as Replica::model_batch does.
  const ops::Shape shape{p.micro_batch, p.seq};
  const size_t batch_bytes = static_cast<size_t>(shape.numel()) * sizeof(int32_t);
  // Packed rows with the document mask carry document ids (one document a row here), as Replica::model_batch's do.
  const bool documents = config.data.layout == data::BatchLayout::Packed && config.data.document_mask;
  std::vector<int32_t> host_ids(static_cast<size_t>(shape.numel()), 0), host_targets = host_ids, host_docs = host_ids;
  DeviceBuffer device_ids(gpu ? batch_bytes : 0), device_targets(gpu ? batch_bytes : 0),
      device_docs(gpu && documents ? batch_bytes : 0);
  auto tensor = [&](DeviceBuffer& device, std::vector<int32_t>& host) {
    return gpu ? ops::make_tensor(device.data(), DType::I32, shape, DeviceKind::Cuda)
               : ops::make_tensor(host.data(), DType::I32, shape);
  };
  model::Batch batch;
  batch.input_ids = tensor(device_ids, host_ids);
  batch.targets = tensor(device_targets, host_targets);
  if (documents) {
    batch.document_ids = tensor(device_docs, host_docs);
    batch.document_runs = p.micro_batch;
  }
  const double loss_scale = 1.0 / (static_cast<double>(shape.numel()) * p.accumulation * world);
  std::vector<double> step_values(4, 0.0);  // the loss, the non-finite flag, the norm's square, a hook's value

  std::vector<double> synced;  // the host's clock once each step's loss and norm are read
  for (int k = 0; k < s.warmup_steps + s.steps; ++k) {
    if (k == s.warmup_steps) t.clear_record();
    t.set_context("");
    engine.zero_grad();
    for (int a = 0; a < p.accumulation; ++a) {
      if (gpu) {
        t.set_context("");
        copy_async(device_ids.data(), host_ids.data(), batch_bytes, ops->stream());
        copy_async(device_targets.data(), host_targets.data(), batch_bytes, ops->stream());
        if (documents) copy_async(device_docs.data(), host_docs.data(), batch_bytes, ops->stream());
      }
      engine.forward_backward(batch, loss_scale, a == p.accumulation - 1);
    }
    t.set_context("step");
    on_host(t, !gpu && s.time_host_updates, s.host_contention, "gradient norm (host, measured)",
            [&] { grad_norm.start_local(engine); });
    ops->take_loss();  // the host waits for the ops' stream, as CudaOps' read of the loss does
    step_values[2] = optim::world_part(grad_norm.sum_of_squares(), comms.replicate());
    synced.push_back(t.host_now());
    comms.world().all_reduce(std::span<double>(step_values), ReduceOp::Sum);
    const double norm = std::sqrt(step_values[2]);
    on_host(t, !gpu && s.time_host_updates, s.host_contention, "adamw (host, measured)", [&] {
      const double clip = optim::clip_coefficient(norm, config.optim.max_grad_norm);
      update_shards(adamw, engine, 1e-4, clip, s.gather_ahead && !config.fsdp.engine.offload_params);
    });
  }
  t.synchronize_all();

  const double steps = s.steps;
  p.step_s = (synced.back() - synced[static_cast<size_t>(s.warmup_steps - 1)]) / steps;
  p.tokens_per_s_per_rank = static_cast<double>(shape.numel()) * p.accumulation / p.step_s;
  p.flops_per_token = flops_per_token(model.spec(), p.seq);
  if (gpu) {
    p.spec_peak_flops = ops::gpu_spec_peak(s.device_name).flops_per_s;
    // Not clamped: above 1 the op costs are impossible for the device, which the caller must say (cmd_predict.cpp).
    if (p.spec_peak_flops > 0) p.mfu = p.flops_per_token * p.tokens_per_s_per_rank / p.spec_peak_flops;
  }
  // "layers.3 all_gather shard 50.3 MB" -> "layers.3 all_gather shard": one entry per unit and collective
  auto cause_of = [](std::string what) {
    if (const size_t mb = what.rfind(" MB"); mb != std::string::npos && mb + 3 == what.size())
      what = what.substr(0, what.rfind(' ', mb - 1));
    return what;
  };
  const double last_sync = synced[synced.size() - 2];
  std::map<std::string, IdleCause> idle;
  auto idle_for = [&](const std::string& what, double seconds, bool communication, bool copy = false) {
    IdleCause& c = idle[what];
    c.seconds += seconds;
    c.communication = communication;
    c.copy = copy;
  };
  std::map<std::string, WorkTotal> by_work;
  for (const timing::Task& task : t.tasks()) {
    const double seconds = (task.end - task.start) / steps;
    // On a GPU the compute stream (0); on the CPU backend the host, which runs the ops and blocks in collectives.
    const bool on_compute = task.stream == (gpu ? 0 : -1);
    if (task.kind == timing::WorkKind::Compute && on_compute) {
      p.compute_busy_s += seconds;
      WorkTotal& w = by_work[task.work.substr(0, task.work.find(' '))];
      w.calls += 1;  // per step below
      w.seconds += seconds;
    }
    if (task.kind == timing::WorkKind::Copy) p.copy_busy_s += seconds;
    if (task.kind == timing::WorkKind::Comm) {
      p.comm_busy_s += seconds;
      if (!gpu) idle_for(cause_of(task.label), seconds, true);  // nothing overlaps a blocking collective
    }
    if (task.issued >= last_sync) p.tasks.push_back(task);
  }
  for (const auto& [cause, i] : t.compute_idle()) {
    const bool copy = i.kind == timing::WorkKind::Copy;
    idle_for(cause_of(cause), (i.waiting_s + i.host_s) / steps, copy || i.kind == timing::WorkKind::Comm, copy);
  }
  for (auto& [what, c] : idle) {
    c.what = what;
    p.idle.push_back(c);
    if (what == "host") p.host_idle_s += c.seconds;
    if (c.copy) p.exposed_copy_s += c.seconds;
    else if (c.communication) p.exposed_comm_s += c.seconds;
  }
  std::sort(p.idle.begin(), p.idle.end(), [](const IdleCause& a, const IdleCause& b) { return a.seconds > b.seconds; });
  for (auto& [work, w] : by_work) {
    w.work = work;
    w.calls /= steps;
    p.compute_by_work.push_back(w);
  }
  std::sort(p.compute_by_work.begin(), p.compute_by_work.end(),
            [](const WorkTotal& a, const WorkTotal& b) { return a.seconds > b.seconds; });
  p.peak_device_bytes = device_memory_stats().peak - memory_before;
  return p;
}

}  // namespace shardtrain::train
