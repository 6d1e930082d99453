// The compute stream's timeline around a step's host phases (step_timeline.hpp).
#include "shardtrain/train/step_timeline.hpp"

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::train {

StepTimeline::StepTimeline(bool gpu, StreamRef stream) : gpu_(gpu) {
  if (!gpu_) return;
  for (auto& t : busy_) t.emplace(DeviceKind::Cuda, stream);  // the events, once: a steady-state step creates none
  for (auto& t : idle_) t.emplace(DeviceKind::Cuda, stream);
}

void StepTimeline::step_begins() {
  queue_start_ = std::chrono::steady_clock::now();
  if (!gpu_) return;
  const size_t k = static_cast<size_t>(step_ % 2);
  if (step_ > 0) idle_[k]->stop();  // started when the previous step's update was queued
  busy_[k]->start();
}

void StepTimeline::work_queued() {
  host_queue_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - queue_start_).count();
}

void StepTimeline::step_ends() {
  if (!gpu_) return;
  const size_t k = static_cast<size_t>(step_ % 2);
  busy_[k]->stop();
  idle_[(k + 1) % 2]->start();  // stopped by the next step's first op
  ++step_;
}

std::optional<StepTimes> StepTimeline::read() {
  // Called after step_ends of the step being reported: step_ counts it. Its idle timer stopped at its first op
  // and the previous step's busy timer at that step's update, both before this step's loss read.
  if (!gpu_ || step_ < 2) return std::nullopt;
  const size_t now = static_cast<size_t>((step_ - 1) % 2), previous = static_cast<size_t>(step_ % 2);
  StepTimes t;
  try {
    t.gpu_busy_s = busy_[previous]->seconds();
    t.gpu_idle_before_s = idle_[now]->seconds();
  } catch (const InternalError&) {  // a step that ended early (an error) left a timer unstopped: no figures
    return std::nullopt;
  }
  t.host_queue_s = host_queue_s_;
  return t;
}

}  // namespace shardtrain::train
