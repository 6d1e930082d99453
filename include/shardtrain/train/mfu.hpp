// The denominator of MFU, chosen once and labelled (docs/training.md, "MFU"), and the utilisation figures
// reported against it. On a GPU the industry's convention: the device's dense bf16 datasheet peak; the matmul
// measured at start stands beside it as a second, labelled figure. No figure above 100 % is ever reported: a
// measured peak that a step outruns (the measurement was disturbed) is raised, and the change logged.
#pragma once

#include <string>

namespace shardtrain::train {

enum class PeakKind {
  Configured,  // logging.peak_flops
  Spec,        // the GPU's datasheet figure (ops::gpu_spec_peak)
  Measured,    // the matmul measured at start: an unknown GPU, or the CPU
};

class MfuMeter {
 public:
  MfuMeter() = default;
  // configured: logging.peak_flops (0 = none); measured: per rank, the ranks' mean of the matmul measured at start
  // (0 = not measured); cpu_ceiling: per rank, ops::cpu_fp32_ceiling (0 = unknown; CPU only), and whether it bounds
  // the rate (ops::CpuCeiling::bound: false where only /proc/cpuinfo's current clock was read). Where it does not, or
  // where it lies below the measured rate, it is no ceiling: the figure a peak is raised to is the larger of it and
  // the measured rate, and no message calls it a ceiling (audit I4: a "ceiling" of 78.3 GFLOP/s a core, 80-89
  // measured).
  // core_share (CPU only): the part of its threads' cores a rank gets, 1 / runtime::core_oversubscription (ranks
  // per node x threads per rank over the node's cores, at least 1). The measured peak and the ceiling, a rank's
  // threads' rate alone, are scaled by it, so that MFU is of what the node's cores can do (audit I3: 4 ranks x 1
  // thread on 2 cores were held to 4 cores' rate, and read half the MFU of 1 rank x 2 threads); core_share_how says
  // why, in the label. A configured peak is not scaled.
  static MfuMeter choose(double configured, bool gpu, const std::string& device_name, double measured, double cpu_ceiling,
                         const std::string& cpu_ceiling_how, bool cpu_ceiling_bounds = true, double core_share = 1.0,
                         const std::string& core_share_how = {});

  // achieved FLOP/s over `ranks` ranks as a fraction of the chosen peak, in [0, 1].
  double mfu(double achieved, int ranks);
  // The same against the matmul measured at start (0 when none was measured), in [0, 1].
  double mfu_of_measured(double achieved, int ranks);  // NaN when nothing was measured

  double peak_per_rank() const { return peak_; }
  double ceiling_per_rank() const { return ceiling_; }  // CPU: what a peak outrun is raised to, if above the rate
  bool ceiling_bounds() const { return ceiling_bounds_; }
  double measured_per_rank() const { return measured_; }
  PeakKind kind() const { return kind_; }
  const std::string& label() const { return label_; }  // e.g. "datasheet: H200 SXM dense bf16, 989 TFLOP/s"

 private:
  // Raises `peak` when `achieved_per_rank` outran it: to the CPU ceiling when that is known and higher, else
  // to the rate itself; logs the first time with `what`, on rank 0 only (its figures are the ones reported).
  double raise(double& peak, double achieved_per_rank, const char* what, bool& warned);

  double peak_ = 0, measured_ = 0, ceiling_ = 0;
  bool ceiling_bounds_ = true;  // ceiling_ is a true upper bound (else an estimate, or the measured rate)
  PeakKind kind_ = PeakKind::Measured;
  std::string label_, ceiling_how_;
  std::string raised_from_;  // the label before the peak was first raised
  bool warned_peak_ = false, warned_measured_ = false;
};

const char* peak_kind_name(PeakKind kind);  // "configured" | "spec" | "measured"

}  // namespace shardtrain::train
