// A timing device: a GPU that computes nothing and keeps time. While one is installed (TimingScope), the
// runtime's stream, event, copy and buffer calls (device.hpp) act on it instead of CUDA: every stream is a clock,
// work queued on a stream starts once the stream's earlier work is done and the host has issued it, events carry
// times, waits move clocks, and device buffers are address ranges that hold no memory (their bytes still count in
// device_memory_stats, so the peak is the engine's own); so are pinned host buffers (counted nowhere). The timing ops (ops/timing_ops.hpp) and the simulated
// communicators (comm/sim_communicator.hpp) queue their work here, so that the FSDP engine, run unchanged against
// them, lays out its own schedule in time: `shardtrain predict` (docs/predict.md).
//
// It is installed process-wide, not passed along, because the seam it replaces is process-wide too: CudaStream,
// CudaEvent and copy_async are called from every layer with no context object, as the CUDA runtime is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain::timing {

enum class WorkKind { Compute, Comm, Copy, Host };
const char* work_kind_name(WorkKind k);

// What the host pays to issue work, and how fast copies and plain memory-bound kernels go.
struct HostCosts {
  double launch_s = 4e-6;              // one kernel launch (the host's side, with the op's own host code)
  double comm_launch_s = 8e-6;         // one collective call
  double sync_s = 10e-6;               // a stream or event synchronization, once the work is done
  double h2d_bytes_per_s = 25e9;       // pinned host -> device (PCIe 5 x16 in practice)
  double d2h_bytes_per_s = 25e9;       // device -> pinned host
  double memory_bytes_per_s = 3.0e12;  // device memory, bytes read + written (copies, the optimizer's kernels)
  double kernel_overhead_s = 3e-6;     // the least a kernel takes on the device
  // Host memory, bytes read + written by the host's own loops over offloaded shards (AdamW, the gradient norm),
  // stated, not measured: a DGX H100's two sockets of DDR5 (about 600 GB/s) shared by its 8 ranks, less what one
  // rank's loop reaches. The CPU backend's prediction takes its profile's measured update rate instead.
  double host_memory_bytes_per_s = 50e9;
};

// One task on a stream's timeline.
struct Task {
  int stream = 0;  // 0 the null stream (where the ops of the compute context run), then in creation order
  WorkKind kind = WorkKind::Compute;
  double issued = 0, start = 0, end = 0;
  std::string label;  // the context (the unit: "model.layers.3") and the work: "model.layers.3 matmul 4096x1152x768"
  std::string work;   // the work alone: "matmul 4096x1152x768"
};

// Time the compute stream (the null stream) stood idle before a task, and why: waiting for an event recorded
// after `cause` (the label of the last task on the recorded stream: a collective's), or for the host. When that
// task ran back to back after a collective or copy on its stream (a reduction's sum of squares after the
// all-reduce it follows), the idle time until that collective ended is the collective's, and only the rest the
// task's own.
struct ComputeIdle {
  double waiting_s = 0;            // on events
  double host_s = 0;               // on the host issuing its next task
  WorkKind kind = WorkKind::Host;  // the cause's: a collective (Comm), a copy, a kernel on another stream, or Host
};

class TimingDevice {
 public:
  explicit TimingDevice(HostCosts costs = {});
  const HostCosts& costs() const { return costs_; }
  // A memory-bound kernel moving `bytes` (read + written) on the device.
  double memory_bound_seconds(double bytes) const { return costs_.kernel_overhead_s + bytes / costs_.memory_bytes_per_s; }

  // Streams and events (handles no CUDA call ever sees).
  void* create_stream();
  void destroy_stream(void* handle);
  void* create_event();
  void destroy_event(void* handle);
  void record_event(void* event, StreamRef stream);
  void wait_event(void* event, StreamRef waiter);
  void synchronize_event(void* event);  // the host waits
  void synchronize_stream(StreamRef stream);
  void synchronize_all();

