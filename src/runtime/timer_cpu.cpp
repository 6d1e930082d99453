// DeviceTimer in a build without CUDA: the CPU backend only, timed with steady_clock.
#include <utility>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain {

DeviceTimer::DeviceTimer(DeviceKind kind, StreamRef stream) : kind_(kind), stream_(stream) {
  if (kind == DeviceKind::Cuda)
    throw Error(ExitCode::Device, "DeviceTimer on a CUDA stream: shardtrain was built without CUDA (SHARDTRAIN_CUDA=OFF)");
}
DeviceTimer::~DeviceTimer() = default;
void DeviceTimer::release() {}
DeviceTimer::DeviceTimer(DeviceTimer&& o) noexcept
    : kind_(o.kind_), stream_(o.stream_), t0_(o.t0_), t1_(o.t1_), started_(o.started_), stopped_(o.stopped_) {}
DeviceTimer& DeviceTimer::operator=(DeviceTimer&& o) noexcept {
  kind_ = o.kind_, stream_ = o.stream_, t0_ = o.t0_, t1_ = o.t1_, started_ = o.started_, stopped_ = o.stopped_;
  return *this;
}

void DeviceTimer::start() {
  stream_synchronize(stream_);
  t0_ = std::chrono::steady_clock::now();
  started_ = true, stopped_ = false;
}

void DeviceTimer::stop() {
  stream_synchronize(stream_);
  t1_ = std::chrono::steady_clock::now();
  stopped_ = true;
}

double DeviceTimer::seconds() const {
  if (!started_ || !stopped_) throw InternalError("DeviceTimer::seconds: the timer was not started and stopped");
  return std::chrono::duration<double>(t1_ - t0_).count();
}

}  // namespace shardtrain
