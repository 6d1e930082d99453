// Device selection, streams and memory on the CUDA backend. Any failure to reach a driver or a
// device means "no GPU here": the CPU backend takes over with one notice.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain {

bool cuda_built() { return true; }

namespace {

struct DeviceCount {
  int count = 0;
  std::string reason;  // why count is 0
};

// Asked once per process: the answer cannot change while it runs (CUDA_VISIBLE_DEVICES is read at init).
const DeviceCount& device_count() {
  static const DeviceCount c = [] {
    DeviceCount r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    // CUDA_VISIBLE_DEVICES hides every GPU when empty or when its first entry names none ("-1", an index past the
    // machine's, a UUID no GPU has): said with the value, which the runtime's own error does not name.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const std::string where =
        visible ? fmt::format(" (CUDA_VISIBLE_DEVICES=\"{}\": does it name this machine's GPUs?)", visible) : std::string();
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      r.count = 0;
      r.reason = fmt::format("cudaGetDeviceCount: {} ({}){}", cudaGetErrorName(e), cudaGetErrorString(e),
                             e == cudaErrorNoDevice ? where : std::string());
    } else if (r.count == 0) {
      r.reason = "the driver lists no device" + where;
    }
    return r;
  }();
  return c;
}

}  // namespace

int cuda_device_count() { return device_count().count; }
std::string cuda_unavailable_reason() { return device_count().reason; }

namespace {

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L and CUDA_VISIBLE_DEVICES write it.
std::string uuid_text(const cudaUUID_t& u) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", static_cast<unsigned char>(u.bytes[i]));
  }
  return out;
}

}  // namespace

Device select_device(const Topology& topo, DevicePreference pref, MPI_Comm machine, const StartupStage& stage) {
  Device d;
  if (pref == DevicePreference::Cpu) return d;  // every rank: the preference is the job's
  const auto exchange = [&] {
    if (stage) stage("the exchange of GPU identities among this machine's ranks", true);
    find_ranks_sharing(d, topo.world_rank, machine);
  };
  if (stage) stage("CUDA's start on this rank (its GPUs, the one it takes, that GPU's identity)", false);
  const int count = cuda_device_count();
  if (count == 0) {
    if (pref == DevicePreference::Cuda) {
      throw Error(ExitCode::Device, fmt::format("--device cuda: no CUDA device is visible: {}", cuda_unavailable_reason()));
    }
    const std::string present =
        gpus_present_but_unreachable("/proc/driver/nvidia/gpus", std::getenv("CUDA_VISIBLE_DEVICES"));
    if (!present.empty()) {
      throw Error(ExitCode::Device,
                  fmt::format("--device auto: {}, but CUDA sees none: {}. Fix the driver or the CUDA runtime, or pass "
                              "--device cpu to train on the CPU backend",
                              present, cuda_unavailable_reason()));
    }
    if (topo.world_rank == 0) log::info("no CUDA device found ({}): using the CPU backend", cuda_unavailable_reason());
    exchange();  // the machine's other ranks may have GPUs: the exchange is collective
    return d;
  }
  // The rank's place on the machine, not in its (maybe simulated) node: ranks of two simulated nodes on one
  // machine see the same GPUs, and each must take a different one while there are enough.
  int machine_rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(machine, &machine_rank));
  d.kind = DeviceKind::Cuda;
  d.index = machine_rank % count;
  ST_CHECK_CUDA(cudaSetDevice(d.index));
  cudaDeviceProp prop{};
  ST_CHECK_CUDA(cudaGetDeviceProperties(&prop, d.index));
  d.name = prop.name;
  d.memory_bytes = prop.totalGlobalMem;
  d.uuid = uuid_text(prop.uuid);
  char bus[32] = {};
  ST_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, d.index));
  d.pci_bus_id = bus;
  for (char& c : d.pci_bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  exchange();
  return d;
}

namespace {
// Streams and events of a timing device (timing_device.hpp) go back to it, never to CUDA.
void destroy_stream(void* handle) {
  if (!handle) return;
  if (timing::TimingDevice::is_handle(handle)) {
    if (timing::TimingDevice* t = timing::current()) t->destroy_stream(handle);
  } else {
    cudaStreamDestroy(static_cast<cudaStream_t>(handle));
  }
}
void destroy_event(void* handle) {
  if (!handle) return;
  if (timing::TimingDevice::is_handle(handle)) {
    if (timing::TimingDevice* t = timing::current()) t->destroy_event(handle);
  } else {
    cudaEventDestroy(static_cast<cudaEvent_t>(handle));
  }
}
}  // namespace

