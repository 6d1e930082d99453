// AdamW on flat fp32 shards (PyTorch's torch.optim.AdamW update, decoupled weight decay), and the
// global L2 gradient norm with clipping. Host shards (CPU backend, CPU offload) use all cores; CUDA shards
// one fused kernel (kernels/adamw.cu). Padding elements of a shard are never touched.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::timing {
class TimingDevice;
}

namespace shardtrain::optim {

namespace detail {
struct StepScalars;  // adamw_internal.hpp
}

// Which parameters weight decay applies to. The seed decays everything; transformers' Trainer exempts the
// RMSNorm weights (exempt_norms: its get_decay_parameter_names on a Llama); another common choice exempts the
// embedding (and a tied lm_head) too.
enum class DecayScope { All, ExemptNorms, ExemptNormsAndEmbeddings };
DecayScope parse_decay_scope(std::string_view text);  // "all" | "exempt_norms" | "exempt_norms_and_embeddings"
const char* decay_scope_name(DecayScope scope);

struct AdamWConfig {
  double lr = 1e-3;  // the peak rate; the schedule scales it per step
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;
  DecayScope decay = DecayScope::All;
  void validate() const;  // throws ConfigError naming optim.<key>
};

// One contiguous run of a shard with its weight-decay factor.
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = true;
};

// Which moment of AdamW: exp_avg (m) or exp_avg_sq (v).
enum class OptimState { ExpAvg, ExpAvgSq };

class AdamW final : public fsdp::PendingShardWrites {
 public:
  // exp_avg and exp_avg_sq live where the shards live: device memory for CUDA shards (the update is then
  // one fused kernel launch per step), host memory otherwise (one parallel region per step). All shards
  // must be of one kind.
  AdamW(const fsdp::FsdpEngine& engine, const AdamWConfig& config, MemoryLedger* ledger);
  // The same over shard views built elsewhere (tests, tools); `spec` is the model the ranges' parameter
  // indices refer to (it decides which ranges take weight decay). The views' buffers must outlive this.
  AdamW(const std::vector<fsdp::ShardView>& shards, const model::ModelSpec& spec, const AdamWConfig& config,
        MemoryLedger* ledger);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate `lr` of every shard; grads are multiplied by grad_scale first
  // (clipping). Increments the step count used by bias correction. `shards` must be the views the
  // optimizer was built for; their gradients may have moved since (the engine's grads in activation memory). Device shards: asynchronous on `stream`, no synchronization; host shards
  // ignore it.
  void step(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale, StreamRef stream = {});
  // The same update with the same bits, in two parts: the shards listed in `first` (indices into `shards`), then
  // `between()`, then every other shard. On a device stream, what `between` queues there runs after the first
  // shards' update and before the others' (the engine gathers the next step's first units then: the update of
  // the others hides their all-gathers, FsdpEngine::gather_ahead); on the host, in that order too.
  void step_split(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale, StreamRef stream,
                  const std::vector<int>& first, const std::function<void()>& between);
  // Host shards: the same update with the same bits, run on a worker thread of the optimizer's shard by
  // shard in shard order (an engine's units are in forward order), and the call returns at once. Until
  // wait_shard(i) (or wait()) returns, shard i's parameters, gradients and states belong to that thread:
  // CPU offload gives the optimizer to the engine (set_pending_writes), whose next forward waits unit by
  // unit before each upload, so the update of the later units overlaps the forward of the earlier ones.
  // step, read_state, write_state and set_steps wait for the whole update first.
  void step_async(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale);
  void wait_shard(int shard) const override;
  void wait() const;
  // Tests (SHARDTRAIN_FAULT=slow_update:MS): step_async's thread sleeps this long before each shard.
  void set_async_delay(std::chrono::milliseconds delay) { async_delay_ = delay; }
  int64_t steps() const { return steps_; }
  // Host shards: the OpenMP threads each update runs on, fixed at construction to the constructing thread's
  // default (Runtime sets it to host_threads()), since step_async's worker is a thread of its own whose
  // default would be the one OpenMP read off the process's affinity at start (one core under mpirun's
  // default binding). last_update_threads(): what the last update with more than one chunk of work had.
  int threads() const { return threads_; }
  int last_update_threads() const { return last_update_threads_.load(); }
  // step_async's timing, for the step metrics of CPU offload: the wall time of the last update that finished
  // (0 when none finished since the last take), and how long callers were blocked in wait_shard / wait since
  // the last take: the part of the update the next forward could not hide. Resets both.
  struct AsyncTimes {
    double update_s = 0;
    double waited_s = 0;
  };
  AsyncTimes take_async_times() const;
  void set_steps(int64_t steps) {
    wait();
    steps_ = steps;
  }

