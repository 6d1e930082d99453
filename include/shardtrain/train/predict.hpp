// The step-time prediction (docs/predict.md): one rank of an N-node x G-GPU job, its training step run by the real
// model, FSDP engine, gradient norm and AdamW against a timing device (runtime/timing_device.hpp), timing ops
// (ops/timing_ops.hpp) and simulated communicators (comm/sim_communicator.hpp). Nothing is computed and no memory
// is held on the device: the engine lays out its own schedule (unit order, prefetches, streams, events, buffer
// reuse) in virtual time, and the prediction reads the step time, the compute stream's idle time by cause (each
// unit's collectives, the host) and the peak of device memory off it. Ranks are taken to be alike (the same
// schedule and sizes on each), so one rank's timeline stands for the job's.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shardtrain/comm/sim_communicator.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/ops/timing_ops.hpp"
#include "shardtrain/runtime/timing_device.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

struct PredictSetup {
  int nodes = 1;
  int ranks_per_node = 8;                // GPUs per node (the CPU backend: processes per node)
  DeviceKind device = DeviceKind::Cuda;  // Cpu: the CPU backend (ops and collectives block the host)
  std::string device_name;               // e.g. "NVIDIA H100 80GB HBM3": MFU's datasheet peak (none for the CPU)
  const ops::OpCostModel* op_costs = nullptr;
  timing::HostCosts host;
  // The links of one group of a mesh axis: `ranks` ranks spread over `nodes` nodes.
  std::function<GroupLinks(MeshAxis axis, int ranks, int nodes)> links;
  // Host work the CPU backend does outside the ops (gradient norm of host shards, the AdamW update): measured here
  // by running it (true), or left out (false).
  bool time_host_updates = true;
  // What those measured times are multiplied by: more ranks on a machine than its cores run each rank's host work
  // that much slower (ranks x threads / cores, at least 1). 1 on a GPU.
  double host_contention = 1;
  int warmup_steps = 2, steps = 3;
  // As the trainer: on the overlapped schedule, the next step's first units are gathered in the middle of the
  // update (FsdpEngine::gather_ahead). False: after it, at the next forward (for comparison).
  bool gather_ahead = true;
  // Applied to the engine before the first step: explicit prefetch schedules (FsdpEngine::set_backward_prefetch),
  // as a user's script sets them. None: the engine's defaults.
  std::function<void(fsdp::FsdpEngine&)> engine_setup;
};

// The compute stream's idle time in a step, and what it waited for: a collective ("layers.3 all_gather shard"),
// a copy, a kernel on another stream ("model sum_squares ..." after the collective it followed), or the host
// ("host").
struct IdleCause {
  std::string what;
  double seconds = 0;
  bool communication = false;  // a collective or a copy
  bool copy = false;           // a host-device copy: counted in Prediction::exposed_copy_s, else in exposed_comm_s
};

// One kind of work on the compute stream (the CPU backend: the host's ops), per step: "matmul", "adamw", "copy".
// Over every kind, the seconds add up to Prediction::compute_busy_s.
struct WorkTotal {
  std::string work;  // the first word of its tasks' work (timing::Task::work)
  double calls = 0;  // per step
  double seconds = 0;
};

struct Prediction {
  MeshLayout layout;
  int64_t micro_batch = 0, seq = 0;
  int accumulation = 1;
  double step_s = 0;                       // one steady step, end to end
  double tokens_per_s_per_rank = 0;        // micro_batch * seq * accumulation / step_s
  double flops_per_token = 0;              // metrics.hpp's (6 (params - input embedding) + 12 L H S)
  double spec_peak_flops = 0;              // the device's datasheet dense bf16 peak; 0: none known (no MFU)
  double mfu = 0;                          // against spec_peak_flops; above 1 when the op costs beat the peak
  double compute_busy_s = 0;               // compute-stream work (the CPU backend: the host's ops)
  double comm_busy_s = 0;                  // collectives' time on their streams (or the host), overlapped or not
  double exposed_comm_s = 0;               // compute idle waiting on collectives
  double copy_busy_s = 0;                  // host<->device copies' time on their streams, overlapped or not
  double exposed_copy_s = 0;               // compute idle waiting on those copies
  double host_idle_s = 0;                  // compute idle waiting on the host
  std::vector<IdleCause> idle;             // by cause, largest first
  std::vector<WorkTotal> compute_by_work;  // compute_busy_s by kind of work, largest first
  size_t peak_device_bytes = 0;            // the engine's, model's and optimizer's device buffers at their peak
  std::vector<timing::Task> tasks;         // the last step's, for a trace
  std::string links_described;             // each axis's links in words
};

// Throws ConfigError when the config does not fit the mesh (as `train` would on that many ranks).
Prediction predict_step(const TrainConfig& config, const PredictSetup& setup);

}  // namespace shardtrain::train
