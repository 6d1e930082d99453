// LR schedules: the default reproduces the seed's SequentialLR(LinearLR(0.1 -> 1), CosineAnnealingLR)
// step by step, computed here the way PyTorch computes it (each scheduler's recursive, chainable form),
// independently of the closed form the library uses.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "shardtrain/optim/schedule.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;

namespace {

// PyTorch 2.x, torch/optim/lr_scheduler.py, for one param group: the lr after each scheduler.step().
// LinearLR.get_lr: epoch 0 -> lr * start; epoch > total -> lr; else
//   lr * (1 + (end - start) / (total * start + (epoch - 1) * (end - start))).
// CosineAnnealingLR.get_lr (epoch >= 1, no restart branch hit while epoch <= T_max):
//   (1 + cos(pi * e / T)) / (1 + cos(pi * (e - 1) / T)) * (lr - eta_min) + eta_min.
// SequentialLR: at the milestone it calls the cosine's step(0), whose closed form gives base_lr.
std::vector<double> torch_sequential_lr(double base, double start, int64_t warmup, int64_t total, double eta_min) {
  std::vector<double> out;
  double lr = base * start;  // LinearLR's constructor step (epoch 0)
  out.push_back(lr);
  const double end = 1.0;
  const int64_t t_max = total - warmup;
  for (int64_t epoch = 1; epoch < total; ++epoch) {
    if (epoch < warmup) {
      lr = lr *
           (1.0 + (end - start) / (static_cast<double>(warmup) * start + static_cast<double>(epoch - 1) * (end - start)));
    } else if (epoch == warmup) {
      lr = eta_min + (base - eta_min) * (1.0 + std::cos(0.0)) / 2.0;  // cosine.step(0): closed form at 0
    } else {
      const double e = static_cast<double>(epoch - warmup), t = static_cast<double>(t_max);
      lr = (1.0 + std::cos(std::numbers::pi * e / t)) / (1.0 + std::cos(std::numbers::pi * (e - 1) / t)) * (lr - eta_min) +
           eta_min;
    }
    out.push_back(lr);
  }
  return out;
}

}  // namespace

TEST(Schedule, SeedWarmupCosineMatchesTorchSequentialLR) {
  // The seed: lr 1e-3, LinearLR(start_factor 0.1, total_iters 1000), CosineAnnealingLR(T_max total-1000, eta_min 0).
  for (int64_t total : {3000, 1001, 12345}) {
    optim::ScheduleConfig c;
    c.warmup_steps = 1000;
    c.warmup_start_factor = 0.1;
    c.min_lr = 0;
    const optim::LrSchedule s(c, 1e-3, total);
    const std::vector<double> ref = torch_sequential_lr(1e-3, 0.1, 1000, total, 0.0);
    double worst = 0;
    int64_t worst_step = 0;
    for (int64_t k = 0; k < total; ++k) {
      const double rel = std::abs(s.lr(k) - ref[static_cast<size_t>(k)]) / 1e-3;
      if (rel > worst) worst = rel, worst_step = k;
    }
    EXPECT_LT(worst, 1e-9) << "total " << total << ": worst at step " << worst_step << ": " << s.lr(worst_step)
                           << " vs torch " << ref[static_cast<size_t>(worst_step)];
  }
  optim::ScheduleConfig c;
  c.warmup_steps = 1000;
  const optim::LrSchedule s(c, 1e-3, 3000);
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-4);  // 0.1 x lr
  EXPECT_DOUBLE_EQ(s.lr(500), 1e-3 * (0.1 + 0.9 * 0.5));
  EXPECT_DOUBLE_EQ(s.lr(1000), 1e-3);      // the milestone: the peak
  EXPECT_NEAR(s.lr(2000), 0.5e-3, 1e-15);  // halfway down the cosine
  EXPECT_NEAR(s.lr(2999), 1e-3 * (1 + std::cos(std::numbers::pi * 1999 / 2000)) / 2, 1e-18);
}

TEST(Schedule, CosineWithFloorMatchesTorch) {
  optim::ScheduleConfig c;
  c.warmup_steps = 7;
  c.warmup_start_factor = 0.25;
  c.min_lr = 1e-5;
  const optim::LrSchedule s(c, 3e-4, 50);
  const auto ref = torch_sequential_lr(3e-4, 0.25, 7, 50, 1e-5);
  for (int64_t k = 0; k < 50; ++k) EXPECT_NEAR(s.lr(k), ref[static_cast<size_t>(k)], 1e-15) << "step " << k;
}