  // The states of shard i (numel(i) elements, padding included), for checkpoints: copied to or from host
  // memory wherever they live. Device copies wait for all queued device work and are synchronous.
  void read_state(size_t i, OptimState which, std::span<float> host_out) const;
  void write_state(size_t i, OptimState which, std::span<const float> host_in);
  size_t num_shards() const { return states_.size(); }
  int64_t numel(size_t i) const { return states_.at(i).numel; }
  DeviceKind device() const { return device_; }
  const std::vector<DecayRange>& ranges(size_t i) const { return states_[i].ranges; }
  const AdamWConfig& config() const { return config_; }

 private:
  struct State {
    ops::HostBuffer host_exp_avg, host_exp_avg_sq;   // host shards
    DeviceBuffer device_exp_avg, device_exp_avg_sq;  // CUDA shards
    PinnedBuffer timed_exp_avg, timed_exp_avg_sq;    // host shards on a timing device: no memory (priced_host_)
    std::vector<DecayRange> ranges;                  // the parameter parts of the shard (padding excluded)
    int64_t numel = 0;
    float* param = nullptr;       // the shard's buffers at construction, checked at every step
    const float* grad = nullptr;  // where the gradient was at the last step (it may move: bind_shards)
    float* exp_avg = nullptr;     // whichever of the two buffers holds it
    float* exp_avg_sq = nullptr;
    float* state(OptimState which) const { return which == OptimState::ExpAvg ? exp_avg : exp_avg_sq; }
  };
  // One contiguous run of a parameter range: what the host loop and the device chunk table are made of.
  struct Segment {
    float* param = nullptr;
    const float* grad = nullptr;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    int64_t n = 0;
    bool decay = true;
  };
  void init(const std::vector<fsdp::ShardView>& shards, const model::ModelSpec& spec);
  // Throws unless `shards` are the ones the optimizer was built for; follows their gradients where they moved.
  void bind_shards(const std::vector<fsdp::ShardView>& shards);
  void build_segments();
  // Shard i's state, after checking that a copy of `elements` floats fits it exactly (what: the caller).
  const State& state_for_copy(size_t i, size_t elements, const char* what) const;
  // Segments [first, end) (segments_ indices) at one step's scalars, split evenly over the threads.
  void update_segments(const detail::StepScalars& sc, size_t first, size_t end) const;
  struct Worker;  // step_async's thread (adamw.cpp)
  // CUDA-only parts (adamw_cuda.cpp; adamw_no_cuda.cpp throws a Device error in builds without CUDA).
  void allocate_device_state(State& s);
  void upload_chunk_table();
  // Shards [first, end): their chunks of the table (device), segments (host) or bytes (timing device).
  void update_shards(size_t first, size_t end, double lr, double grad_scale, StreamRef stream);
  void step_device(double lr, double grad_scale, StreamRef stream, int64_t first_chunk, int64_t chunks);
  // On a timing device (runtime/timing_device.hpp): states that hold no memory, and the update as time.
  void allocate_timed_state(State& s);
  void step_timed(timing::TimingDevice& t, StreamRef stream, int64_t elements) const;
  // Host shards that hold no memory (a timing device's pinned buffers: CPU offload in `shardtrain predict`): the
  // host loop is not run but priced, as host work of 28 bytes an element at the host's memory rate.
  bool priced_host_ = false;

  AdamWConfig config_;
  DeviceKind device_ = DeviceKind::Cpu;
  std::vector<State> states_;
  std::vector<Segment> segments_;         // every range of every shard, in order
  std::vector<int64_t> segment_offsets_;  // prefix sums of segments_[k].n (size + 1)
  std::vector<size_t> shard_segments_;    // shard i's segments: [shard_segments_[i], shard_segments_[i + 1])
  std::unique_ptr<Worker> worker_;        // started by the first step_async
  std::chrono::milliseconds async_delay_{0};
  DeviceBuffer chunk_table_;             // CUDA: segments_ cut into kernels' chunks (kernels/adamw.cuh)
  std::vector<int64_t> segment_chunks_;  // CUDA: segment k's chunks start at segment_chunks_[k] (size + 1)
  int64_t steps_ = 0;
  int threads_ = 1;
  mutable std::atomic<int> last_update_threads_{0};
  MemoryLedger* ledger_;
  int64_t state_bytes_ = 0;
};