  // Work of `seconds` issued by the host now on `stream`; the host pays `issue_s` first. Labels name what it is
  // ("matmul 4096x14336x4096", "all-gather shard layers.3"). With a resource (>= 0: a link, as the simulated
  // communicators number them), the work also needs that resource to itself: it starts at the earliest time the
  // stream is ready and the resource has a gap long enough (collectives on two streams over one NIC share it).
  void enqueue(StreamRef stream, WorkKind kind, double seconds, double issue_s, std::string_view label, int resource = -1);
  // The host busy for `seconds` (host collectives, host arithmetic, the CPU backend's ops), recorded as `kind`
  // (Compute for an op of the CPU backend, Comm for a blocking collective) on stream -1.
  void host_work(double seconds, std::string_view label, WorkKind kind = WorkKind::Host);
  void copy(void* dst, const void* src, size_t bytes, StreamRef stream);

  // Device memory: addresses from a range no allocation of the process can return (never dereferenced).
  void* allocate(size_t bytes);
  void release(void* p, size_t bytes);
  static bool is_device_address(const void* p);
  // Pinned host memory (PinnedBuffer, CPU offload's shards): addresses from another such range, holding nothing, so
  // that a 70B model's offloaded state costs this machine nothing. Host code that would compute on them is priced
  // instead (optim::AdamW, optim::GradNorm); host functions on a stream (host_callback) do not run.
  void* allocate_host(size_t bytes);
  static bool is_host_address(const void* p);
  static bool is_handle(const void* p);  // a stream or event made by a timing device

  double host_now() const { return host_; }
  double stream_now(StreamRef stream) const;

  // The prefix under which the next tasks are labelled ("layers.3"), set by whoever knows (the FSDP schedule).
  void set_context(std::string context) { context_ = std::move(context); }
  const std::string& context() const { return context_; }

  // Everything recorded since the last clear_record(): the tasks, and the compute stream's idle time per cause.
  const std::vector<Task>& tasks() const { return tasks_; }
  const std::map<std::string, ComputeIdle>& compute_idle() const { return idle_; }
  void clear_record();

 private:
  struct Blocker {
    std::string label;  // empty: none
    double end = 0;
    WorkKind kind = WorkKind::Comm;
  };
  struct Stream {
    double end = 0;          // when its last task ends
    double wait_floor = 0;   // its next task starts no earlier (events waited on)
    std::string wait_cause;  // the label behind wait_floor
    WorkKind wait_cause_kind = WorkKind::Compute;
    std::string last_label;  // of its last task
    WorkKind last_kind = WorkKind::Compute;
    Blocker blocker;       // the collective or copy its latest tasks followed back to back
    Blocker wait_blocker;  // the one behind wait_floor
  };
  struct Event {
    double time = 0;
    std::string cause;
    WorkKind cause_kind = WorkKind::Compute;
    Blocker blocker;
    bool recorded = false;
  };
  Stream& stream(StreamRef s);
  const Stream& stream(StreamRef s) const;
  int stream_index(StreamRef s) const;
  Event& event(void* handle);
  void add_wait(const std::string& cause, WorkKind kind, double seconds);  // to the compute stream's idle time

  HostCosts costs_;
  double host_ = 0;
  std::map<uintptr_t, Stream> streams_;  // key 0: the null stream
  std::map<uintptr_t, Event> events_;
  std::map<int, std::map<double, double>> busy_;  // per resource: start -> end of the work holding it
  uintptr_t next_handle_ = 1;
  uintptr_t next_address_ = 0;
  uintptr_t next_host_address_ = 0;
  std::string context_;
  std::vector<Task> tasks_;
  std::map<std::string, ComputeIdle> idle_;
};

// The installed timing device, or null (the ordinary runtime).
TimingDevice* current();

// Installs `device` for its lifetime (one at a time; nothing made on a timing device may outlive the scope).
class TimingScope {
 public:
  explicit TimingScope(TimingDevice& device);
  ~TimingScope();
  TimingScope(const TimingScope&) = delete;
  TimingScope& operator=(const TimingScope&) = delete;
};

}  // namespace shardtrain::timing
