// Device selection (by the rank's place on its machine when GPUs exist, the CPU backend otherwise; which ranks
// share a physical GPU, by its identity), stream handles and move-only memory owners. The CUDA half lives in
// device_cuda.cpp; without CUDA, device_cpu.cpp.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/runtime/topology.hpp"

namespace shardtrain {

enum class DeviceKind { Cpu, Cuda };
enum class DevicePreference { Auto, Cpu, Cuda };

DevicePreference parse_device_preference(std::string_view s);  // auto|cpu|cuda, throws UsageError

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = -1;            // CUDA ordinal among the devices this rank sees, -1 on the CPU
  std::string name = "cpu";  // e.g. "NVIDIA H100 80GB HBM3"
  size_t memory_bytes = 0;   // total device memory, 0 on the CPU
  // The physical GPU, whatever ordinal CUDA_VISIBLE_DEVICES gave it here: its UUID as nvidia-smi prints it
  // ("GPU-8f6c1a2b-..."), and its PCI bus id ("0000:18:00.0"). Empty on the CPU.
  std::string uuid;
  std::string pci_bus_id;
  int ranks_sharing = 1;           // ranks of this machine on this same physical GPU (this one included)
  std::vector<int> sharing_ranks;  // their world ranks, ascending; empty on the CPU
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  std::string describe() const;  // "cpu" or "cuda:0 (NVIDIA H100 ...)"
};

// One rank's seat: its world rank and the UUID of its GPU ("" on the CPU). Gathered among a machine's ranks.
struct GpuSeat {
  int world_rank = 0;
  std::string uuid;
};
// The world ranks among `seats` whose GPU is `uuid`, ascending (none for "").
std::vector<int> ranks_on_gpu(const std::vector<GpuSeat>& seats, const std::string& uuid);
// "ranks 0 and 1", "ranks 0, 1 and 2", "rank 3": world ranks in words.
std::string describe_ranks(const std::vector<int>& ranks);
// Collective over `machine`: every rank's seat (world_rank, d.uuid) to every rank of the machine, then
// d.sharing_ranks and d.ranks_sharing from them (select_device's last step).
void find_ranks_sharing(Device& d, int world_rank, MPI_Comm machine);

bool cuda_built();        // compiled with the CUDA backend
int cuda_device_count();  // 0 when not built with CUDA, no driver, or no device; never throws
// Why cuda_device_count() is 0, in words ("" when it is not): the CUDA runtime's own error (no driver, a
// driver too old for the runtime, ...), an empty device list, or a build without CUDA. Never throws.
std::string cuda_unavailable_reason();
// Whether `--device auto` may fall back to the CPU backend when CUDA sees no device. Not where the NVIDIA
// driver lists GPUs (entries in gpus_dir, /proc/driver/nvidia/gpus) that CUDA_VISIBLE_DEVICES does not hide
// (unset, or naming devices): that is a broken driver or runtime on a GPU machine, and falling back would
// train on the CPU a thousand times slower without a word. Returns why not (naming the evidence), or "".
std::string gpus_present_but_unreachable(const std::string& gpus_dir, const char* cuda_visible_devices);

// Collective over `machine`, the ranks of this machine (machine_comm: MPI_COMM_TYPE_SHARED, whatever
// --ranks-per-node simulates). When GPUs are visible, picks the one at this rank's place on the machine
// (machine rank % visible count: each rank sees every GPU, as with srun --gpus-per-node, and takes its own;
// or each rank sees one, as with srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES set per rank, and takes it),
// makes it current, and reads its identity; then the machine's ranks exchange identities, so ranks_sharing
// counts the ranks on the same physical GPU, however each one numbers it. The CPU otherwise.
// Auto on a machine without GPUs logs one notice on rank 0 (and throws a Device error where the driver lists
// GPUs CUDA cannot reach: gpus_present_but_unreachable). Cuda without GPUs throws a Device error.
// `stage`, where given, is told when each part begins (CUDA's start on this rank, then the exchange among the
// machine's ranks), for the start-up's deadline (main.cpp): a GPU that stopped answering hangs the first part.
using StartupStage = std::function<void(std::string what, bool waits_on_others)>;
Device select_device(const Topology& topo, DevicePreference pref, MPI_Comm machine, const StartupStage& stage = {});

// A non-owning stream handle (cudaStream_t on the CUDA backend, null = the default/host stream).
struct StreamRef {
  void* handle = nullptr;
};

// Normal: the default priority. High: the device's greatest, so that a stream's ready work is scheduled
// ahead of compute's (the communication streams, as PyTorch's FSDP makes them: a collective's kernels start
// as soon as they can instead of waiting behind a queue of compute blocks).
enum class StreamPriority { Normal, High };

// Owns a non-blocking CUDA stream.
class CudaStream {
 public:
  explicit CudaStream(
      StreamPriority priority = StreamPriority::Normal);  // throws when CUDA is not built or no device is current
  ~CudaStream();
  CudaStream(CudaStream&& o) noexcept;
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  StreamRef ref() const { return StreamRef{handle_}; }
  void synchronize() const;

 private:
  void* handle_ = nullptr;
};

void stream_synchronize(StreamRef s);  // no-op for the null stream without CUDA

// Orders work between streams without blocking the host: record() marks the point a stream has reached,
// wait() makes another stream's later work start after it. Timing is off (cheapest event). Without CUDA
// or a device every call is a no-op (one stream of host work is already in order). Move-only.
class CudaEvent {
 public:
  CudaEvent() = default;  // the CUDA event is created at the first record()
  ~CudaEvent();
  CudaEvent(CudaEvent&& o) noexcept;
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(StreamRef stream);
  void wait(StreamRef waiter) const;  // nothing to wait for before the first record()
  void synchronize() const;           // the host waits for the work before the last record() (none: returns)
  bool recorded() const { return recorded_; }

 private:
  void* handle_ = nullptr;
  bool recorded_ = false;
};

enum class MemorySpace { Host, Device };

// Page-locked host memory (cudaMallocHost) when CUDA is built and a device exists, aligned
// host memory otherwise. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

// Device memory (cudaMalloc). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Bytes held in DeviceBuffers (every cudaMalloc of shardtrain's own: FSDP buffers, activations, optimizer
// states, op scratch, the cuBLASLt workspace), and the most held at once since the last reset. The CUDA
// context and NCCL's internal buffers are not counted (PyTorch's max_memory_allocated leaves them out too).
struct DeviceMemoryStats {
  size_t in_use = 0;
  size_t peak = 0;
};
DeviceMemoryStats device_memory_stats();
void reset_device_memory_peak();  // peak = in_use

// Asynchronous copies on a stream (host<->device, either direction by pointer kinds).
void copy_async(void* dst, const void* src, size_t bytes, StreamRef stream);

// Host work in stream order (cudaLaunchHostFunc): `fn` runs on a runtime thread once the stream's earlier
// work is done, and the stream's later work waits for it. It must not throw nor call CUDA. Without a
// device it runs before this returns; on a timing device it does not run (its pinned buffers hold nothing).
void host_callback(StreamRef stream, std::function<void()> fn);

}  // namespace shardtrain
