// One replica of the model as `shardtrain train`, `evaluate` and `bench step` run it: the device mesh, the
// collective watchdog, the mesh's communicators, the ops backend, the model, the memory ledger and the FSDP
// engine, built here in one place with the parameters initialized. Each part refers to parts built before it,
// and the members are declared so that they are destroyed in the reverse order (the watchdog after the
// communicators, which unregister from it; the engine first). No optimizer, loader or run directory: the
// trainer adds those, the evaluator its held-out loaders.
#pragma once

#include <memory>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/comm/watchdog.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/memory_ledger.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::optim {
class AdamW;
}

namespace shardtrain::train {

// The model's options a training config asks for (activation dtype, checkpointing): the replica's, and the
// step-time prediction's (predict.hpp).
model::ModelOptions model_options(const TrainConfig& config);
// The engine's options for a world of `world_size` ranks: config.fsdp.engine, with the gradient shards kept out
// of activation memory when a step has more than one micro-batch (the next forward would overwrite them).
fsdp::FsdpConfig engine_config(const TrainConfig& config, int world_size);
// One step's update of the shards where they live (on the device, or host shards on the CPU backend; not CPU
// offload's asynchronous host update), as the trainer and the step-time prediction run it: on the overlapped
// schedule in two launches around the next step's first gathers (FsdpEngine::gather_ahead), so that those
// all-gathers overlap the rest of the update; else in one. gather_ahead false: in one always (for comparison).
void update_shards(optim::AdamW& adamw, fsdp::FsdpEngine& engine, double lr, double clip, bool gather_ahead = true);

class Replica {
 public:
  // Collective over the world: the mesh of config.fsdp.engine, its communicators (fsdp.comm_backend), the
  // model, the engine, and the parameters initialized from config.model.init_seed. `ops` is the backend to
  // compute with, or null for the runtime's device's (the trainer makes the CUDA ops earlier, to measure the
  // peak through them). The backend's losses are deferred (Ops::defer_loss): the engine hands back zero sums
  // and the step's total is read once, with ops().take_loss().
  Replica(const Runtime& runtime, const TrainConfig& config, std::unique_ptr<ops::Ops> ops = nullptr);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  const Runtime& runtime() const { return *runtime_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  CollectiveWatchdog& watchdog() { return *watchdog_; }
  MeshComms& comms() { return *comms_; }
  const CommBackendChoice& comm_backend() const { return backend_; }  // and why it was chosen
  ops::Ops& ops() { return *ops_; }
  model::LlamaModel& model() { return *model_; }
  MemoryLedger& ledger() { return ledger_; }
  fsdp::FsdpEngine& engine() { return *engine_; }

  // The micro-batch as the model reads it: host views on the CPU backend; on a GPU, copied into device
  // buffers (asynchronously, on the ops' stream) that the next call reuses. The loader may refill `mb` only
  // once the copies ran: after a synchronization of the ops' stream.
  model::Batch model_batch(data::MicroBatch& mb);

 private:
  const Runtime* runtime_;
  bool document_ids_ = false;  // packed rows with data.document_mask: the batch carries document ids
  CommBackendChoice backend_;
  std::unique_ptr<DeviceMesh> mesh_;
  // Before comms_, so it is destroyed after them: a communicator's destructor unregisters itself from the
  // watchdog (NCCL's asynchronous-error source).
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::unique_ptr<MeshComms> comms_;
  std::unique_ptr<ops::Ops> ops_;
  DeviceBuffer batch_ids_, batch_targets_, batch_docs_;  // the micro-batch on the GPU
  std::unique_ptr<model::LlamaModel> model_;
  MemoryLedger ledger_;
  std::unique_ptr<fsdp::FsdpEngine> engine_;
};

}  // namespace shardtrain::train