CudaStream::CudaStream(StreamPriority priority) {
  if (timing::TimingDevice* t = timing::current()) {
    handle_ = t->create_stream();
    return;
  }
  cudaStream_t s = nullptr;
  if (priority == StreamPriority::High) {
    int least = 0, greatest = 0;
    ST_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ST_CHECK_CUDA(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  } else {
    ST_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  handle_ = s;
}
CudaStream::~CudaStream() { destroy_stream(handle_); }
CudaStream::CudaStream(CudaStream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    destroy_stream(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}
void CudaStream::synchronize() const { stream_synchronize(ref()); }

void stream_synchronize(StreamRef s) {
  if (timing::TimingDevice* t = timing::current()) return t->synchronize_stream(s);
  if (s.handle || cuda_device_count() > 0) ST_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
}

CudaEvent::~CudaEvent() { destroy_event(handle_); }
CudaEvent::CudaEvent(CudaEvent&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), recorded_(std::exchange(o.recorded_, false)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    destroy_event(handle_);
    handle_ = std::exchange(o.handle_, nullptr);
    recorded_ = std::exchange(o.recorded_, false);
  }
  return *this;
}
void CudaEvent::record(StreamRef stream) {
  if (timing::TimingDevice* t = timing::current()) {
    if (!handle_) handle_ = t->create_event();
    t->record_event(handle_, stream);
    recorded_ = true;
    return;
  }
  if (cuda_device_count() == 0) return;
  if (!handle_) {
    cudaEvent_t e = nullptr;
    ST_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    handle_ = e;
  }
  ST_CHECK_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle)));
  recorded_ = true;
}
void CudaEvent::wait(StreamRef waiter) const {
  if (!recorded_) return;
  if (timing::TimingDevice::is_handle(handle_)) return timing::current()->wait_event(handle_, waiter);
  ST_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter.handle), static_cast<cudaEvent_t>(handle_), 0));
}
void CudaEvent::synchronize() const {
  if (recorded_ && timing::TimingDevice::is_handle(handle_)) return timing::current()->synchronize_event(handle_);
  if (recorded_) ST_CHECK_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (timing::TimingDevice* t = timing::current()) {  // holds no memory, as a device buffer there
    data_ = t->allocate_host(bytes);
    return;
  }
  if (cuda_device_count() > 0 && cudaMallocHost(&data_, bytes) == cudaSuccess) {
    pinned_ = true;
    return;
  }
  cudaGetLastError();
  data_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!data_) throw Error(ExitCode::Device, fmt::format("host allocation of {} bytes failed", bytes));
}
void PinnedBuffer::release() {
  if (data_) {
    if (pinned_) cudaFreeHost(data_);
    else if (!timing::TimingDevice::is_host_address(data_)) std::free(data_);
  }
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}
PinnedBuffer::~PinnedBuffer() { release(); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), pinned_(std::exchange(o.pinned_, false)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = std::exchange(o.pinned_, false);
  }
  return *this;
}

namespace detail {
void note_device_alloc(size_t bytes);
void note_device_free(size_t bytes);
}  // namespace detail

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (timing::TimingDevice* t = timing::current()) {
    data_ = t->allocate(bytes);
    detail::note_device_alloc(bytes);
    return;
  }
  const cudaError_t e = cudaMalloc(&data_, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    const DeviceMemoryStats s = device_memory_stats();
    throw Error(
        ExitCode::Device,
        fmt::format("out of GPU memory: {:.1f} MiB requested, {:.1f} MiB free of {:.1f} MiB; shardtrain holds {:.1f} MiB "
                    "(`shardtrain plan` estimates a config's memory; lower data.micro_batch_size or enable "
                    "fsdp.activation_checkpointing)",
                    bytes / 1048576.0, free_bytes / 1048576.0, total / 1048576.0, s.in_use / 1048576.0));
  }
  ST_CHECK_CUDA(e);
  detail::note_device_alloc(bytes);
}
void DeviceBuffer::release() {
  if (data_) {
    if (!timing::TimingDevice::is_device_address(data_)) cudaFree(data_);
    detail::note_device_free(bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

void copy_async(void* dst, const void* src, size_t bytes, StreamRef stream) {
  if (bytes == 0) return;
  if (timing::TimingDevice* t = timing::current()) return t->copy(dst, src, bytes, stream);
  if (cuda_device_count() == 0) {  // the CPU backend of a CUDA build: every buffer is host memory
    std::memcpy(dst, src, bytes);
    return;
  }
  ST_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream.handle)));
}

void host_callback(StreamRef stream, std::function<void()> fn) {
  // On a timing device a host function would compute on pinned buffers that hold nothing: it does not run.
  if (timing::current()) return;
  if (cuda_device_count() == 0) {
    fn();
    return;
  }
  auto* owned = new std::function<void()>(std::move(fn));
  const cudaError_t e = cudaLaunchHostFunc(
      static_cast<cudaStream_t>(stream.handle),
      [](void* p) {
        std::unique_ptr<std::function<void()>> f(static_cast<std::function<void()>*>(p));
        (*f)();
      },
      owned);
  if (e != cudaSuccess) delete owned;
  ST_CHECK_CUDA(e);
}

}  // namespace shardtrain
