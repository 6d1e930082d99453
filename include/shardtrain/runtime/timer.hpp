// Timing of work queued on a backend's stream, for benchmarks: CUDA events recorded on the stream when the
// device is a GPU (the elapsed time is the GPU's, launch overhead hidden behind earlier work), a monotonic
// clock read after a synchronize on the CPU (the CPU backend runs each op to completion before it returns).
// The CUDA half lives in timer_cuda.cpp; a build without CUDA uses timer_cpu.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain {

// One interval: start() and stop() queue (or read) its ends, seconds() waits for the stop and returns the
// time between them. Several timers may be started and stopped back to back and read at the end, so
// nothing synchronizes between the calls being timed. Move-only (owns two CUDA events on a GPU).
class DeviceTimer {
 public:
  // kind Cuda needs a current CUDA device (throws a Device error otherwise, or in a build without CUDA).
  explicit DeviceTimer(DeviceKind kind, StreamRef stream = {});
  ~DeviceTimer();
  DeviceTimer(DeviceTimer&& o) noexcept;
  DeviceTimer& operator=(DeviceTimer&& o) noexcept;
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  void start();
  void stop();
  double seconds() const;  // throws InternalError when start() or stop() was never called
  DeviceKind kind() const { return kind_; }

 private:
  void release();
  DeviceKind kind_ = DeviceKind::Cpu;
  StreamRef stream_{};
  void* start_event_ = nullptr;  // cudaEvent_t
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point t0_{}, t1_{};
  bool started_ = false, stopped_ = false;
};

// The median of a benchmark's samples (the mean of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

// Median seconds of `reps` calls of `fn` after `warmup` untimed ones, each call between a timer's start and
// stop, all queued back to back on `stream` and read at the end.
template <typename Fn>
double median_call_seconds(DeviceKind device, StreamRef stream, int warmup, int reps, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<DeviceTimer> timers;
  timers.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) timers.emplace_back(device, stream);
  for (DeviceTimer& t : timers) {
    t.start();
    fn();
    t.stop();
  }
  std::vector<double> seconds;
  for (const DeviceTimer& t : timers) seconds.push_back(t.seconds());
  return median(std::move(seconds));
}

}  // namespace shardtrain
