// Built without CUDA: the CPU is the only device, and device memory cannot be allocated.
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(ExitCode::Device, fmt::format("{}: shardtrain was built without CUDA (SHARDTRAIN_CUDA=OFF)", what));
}
// A timing device (timing_device.hpp) stands in for the GPU this build has not: its streams, events and device
// buffers work here as in a CUDA build.
void destroy_timing_handle(void* handle, bool stream) {
  timing::TimingDevice* t = timing::current();
  if (!t || !handle) return;
  if (stream) t->destroy_stream(handle);
  else t->destroy_event(handle);
}
}  // namespace

namespace detail {
void note_device_alloc(size_t bytes);
void note_device_free(size_t bytes);
}  // namespace detail

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "shardtrain was built without CUDA"; }

Device select_device(const Topology& topo, DevicePreference pref, MPI_Comm, const StartupStage&) {
  if (pref == DevicePreference::Cuda) no_cuda("--device cuda");
  if (pref == DevicePreference::Auto && topo.world_rank == 0) log::info("built without CUDA: using the CPU backend");
  return Device{};
}

CudaStream::CudaStream(StreamPriority) {
  timing::TimingDevice* t = timing::current();
  if (!t) no_cuda("CUDA stream");
  handle_ = t->create_stream();
}
CudaStream::~CudaStream() { destroy_timing_handle(handle_, true); }
CudaStream::CudaStream(CudaStream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    destroy_timing_handle(handle_, true);
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}
void CudaStream::synchronize() const { stream_synchronize(ref()); }
void stream_synchronize(StreamRef s) {
  if (timing::TimingDevice* t = timing::current()) t->synchronize_stream(s);
}

CudaEvent::~CudaEvent() { destroy_timing_handle(handle_, false); }
CudaEvent::CudaEvent(CudaEvent&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), recorded_(std::exchange(o.recorded_, false)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    destroy_timing_handle(handle_, false);
    handle_ = std::exchange(o.handle_, nullptr);
    recorded_ = std::exchange(o.recorded_, false);
  }
  return *this;
}
void CudaEvent::record(StreamRef stream) {
  timing::TimingDevice* t = timing::current();
  if (!t) return;
  if (!handle_) handle_ = t->create_event();
  t->record_event(handle_, stream);
  recorded_ = true;
}
void CudaEvent::wait(StreamRef waiter) const {
  if (recorded_ && handle_) timing::current()->wait_event(handle_, waiter);
}
void CudaEvent::synchronize() const {
  if (recorded_ && handle_) timing::current()->synchronize_event(handle_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  if (timing::TimingDevice* t = timing::current()) {  // holds no memory, as a device buffer there
    data_ = t->allocate_host(bytes);
    return;
  }
  data_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!data_) throw Error(ExitCode::Device, fmt::format("host allocation of {} bytes failed", bytes));
}
void PinnedBuffer::release() {
  if (!timing::TimingDevice::is_host_address(data_)) std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}
PinnedBuffer::~PinnedBuffer() { release(); }
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), pinned_(false) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  timing::TimingDevice* t = timing::current();
  if (!t) no_cuda("device allocation");
  data_ = t->allocate(bytes);
  detail::note_device_alloc(bytes);
}
void DeviceBuffer::release() {
  if (data_) detail::note_device_free(bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

void copy_async(void* dst, const void* src, size_t bytes, StreamRef stream) {
  if (timing::TimingDevice* t = timing::current()) return t->copy(dst, src, bytes, stream);
  if (bytes) std::memcpy(dst, src, bytes);  // host memory only in this build
}

// On a timing device a host function would compute on pinned buffers that hold nothing: it does not run.
void host_callback(StreamRef, std::function<void()> fn) {
  if (!timing::current()) fn();
}

}  // namespace shardtrain
