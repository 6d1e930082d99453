// Learning-rate schedules as pure functions of the optimizer step, so a checkpoint needs only the step
// to resume the schedule exactly. The default is the seed's SequentialLR(LinearLR(start_factor 0.1 -> 1
// over warmup_steps), CosineAnnealingLR(T_max = total - warmup, eta_min)), in closed form.
#pragma once

#include <cstdint>
#include <string_view>

namespace shardtrain::optim {

enum class ScheduleKind {
  WarmupCosine,       // linear warmup from warmup_start_factor * lr to lr, then cosine to min_lr (the seed)
  Constant,           // linear warmup, then lr
  WarmupLinear,       // linear warmup, then linear decay to min_lr at the last step
  WarmupStableDecay,  // linear warmup, lr until the last decay_steps, then linear decay to min_lr
};
const char* schedule_kind_name(ScheduleKind k);           // "cosine", "constant", "linear", "wsd"
ScheduleKind parse_schedule_kind(std::string_view text);  // the names above; throws ConfigError listing them

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::WarmupCosine;
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.1;  // LinearLR's start_factor (the seed: 0.1)
  double min_lr = 0.0;               // eta_min of the decay
  int64_t decay_steps = 0;           // wsd: length of the final decay (0: 20% of the run)
  void validate() const;             // throws ConfigError naming schedule.<key>
};

class LrSchedule {
 public:
  // peak_lr: the optimizer's lr; total_steps: optimizer steps in the whole run (the cosine's horizon).
  LrSchedule(const ScheduleConfig& config, double peak_lr, int64_t total_steps);

  // The learning rate of optimizer step `step` (0-based: step 0 is the first update), i.e. the rate
  // PyTorch's optimizer holds after `step` calls of scheduler.step().
  double lr(int64_t step) const;
  int64_t total_steps() const { return total_; }
  const ScheduleConfig& config() const { return config_; }

 private:
  ScheduleConfig config_;
  double peak_;
  int64_t total_;
};

}  // namespace shardtrain::optim
