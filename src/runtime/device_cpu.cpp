// Built without CUDA: the CPU is the only device, and device memory cannot be allocated.
#include <cstdlib>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(ExitCode::Device, fmt::format("{}: shardtrain was built without CUDA (SHARDTRAIN_CUDA=OFF)", what));
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_unavailable_reason() { return "shardtrain was built without CUDA"; }

Device select_device(const Topology& topo, DevicePreference pref, MPI_Comm) {
  if (pref == DevicePreference::Cuda) no_cuda("--device cuda");
  if (pref == DevicePreference::Auto && topo.world_rank == 0) log::info("built without CUDA: using the CPU backend");
  return Device{};
}

CudaStream::CudaStream(StreamPriority) { no_cuda("CUDA stream"); }
CudaStream::~CudaStream() = default;
CudaStream::CudaStream(CudaStream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  handle_ = std::exchange(o.handle_, nullptr);
  return *this;
}
void CudaStream::synchronize() const {}
void stream_synchronize(StreamRef) {}

CudaEvent::~CudaEvent() = default;
CudaEvent::CudaEvent(CudaEvent&& o) noexcept
    : handle_(std::exchange(o.handle_, nullptr)), recorded_(std::exchange(o.recorded_, false)) {}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  handle_ = std::exchange(o.handle_, nullptr);
  recorded_ = std::exchange(o.recorded_, false);
  return *this;
}
void CudaEvent::record(StreamRef) {}
void CudaEvent::wait(StreamRef) const {}
void CudaEvent::synchronize() const {}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  data_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!data_) throw Error(ExitCode::Device, fmt::format("host allocation of {} bytes failed", bytes));
}
void PinnedBuffer::release() {
  std::free(data_);
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
  if (bytes) no_cuda("device allocation");
}
void DeviceBuffer::release() {}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  data_ = std::exchange(o.data_, nullptr);
  bytes_ = std::exchange(o.bytes_, 0);
  return *this;
}

void copy_async(void* dst, const void* src, size_t bytes, StreamRef) {
  if (bytes) std::memcpy(dst, src, bytes);  // host memory only in this build
}

void host_callback(StreamRef, std::function<void()> fn) { fn(); }

}  // namespace shardtrain
