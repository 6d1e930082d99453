// Where a GPU step's time goes between the host and the device (the "host gap"): CUDA events on the compute
// stream at the step's first queued op and after its last (the update), and the host's clock while it queues
// the forward and backward. The events are read one step late, once the next step's loss read has waited past
// them, so measuring adds no host wait (train_gpu_host_waits counts them). On the CPU backend it does nothing.
#pragma once

#include <array>
#include <chrono>
#include <optional>

#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::train {

struct StepTimes {
  double gpu_busy_s = 0;         // the previous step: its first op to its last, on the compute stream
  double gpu_idle_before_s = 0;  // this step: the compute stream idle between the previous step's last op and
                                 // this step's first (the host's work between steps: metrics, the next batch)
  double host_queue_s = 0;       // this step: the host's time to queue forward and backward (the GPU waits on the
                                 // host inside the step when this exceeds the GPU's time for that work)
};

class StepTimeline {
 public:
  // `stream`: the compute stream (the ops' stream) the timers time.
  explicit StepTimeline(bool gpu, StreamRef stream = {});
  void step_begins();  // before the step's first device work is queued
  void work_queued();  // forward and backward are queued (before the loss read waits)
  void step_ends();    // the update is queued
  // After this step's loss read (a synchronization past step_begins): the figures above; nullopt on the CPU
  // and for the first step (no previous step to read).
  std::optional<StepTimes> read();

 private:
  bool gpu_;
  int64_t step_ = 0;
  std::array<std::optional<DeviceTimer>, 2> busy_, idle_;  // double-buffered: step N's and N - 1's
  std::chrono::steady_clock::time_point queue_start_{};
  double host_queue_s_ = 0;
};

}  // namespace shardtrain::train
