// What rank 0 shows while training: a redrawn bar on a terminal (step/total, loss, lr, grad norm,
// tokens/s, MFU, memory, ETA), plain log lines every logging.log_every steps otherwise (Slurm logs).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/train/config.hpp"
#include "shardtrain/train/metrics.hpp"

namespace shardtrain::train {

class ProgressView {
 public:
  ProgressView(const LoggingSection& logging, int64_t total_steps, bool active);
  ~ProgressView();
  void step(const StepMetrics& m);
  void eval(const EvalMetrics& m);
  void finish();
  static std::string line(const StepMetrics& m, int64_t total_steps, double eta_s);  // the plain line
  // A step on the bar: its fields, ranked for a narrow terminal (step/total, loss, eta and tokens/s kept longest).
  static void show_step(ProgressBar& bar, const StepMetrics& m, int64_t steps_run);
  // The time left: the steps still to take at this start's mean time per step (elapsed_s over the steps it ran,
  // not over the step number: a resumed run's first step is not its checkpoint's step count of them).
  static double eta_seconds(const StepMetrics& m, int64_t steps_run, int64_t total_steps);

 private:
  ProgressStyle style_ = ProgressStyle::Off;
  int64_t total_ = 0, log_every_ = 1;
  int64_t steps_run_ = 0;  // steps reported since this start (a rollback's repeated ones included)
  std::unique_ptr<ProgressBar> bar_;
};

}  // namespace shardtrain::train
