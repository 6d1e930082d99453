// MFU against a labelled peak (mfu.hpp).
#include "shardtrain/train/mfu.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {
namespace {

std::string flops_text(double f) {
  if (f >= 1e12) return fmt::format("{:.1f} TFLOP/s", f * 1e-12);
  return f >= 1e8 ? fmt::format("{:.1f} GFLOP/s", f * 1e-9) : fmt::format("{:.3g} FLOP/s", f);
}

}  // namespace

const char* peak_kind_name(PeakKind kind) {
  switch (kind) {
    case PeakKind::Configured: return "configured";
    case PeakKind::Spec: return "spec";
    case PeakKind::Measured: return "measured";
  }
  return "?";
}

MfuMeter MfuMeter::choose(double configured, bool gpu, const std::string& device_name, double measured, double cpu_ceiling,
                          const std::string& cpu_ceiling_how, bool cpu_ceiling_bounds, double core_share,
                          const std::string& core_share_how) {
  MfuMeter m;
  // A rank's share of the node's cores: its threads' rate alone, measured at start or computed, times that share.
  const double share = !gpu && core_share > 0 && core_share < 1 ? core_share : 1.0;
  m.measured_ = measured * share;
  m.ceiling_ = gpu ? 0.0 : cpu_ceiling * share;
  m.ceiling_how_ = cpu_ceiling_how;
  if (share < 1) m.ceiling_how_ += fmt::format(", x {:.2f}: {}", share, core_share_how);
  // Not a bound (the current clock read, not the maximum), or below what was measured: no ceiling. The figure
  // a peak is raised to is then the larger of the two, and is called what it is.
  m.ceiling_bounds_ = cpu_ceiling_bounds && m.ceiling_ >= m.measured_;
  if (!gpu && m.ceiling_ > 0 && m.ceiling_ < m.measured_) {
    m.ceiling_how_ =
        fmt::format("the rate measured at start, above the computed {} ({})", flops_text(m.ceiling_), m.ceiling_how_);
    m.ceiling_ = m.measured_;
  }
  const ops::SpecPeak spec = gpu ? ops::gpu_spec_peak(device_name) : ops::SpecPeak{};
  if (configured > 0) {
    m.kind_ = PeakKind::Configured;
    m.peak_ = configured;
    m.label_ = fmt::format("logging.peak_flops: {} per rank", flops_text(configured));
  } else if (spec.flops_per_s > 0) {
    m.kind_ = PeakKind::Spec;
    m.peak_ = spec.flops_per_s;
    m.label_ = fmt::format("datasheet: {} dense bf16, {} per GPU", spec.part, flops_text(spec.flops_per_s));
  } else {
    m.kind_ = PeakKind::Measured;
    m.peak_ = m.measured_;
    m.label_ = gpu ? fmt::format("measured: bf16 8192^3 matmul at start, {} per GPU ({} is not in the datasheet table)",
                                 flops_text(measured), device_name)
               : share < 1
                   ? fmt::format(
                         "measured: the best of several fp32 1024^3 sgemms at the step's thread count, {} per rank "
                         "alone, x {:.2f} = {} per rank: {}",
                         flops_text(measured), share, flops_text(m.peak_), core_share_how)
                   : fmt::format("measured: the best of several fp32 1024^3 sgemms at the step's thread count, {} per rank",
                                 flops_text(measured));
  }
  return m;
}

double MfuMeter::raise(double& peak, double achieved_per_rank, const char* what, bool& warned) {
  if (achieved_per_rank <= peak) return peak;
  const double before = peak;
  peak = ceiling_ > achieved_per_rank ? ceiling_ : achieved_per_rank;
  // Only rank 0's figures are reported (metrics.jsonl, the progress, bench): it alone says its peak was raised.
  if (!warned && log::config().rank == 0) {
    log::warn(
        "MFU: a step ran at {} per rank, above the {} peak of {}; that peak is now {}{} (a peak measured "
        "while the machine was busy comes out low)",
        flops_text(achieved_per_rank), what, flops_text(before), flops_text(peak),
        peak != ceiling_  ? std::string(", the step's own rate")
        : ceiling_bounds_ ? fmt::format(", the CPU's ceiling: {}", ceiling_how_)
                          : fmt::format(", the CPU's estimated rate (not a ceiling): {}", ceiling_how_));
  }
  warned = true;
  return peak;
}

double MfuMeter::mfu(double achieved, int ranks) {
  if (peak_ <= 0 || ranks <= 0 || !(achieved > 0)) return 0.0;
  const double per_rank = achieved / ranks;
  if (per_rank > peak_) {
    if (raised_from_.empty()) raised_from_ = label_;
    raise(peak_, per_rank, peak_kind_name(kind_), warned_peak_);
    // The figure MFU is now taken against, not the one a step outran (logging.peak_flops 1 read "0.0 GFLOP/s").
    label_ = fmt::format("{} (raised to {}: a step outran it)", raised_from_, flops_text(peak_));
  }
  return std::min(1.0, per_rank / peak_);
}

double MfuMeter::mfu_of_measured(double achieved, int ranks) {
  // Nothing measured (logging.peak_flops given): no figure, not 0 % (metrics.jsonl's null, no TensorBoard scalar).
  if (measured_ <= 0) return std::numeric_limits<double>::quiet_NaN();
  if (ranks <= 0 || !(achieved > 0)) return 0.0;
  const double per_rank = achieved / ranks;
  // With the measured peak as MFU's own (the CPU, an unknown GPU) both figures are one: one warning when raised.
  raise(measured_, per_rank, "measured", kind_ == PeakKind::Measured ? warned_peak_ : warned_measured_);
  return std::min(1.0, per_rank / measured_);
}

}  // namespace shardtrain::train