TEST(Schedule, OtherKinds) {
  optim::ScheduleConfig c;
  c.warmup_steps = 10;
  c.min_lr = 0.1;
  c.kind = optim::ScheduleKind::Constant;
  EXPECT_DOUBLE_EQ(optim::LrSchedule(c, 1.0, 100).lr(0), 0.1);
  EXPECT_DOUBLE_EQ(optim::LrSchedule(c, 1.0, 100).lr(50), 1.0);
  EXPECT_DOUBLE_EQ(optim::LrSchedule(c, 1.0, 100).lr(99), 1.0);
  c.kind = optim::ScheduleKind::WarmupLinear;
  const optim::LrSchedule lin(c, 1.0, 110);
  EXPECT_DOUBLE_EQ(lin.lr(10), 1.0);
  EXPECT_DOUBLE_EQ(lin.lr(60), 0.55);  // halfway from 1 to 0.1
  c.kind = optim::ScheduleKind::WarmupStableDecay;
  c.decay_steps = 20;
  const optim::LrSchedule wsd(c, 1.0, 110);
  EXPECT_DOUBLE_EQ(wsd.lr(10), 1.0);
  EXPECT_DOUBLE_EQ(wsd.lr(89), 1.0);  // stable until the last 20 steps
  EXPECT_DOUBLE_EQ(wsd.lr(90), 1.0);
  EXPECT_DOUBLE_EQ(wsd.lr(100), 0.55);
  EXPECT_NEAR(wsd.lr(109), 1.0 + (0.1 - 1.0) * 19.0 / 20.0, 1e-15);
  // A decay longer than the steps after the warmup (a config's 4000 in a shortened run) takes those steps: it
  // begins where the warmup ends, and is the linear schedule's.
  c.decay_steps = 4000;
  const optim::LrSchedule cut(c, 1.0, 110);
  for (const int64_t k : {0, 5, 10, 11, 60, 109}) EXPECT_DOUBLE_EQ(cut.lr(k), lin.lr(k)) << "step " << k;
  // The default decay is 20 % of the steps after the warmup, rounded: 8 of them decay over 2 (it was 1, at the peak).
  c.decay_steps = 0;
  const optim::LrSchedule short_wsd(c, 1.0, 18);
  EXPECT_DOUBLE_EQ(short_wsd.lr(15), 1.0);
  EXPECT_DOUBLE_EQ(short_wsd.lr(16), 1.0);
  EXPECT_DOUBLE_EQ(short_wsd.lr(17), 0.55);
  // A warmup as long as the run is refused for every kind: a constant schedule's run never reached optim.lr.
  for (const auto kind : {optim::ScheduleKind::Constant, optim::ScheduleKind::WarmupStableDecay})
    EXPECT_THROW(optim::LrSchedule(
                     [&] {
                       optim::ScheduleConfig k = c;
                       k.kind = kind;
                       return k;
                     }(),
                     1.0, 10),
                 ConfigError);
  EXPECT_EQ(optim::parse_schedule_kind("wsd"), optim::ScheduleKind::WarmupStableDecay);
  EXPECT_THROW(optim::parse_schedule_kind("step"), ConfigError);
}

// warmup_start_factor 0: transformers' warmups (get_cosine_schedule_with_warmup and the others), lr 0 at the
// first step; tests/torch/hf_schedules_test.py holds whole schedules to transformers itself.
TEST(Schedule, WarmupFromZero) {
  optim::ScheduleConfig c;
  c.warmup_steps = 10;
  c.warmup_start_factor = 0;
  const optim::LrSchedule s(c, 2e-3, 100);
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(5), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(10), 2e-3);
}

TEST(Schedule, ImpossibleSettingsAreConfigErrors) {
  optim::ScheduleConfig c;
  c.warmup_steps = 100;
  EXPECT_THROW(optim::LrSchedule(c, 1e-3, 100), ConfigError);  // no room to decay
  c.warmup_steps = 0;
  for (double f : {-0.1, 1.5, std::nan("")}) {
    c.warmup_start_factor = f;
    EXPECT_THROW(c.validate(), ConfigError) << f;
  }
  c.warmup_start_factor = 0.1;
  c.min_lr = 1.0;
  EXPECT_THROW(optim::LrSchedule(c, 1e-3, 100), ConfigError);
}
