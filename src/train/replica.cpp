// The replica (replica.hpp): mesh, watchdog, communicators, ops, model, ledger and engine, built in order;
// and the micro-batch as the model reads it.
#include "shardtrain/train/replica.hpp"

#include <chrono>
#include <span>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/optim/adamw.hpp"

namespace shardtrain::train {

model::ModelOptions model_options(const TrainConfig& config) {
  model::ModelOptions o;
  o.activation_dtype = config.fsdp.engine.param_dtype;
  o.checkpointing =
      config.fsdp.engine.activation_checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None;
  return o;
}

void update_shards(optim::AdamW& adamw, fsdp::FsdpEngine& engine, double lr, double clip, bool gather_ahead) {
  if (gather_ahead && engine.overlaps_communication()) {
    adamw.step_split(engine.shards(), lr, clip, {}, engine.first_forward_units(), [&] { engine.gather_ahead(); });
  } else {
    adamw.step(engine.shards(), lr, clip);
  }
}

fsdp::FsdpConfig engine_config(const TrainConfig& config, int world_size) {
  fsdp::FsdpConfig f = config.fsdp.engine;
  if (config.accumulation_steps_for(world_size) != 1) f.grads_in_activation_memory = false;
  return f;
}

Replica::Replica(const Runtime& runtime, const TrainConfig& config, std::unique_ptr<ops::Ops> ops)
    : runtime_(&runtime), document_ids_(config.data.layout == data::BatchLayout::Packed && config.data.document_mask) {
  const bool on_gpu = runtime.device().is_cuda();
  ops_ = ops ? std::move(ops) : on_gpu ? ops::make_cuda_ops() : ops::make_cpu_ops({runtime.host_threads()});
  ops_->defer_loss(true);  // the losses of a step's micro-batches are read once, after the last one

  mesh_ = std::make_unique<DeviceMesh>(runtime.world(), runtime.topology(),
                                       MeshSpec{config.fsdp.engine.strategy, config.fsdp.engine.shard_size});
  backend_ = choose_comm_backend(runtime, config.fsdp.comm_backend);
  comms_ = std::make_unique<MeshComms>(*mesh_, backend_.backend, on_gpu ? MemorySpace::Device : MemorySpace::Host);
  watchdog_ = std::make_unique<CollectiveWatchdog>(std::chrono::duration<double>(config.fsdp.collective_timeout));
  comms_->set_watchdog(watchdog_.get());
  model_ = std::make_unique<model::LlamaModel>(config.model, *ops_, model_options(config));
  engine_ = std::make_unique<fsdp::FsdpEngine>(*model_, *mesh_, *comms_, *ops_,
                                               engine_config(config, runtime.topology().world_size), ledger_);
  engine_->set_watchdog(watchdog_.get());
  engine_->initialize(config.model.init_seed);  // and sync_module_states when the config asks for it
}

Replica::~Replica() = default;

model::Batch Replica::model_batch(data::MicroBatch& mb) {
  const bool with_documents = document_ids_;
  model::Batch b;
  const ops::Shape shape{mb.batch, mb.seq};
  if (with_documents) {  // the runs of one document in each row: lets the GPU pick a kernel without reading them
    for (int64_t r = 0; r < mb.batch; ++r)
      for (int64_t i = 0; i < mb.seq; ++i) {
        const size_t at = static_cast<size_t>(r * mb.seq + i);
        b.document_runs += i == 0 || mb.doc_ids[at] != mb.doc_ids[at - 1];
      }
  }
  if (ops_->device() != DeviceKind::Cuda) {
    b.input_ids = ops::make_tensor(mb.tokens.data(), DType::I32, shape);
    b.targets = ops::make_tensor(mb.targets.data(), DType::I32, shape);
    if (with_documents) b.document_ids = ops::make_tensor(mb.doc_ids.data(), DType::I32, shape);
    return b;
  }
  // Asynchronous copies from the micro-batch's pinned storage, in stream order: the previous micro-batch's
  // kernels have read these device buffers before the copies land. The loader may refill the host storage
  // only after the copies ran: a training step recycles its micro-batches after the loss and gradient norm
  // were read (stream synchronizations that follow every copy), evaluation synchronizes before it recycles.
  const size_t bytes = static_cast<size_t>(shape.numel()) * sizeof(int32_t);
  auto upload = [&](DeviceBuffer& buf, std::span<const int32_t> host) {
    if (buf.size() < bytes) buf = DeviceBuffer(bytes);
    copy_async(buf.data(), host.data(), bytes, ops_->stream());
    return ops::make_tensor(buf.data(), DType::I32, shape, DeviceKind::Cuda);
  };
  b.input_ids = upload(batch_ids_, mb.tokens);
  b.targets = upload(batch_targets_, mb.targets);
  if (with_documents) b.document_ids = upload(batch_docs_, mb.doc_ids);
  return b;
}

}  // namespace shardtrain::train