// The gradient norm in two halves, so that a training step reads it from the device in the same
// synchronization as its loss: start() queues the work, sum_of_squares() (or norm()) returns the result.
// CUDA shards: start queues on `stream` the sums of squares (in double, kernels/sum_squares), the all-reduce
// over `shard_axis` when it takes device memory (NCCL), a copy into pinned host memory and an event; the
// result waits for that event (nothing left to wait for once the caller synchronized `stream` since), then
// all-reduces on the host when the axis takes host memory. Host shards: start computes it all. Kept from
// step to step, it allocates once (freeing device memory would synchronize the device).
class GradNorm {
 public:
  // Squares of this rank's shards (padding is zero and adds nothing), summed over `shard_axis` when given
  // (the global norm: replicas hold equal shards) or this rank's alone (null).
  void start(const std::vector<fsdp::ShardView>& shards, Communicator* shard_axis, StreamRef stream = {});
  // A training step's: this rank's part of the squared norm, summed across no axis. From the engine's per-unit
  // device sums where it took them this step (FsdpEngine::device_grad_sq_sums), else from its shards (also when
  // `shards_rewritten`: the host wrote into one since). The caller sums the parts across ranks in the step's one
  // all-reduce over the world (world_part below).
  void start_local(const fsdp::FsdpEngine& engine, bool shards_rewritten = false);
  double sum_of_squares();  // of the last start(); throws InternalError without one
  double norm();            // its square root

 private:
  // From `count` per-unit sums of squares already in device memory (FsdpEngine::device_grad_sq_sums, complete on
  // `stream`): copied down on `stream`, added on the host in order.
  void start_from_unit_sums(const double* device_sums, size_t count, StreamRef stream = {});
  void timed_sq_sum_start(const std::vector<fsdp::ShardView>& shards, Communicator* device_axis, StreamRef stream);
  bool started_ = false;
  double value_ = 0;                   // host shards: the result; CUDA: read from host_ once copied_ passed
  Communicator* host_axis_ = nullptr;  // CUDA shards on a host-memory axis: reduced in sum_of_squares()
  bool on_device_ = false;
  size_t unit_sums_ = 0;  // start_from_unit_sums: how many doubles host_ receives
  DeviceBuffer device_;   // the accumulated double, then the sum-of-squares workspace
  PinnedBuffer host_;
  CudaEvent copied_;
};

// What a rank adds into an all-reduce over the whole world for the step's squared gradient norm: its local sum
// on the first replica, zero on the others, which hold the same shards (and adding zeros is exact), so the world's
// sum is the sum over one replica's shard axis.
inline double world_part(double local_sq_sum, const Communicator& replicate_axis) {
  return replicate_axis.rank() == 0 ? local_sq_sum : 0.0;
}

// The sum of squares of host shards' gradients in double, in an order fixed by the shards alone (blocks of
// 16384 elements in eight lanes each, then the blocks in order): the same bits at any thread count.
double host_sum_of_squares(const std::vector<fsdp::ShardView>& shards);

// Both halves at once (one host synchronization for CUDA shards).
double grad_sq_sum_local(const std::vector<fsdp::ShardView>& shards, StreamRef stream = {}, GradNorm* reuse = nullptr);
double grad_norm_global(const std::vector<fsdp::ShardView>& shards, Communicator& shard_axis, StreamRef stream = {},
                        GradNorm* reuse = nullptr);
// The factor that brings the norm down to max_norm (1 when already below, or when max_norm <= 0).
double clip_coefficient(double grad_norm, double max_norm);

// The nan_grad fault: a quiet NaN into grad[0] of the first shard with elements (a device copy for CUDA
// shards, after all queued device work), so the step's norm is not finite and the step is skipped.
void poison_first_gradient(const std::vector<fsdp::ShardView>& shards);

}  // namespace shardtrain::optim
