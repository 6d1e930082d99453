// LR schedules in closed form (schedule.hpp). The cosine branch is PyTorch's CosineAnnealingLR closed
// form, which its recursive update reproduces exactly in real arithmetic; the tests compare the two.
#include "shardtrain/optim/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::optim {

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::WarmupCosine: return "cosine";
    case ScheduleKind::Constant: return "constant";
    case ScheduleKind::WarmupLinear: return "linear";
    case ScheduleKind::WarmupStableDecay: return "wsd";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view text) {
  for (ScheduleKind k :
       {ScheduleKind::WarmupCosine, ScheduleKind::Constant, ScheduleKind::WarmupLinear, ScheduleKind::WarmupStableDecay}) {
    if (text == schedule_kind_name(k)) return k;
  }
  if (text == "warmup_cosine") return ScheduleKind::WarmupCosine;
  if (text == "warmup_stable_decay") return ScheduleKind::WarmupStableDecay;
  throw ConfigError(fmt::format("schedule.kind: unknown schedule '{}' (expected cosine, constant, linear or wsd)", text));
}

void ScheduleConfig::validate() const {
  if (warmup_steps < 0) throw ConfigError(fmt::format("schedule.warmup_steps: expected >= 0, got {}", warmup_steps));
  // 0 is transformers' warmup (lr 0 at the first step); PyTorch's LinearLR itself wants more than 0.
  if (!(warmup_start_factor >= 0 && warmup_start_factor <= 1))
    throw ConfigError(fmt::format("schedule.warmup_start_factor: expected a factor in [0, 1], got {}", warmup_start_factor));
  if (!(min_lr >= 0) || !std::isfinite(min_lr))
    throw ConfigError(fmt::format("schedule.min_lr: expected >= 0, got {}", min_lr));
  if (decay_steps < 0) throw ConfigError(fmt::format("schedule.decay_steps: expected >= 0, got {}", decay_steps));
}

LrSchedule::LrSchedule(const ScheduleConfig& config, double peak_lr, int64_t total_steps)
    : config_(config), peak_(peak_lr), total_(total_steps) {
  config_.validate();
  if (total_ <= 0) throw ConfigError(fmt::format("schedule: the run has {} optimizer steps; expected at least 1", total_));
  if (config_.warmup_steps >= total_)
    throw ConfigError(fmt::format("schedule.warmup_steps: {} warmup steps leave {} in a run of {} steps",
                                  config_.warmup_steps,
                                  config_.kind == ScheduleKind::Constant ? "no step at optim.lr" : "no decay", total_));
  if (config_.min_lr > peak_)
    throw ConfigError(fmt::format("schedule.min_lr: {} is above optim.lr {}", config_.min_lr, peak_));
}

double LrSchedule::lr(int64_t step) const {
  const int64_t w = config_.warmup_steps;
  if (step < w) {
    // LinearLR: factor goes from start_factor to 1 over w steps.
    const double f = config_.warmup_start_factor +
                     (1.0 - config_.warmup_start_factor) * static_cast<double>(step) / static_cast<double>(w);
    return peak_ * f;
  }
  const double lo = config_.min_lr;
  switch (config_.kind) {
    case ScheduleKind::Constant: return peak_;
    case ScheduleKind::WarmupCosine: {
      // CosineAnnealingLR with T_max = total - warmup, started at the milestone.
      const double t = static_cast<double>(step - w), t_max = static_cast<double>(total_ - w);
      return lo + (peak_ - lo) * (1.0 + std::cos(std::numbers::pi * t / t_max)) / 2.0;
    }
    case ScheduleKind::WarmupLinear: {
      const double t = static_cast<double>(step - w), span = static_cast<double>(total_ - w);
      return peak_ + (lo - peak_) * std::min(1.0, t / span);
    }
    case ScheduleKind::WarmupStableDecay: {
      const int64_t d =
          config_.decay_steps > 0 ? std::min(config_.decay_steps, total_ - w) : std::max<int64_t>(1, (total_ - w + 2) / 5);
      const int64_t decay_begin = total_ - d;
      if (step < decay_begin) return peak_;
      // Like the cosine and linear decays, reaches min_lr at step total (one past the last update).
      const double t = static_cast<double>(step - decay_begin) / static_cast<double>(d);
      return peak_ + (lo - peak_) * std::min(1.0, t);
    }
  }
  return peak_;
}

}  // namespace shardtrain::optim
