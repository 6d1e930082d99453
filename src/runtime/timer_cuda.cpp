// DeviceTimer in a CUDA build: a pair of CUDA events recorded on the stream for DeviceKind::Cuda, steady_clock
// for the CPU backend (which a CUDA build also runs, on machines without a GPU).
#include <cuda_runtime_api.h>

#include <utility>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain {

namespace {
cudaStream_t cuda_stream(StreamRef s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t cuda_event(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

DeviceTimer::DeviceTimer(DeviceKind kind, StreamRef stream) : kind_(kind), stream_(stream) {
  if (kind != DeviceKind::Cuda) return;
  if (cuda_device_count() == 0) throw Error(ExitCode::Device, "DeviceTimer on a CUDA stream: no CUDA device is visible");
  cudaEvent_t a = nullptr, b = nullptr;
  ST_CHECK_CUDA(cudaEventCreate(&a));
  start_event_ = a;
  ST_CHECK_CUDA(cudaEventCreate(&b));
  stop_event_ = b;
}

void DeviceTimer::release() {
  if (start_event_) cudaEventDestroy(cuda_event(start_event_));
  if (stop_event_) cudaEventDestroy(cuda_event(stop_event_));
  start_event_ = stop_event_ = nullptr;
}

DeviceTimer::~DeviceTimer() { release(); }

DeviceTimer::DeviceTimer(DeviceTimer&& o) noexcept
    : kind_(o.kind_),
      stream_(o.stream_),
      start_event_(std::exchange(o.start_event_, nullptr)),
      stop_event_(std::exchange(o.stop_event_, nullptr)),
      t0_(o.t0_),
      t1_(o.t1_),
      started_(o.started_),
      stopped_(o.stopped_) {}

DeviceTimer& DeviceTimer::operator=(DeviceTimer&& o) noexcept {
  if (this != &o) {
    release();
    kind_ = o.kind_, stream_ = o.stream_, t0_ = o.t0_, t1_ = o.t1_, started_ = o.started_, stopped_ = o.stopped_;
    start_event_ = std::exchange(o.start_event_, nullptr);
    stop_event_ = std::exchange(o.stop_event_, nullptr);
  }
  return *this;
}

void DeviceTimer::start() {
  if (kind_ == DeviceKind::Cuda) {
    ST_CHECK_CUDA(cudaEventRecord(cuda_event(start_event_), cuda_stream(stream_)));
  } else {
    if (stream_.handle) stream_synchronize(stream_);
    t0_ = std::chrono::steady_clock::now();
  }
  started_ = true, stopped_ = false;
}

void DeviceTimer::stop() {
  if (kind_ == DeviceKind::Cuda) {
    ST_CHECK_CUDA(cudaEventRecord(cuda_event(stop_event_), cuda_stream(stream_)));
  } else {
    if (stream_.handle) stream_synchronize(stream_);
    t1_ = std::chrono::steady_clock::now();
  }
  stopped_ = true;
}

double DeviceTimer::seconds() const {
  if (!started_ || !stopped_) throw InternalError("DeviceTimer::seconds: the timer was not started and stopped");
  if (kind_ != DeviceKind::Cuda) return std::chrono::duration<double>(t1_ - t0_).count();
  ST_CHECK_CUDA(cudaEventSynchronize(cuda_event(stop_event_)));
  float ms = 0;
  ST_CHECK_CUDA(cudaEventElapsedTime(&ms, cuda_event(start_event_), cuda_event(stop_event_)));
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace shardtrain
