// The FSDP test driver (see harness.hpp).
#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/replica.hpp"

namespace shardtrain::testing_fsdp {

model::LlamaConfig tiny_config() {
  model::LlamaConfig c;
  c.vocab_size = 53;  // odd sizes everywhere: flat buffers need padding
  c.max_position_embeddings = 64;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.init_seed = 7;
  return c;
}

namespace {

// Row b of global step `step`: a deterministic token pattern; every 5th target ignored.
void fill_row(int step, int b, int seq, int vocab, int32_t* ids, int32_t* targets) {
  for (int s = 0; s < seq; ++s) {
    ids[s] = (b * 31 + s * 7 + step * 13 + (b * s) % 5) % vocab;
    targets[s] = (s + b) % 5 == 4 ? -100 : (ids[s] * 3 + 1 + b) % vocab;
  }
}

}  // namespace

bool test_on_gpu() {
  const char* d = std::getenv("SHARDTRAIN_TEST_DEVICE");
  if (!d || std::string_view(d) != "cuda") return false;
  if (cuda_device_count() == 0) {
    throw Error(ExitCode::Device,
                "SHARDTRAIN_TEST_DEVICE=cuda, but no CUDA device is visible: " + cuda_unavailable_reason());
  }
  return true;
}

RunResult run_training(MPI_Comm world, int ranks_per_node, const RunOptions& o) {
  const Topology topo = discover_topology(world, ranks_per_node);
  DeviceMesh mesh(world, topo, {o.fsdp.strategy, o.fsdp.shard_size});
  // On a GPU every rank shares device 0 and the MPI backend stages device buffers through the host: the
  // equivalence matrix on one GPU (docs/gpu.md). SHARDTRAIN_TEST_COMM_BACKEND=nccl: a GPU per rank and NCCL
  // (several GPUs, or the CUDA emulator with as many devices).
  const bool gpu = test_on_gpu();
  const char* backend_env = std::getenv("SHARDTRAIN_TEST_COMM_BACKEND");
  const bool nccl = gpu && backend_env && std::string_view(backend_env) == "nccl";
  if (nccl && select_device(topo, DevicePreference::Cuda, machine_comm(world).get()).ranks_sharing > 1)
    throw Error(ExitCode::Device, "SHARDTRAIN_TEST_COMM_BACKEND=nccl needs a GPU per rank");
  MeshComms comms(mesh, nccl ? CommBackend::Nccl : CommBackend::Mpi, gpu ? MemorySpace::Device : MemorySpace::Host);
  auto ops = gpu ? ops::make_cuda_ops() : ops::make_cpu_ops({1});
  const DeviceKind dev = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
  model::ModelOptions mopts;
  mopts.checkpointing = o.fsdp.activation_checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None;
  mopts.activation_dtype = o.fsdp.param_dtype;
  const model::LlamaConfig config = o.model;
  model::LlamaModel model(config, *ops, mopts);
  MemoryLedger ledger;
  fsdp::FsdpConfig fsdp_config = o.fsdp;
  if (o.micro_batches > 1 && !o.grads_in_activations_with_accumulation) fsdp_config.grads_in_activation_memory = false;
  fsdp::FsdpEngine engine(model, mesh, comms, *ops, fsdp_config, ledger);
  engine.initialize(config.init_seed);
  optim::AdamWConfig acfg;
  acfg.lr = o.lr;
  optim::AdamW adamw(engine, acfg, &ledger);

  const int W = topo.world_size, rank = topo.world_rank;
  const int rows_per_rank = o.global_batch / W;
  const int rows_per_micro = rows_per_rank / o.micro_batches;
  if (o.before_first_step) o.before_first_step(engine, adamw);
  RunResult out;
  std::vector<int32_t> ids(static_cast<size_t>(rows_per_micro * o.seq)), targets(ids.size());
  DeviceBuffer device_ids, device_targets;
  if (gpu) {
    device_ids = DeviceBuffer(ids.size() * sizeof(int32_t));
    device_targets = DeviceBuffer(ids.size() * sizeof(int32_t));
  }
  optim::GradNorm grad_norm;
  for (int step = o.first_step; step < o.steps; ++step) {
    // Tokens that count in the global batch: the loss is their mean.
    int64_t global_tokens = 0;
    for (int b = 0; b < o.global_batch; ++b) {
      std::vector<int32_t> i(o.seq), t(o.seq);
      fill_row(step, b, o.seq, static_cast<int>(config.vocab_size), i.data(), t.data());
      for (int32_t x : t) global_tokens += x != -100;
    }
    engine.zero_grad();
    double loss_sum = 0;
    for (int mb = 0; mb < o.micro_batches; ++mb) {
      for (int r = 0; r < rows_per_micro; ++r) {
        const int b = rank * rows_per_rank + mb * rows_per_micro + r;
        fill_row(step, b, o.seq, static_cast<int>(config.vocab_size), ids.data() + r * o.seq, targets.data() + r * o.seq);
      }
      model::Batch batch;
      void* id_data = ids.data();
      void* target_data = targets.data();
      if (gpu) {  // pageable sources: each copy is staged before it returns, so the host vectors are free again
        copy_async(device_ids.data(), ids.data(), ids.size() * sizeof(int32_t), {});
        copy_async(device_targets.data(), targets.data(), targets.size() * sizeof(int32_t), {});
        id_data = device_ids.data();
        target_data = device_targets.data();
      }
      batch.input_ids = ops::make_tensor(id_data, DType::I32, {rows_per_micro, o.seq}, dev);
      batch.targets = ops::make_tensor(target_data, DType::I32, {rows_per_micro, o.seq}, dev);
      loss_sum +=
          engine.forward_backward(batch, 1.0 / static_cast<double>(global_tokens), mb == o.micro_batches - 1).loss_sum;
      if (o.after_micro_batch) o.after_micro_batch(mb);
    }
    // As the trainer does: one GradNorm kept across steps (no allocation, so no device-wide synchronization
    // that would complete every stream's work before the norm reads the gradients), this rank's part summed with
    // the loss in one all-reduce over the world. On a GPU that reduced gradients, from the engine's per-unit sums
    // taken on the device, checked against the shards' own norm.
    grad_norm.start_local(engine);
    double sums[2] = {loss_sum, optim::world_part(grad_norm.sum_of_squares(), comms.replicate())};
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, world);
    out.losses.push_back(sums[0] / static_cast<double>(global_tokens));
    const double norm = std::sqrt(sums[1]);
    if (engine.device_grad_sq_sums()) {
      const double shards = optim::grad_norm_global(engine.shards(), comms.shard());
      out.unit_sum_norm_diff = std::max(out.unit_sum_norm_diff, std::abs(norm - shards) / shards);
      ++out.unit_sum_norms;
    }
    out.grad_norms.push_back(norm);
    if (step == o.first_step) {  // the step's own traffic: before the update gathers the next step's first units
      out.shard_gather_bytes = comms.bytes(MeshAxis::Shard, CollectiveKind::AllGather);
      out.shard_reduce_scatter_bytes = comms.bytes(MeshAxis::Shard, CollectiveKind::ReduceScatter);
      out.replicate_all_reduce_bytes = comms.bytes(MeshAxis::Replicate, CollectiveKind::AllReduce);
    }
    const double clip = optim::clip_coefficient(norm, o.max_grad_norm);
    // The trainer's update (train::update_shards), whose CPU offload updates on the host instead (step_async): here
    // synchronously, in one launch.
    train::update_shards(adamw, engine, o.lr, clip, o.gather_ahead && !o.fsdp.offload_params);
    if (gpu) stream_synchronize({});  // after_step may read the shards from the host
    if (o.after_step) o.after_step(step, engine, adamw);
  }
  // SHARDTRAIN_TEST_PRINT_LOSSES=1: every run's losses and norms with all their digits, on rank 0 (to compare two
  // builds bit for bit).
  if (const char* p = std::getenv("SHARDTRAIN_TEST_PRINT_LOSSES"); p && std::string_view(p) == "1" && rank == 0) {
    std::string line = "losses";
    for (size_t i = 0; i < out.losses.size(); ++i) line += fmt::format(" {:.17g}/{:.17g}", out.losses[i], out.grad_norms[i]);
    std::printf("%s\n", line.c_str());
  }
  out.comm_buffer_peak = ledger.peak(MemoryCategory::CommBuffers);  // training's, before gather_unit's buffers
  for (size_t u = 0; u < (o.gather_params ? engine.units().size() : 0); ++u) {
    const std::vector<float> full = engine.gather_unit(static_cast<int>(u));
    for (const fsdp::FlatEntry& e : engine.layout(static_cast<int>(u)).entries) {
      out.params[e.param].assign(full.begin() + e.offset, full.begin() + e.offset + e.numel);
    }
    out.layouts.push_back(engine.layout(static_cast<int>(u)));
    out.unit_is_root.push_back(engine.units()[u].is_root);
  }
  out.sharded_param_bytes = ledger.current(MemoryCategory::ShardedParams);
  out.unsharded_param_peak = ledger.peak(MemoryCategory::UnshardedParams);
  out.unsharded_grad_peak = ledger.peak(MemoryCategory::UnshardedGrads);
  out.sharded_grad_bytes = ledger.current(MemoryCategory::ShardedGrads);
  out.grads_in_activations = engine.grads_in_activations();
  {
    const auto* base = static_cast<const char*>(model.arena_base());
    const size_t bytes = model.prepare(rows_per_micro, o.seq).bytes();
    for (const fsdp::ShardView& v : engine.shards()) {
      const auto* g = reinterpret_cast<const char*>(v.grad);
      out.grads_in_arena += v.numel > 0 && base && g >= base && g < base + bytes;
    }
  }
  out.max_outstanding = engine.stats().max_outstanding;
  out.forward_on_demand = engine.stats().forward_on_demand;
  return out;
}

}  // namespace shardtrain::testing_fsdp
