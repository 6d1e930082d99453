// MFU's denominator: the datasheet table by device name, the CPU ceiling, and the rule that no utilisation
// above 100 % is ever reported (issue 36: a busy machine measured a low peak and the trainer printed 148 %).
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/train/mfu.hpp"

using namespace shardtrain;

TEST(SpecPeak, DeviceNamesAsTheCudaRuntimeReportsThem) {
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H100 80GB HBM3").flops_per_s, 989e12);
  EXPECT_EQ(ops::gpu_spec_peak("NVIDIA H100 80GB HBM3").part, "H100 SXM");
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H100 PCIe").flops_per_s, 756e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H100 NVL").flops_per_s, 835e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H200").flops_per_s, 989e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H200 NVL").flops_per_s, 835e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA GH200 480GB").flops_per_s, 989e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H20").flops_per_s, 148e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA A100-SXM4-80GB").flops_per_s, 312e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA A100 80GB PCIe").flops_per_s, 312e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA A10").flops_per_s, 125e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA L40S").flops_per_s, 362e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA L40").flops_per_s, 181e12);
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA L4").flops_per_s, 121e12);
  // Unknown, or a name a shorter entry must not claim: the caller measures instead.
  EXPECT_EQ(ops::gpu_spec_peak("NVIDIA A10G").flops_per_s, 0);
  EXPECT_EQ(ops::gpu_spec_peak("NVIDIA GeForce RTX 3090").flops_per_s, 0);
  EXPECT_EQ(ops::gpu_spec_peak("cpu").flops_per_s, 0);
}

TEST(CpuCeiling, BoundsTheRateFromAbove) {
  const ops::CpuCeiling one = ops::cpu_fp32_ceiling(1), two = ops::cpu_fp32_ceiling(2);
  if (one.flops_per_s == 0) GTEST_SKIP() << "the kernel reports no CPU clock here";
  EXPECT_DOUBLE_EQ(two.flops_per_s, 2 * one.flops_per_s);
  // At least 16 FLOP per cycle (4 lanes x 2 pipes x 2) at a clock of at least 100 MHz.
  EXPECT_GE(one.flops_per_s, 16 * 100e6);
  EXPECT_NE(one.how.find("FLOP/cycle"), std::string::npos) << one.how;
}

TEST(MfuMeter, OnAKnownGpuTheDatasheetPeakLeadsAndTheMeasuredOneStandsBeside) {
  train::MfuMeter m = train::MfuMeter::choose(0, true, "NVIDIA H200", 800e12, 0, "");
  EXPECT_EQ(m.kind(), train::PeakKind::Spec);
  EXPECT_DOUBLE_EQ(m.peak_per_rank(), 989e12);
  EXPECT_NE(m.label().find("H200 SXM"), std::string::npos) << m.label();
  // 4 GPUs at 400 TFLOP/s each.
  EXPECT_NEAR(m.mfu(1600e12, 4), 400.0 / 989.0, 1e-12);
  EXPECT_NEAR(m.mfu_of_measured(1600e12, 4), 0.5, 1e-12);
}

TEST(MfuMeter, AnUnknownGpuFallsBackToTheMeasuredPeakAndSaysSo) {
  train::MfuMeter m = train::MfuMeter::choose(0, true, "NVIDIA GeForce RTX 3090", 70e12, 0, "");
  EXPECT_EQ(m.kind(), train::PeakKind::Measured);
  EXPECT_DOUBLE_EQ(m.peak_per_rank(), 70e12);
  EXPECT_NE(m.label().find("not in the datasheet table"), std::string::npos) << m.label();
}

TEST(MfuMeter, NeverAbove100PercentWhenABusyMachineMeasuredALowPeak) {
  // The case: a peak of 97.6 GFLOP/s measured while the machine was busy, then a step at 145 GFLOP/s.
  train::MfuMeter m = train::MfuMeter::choose(0, false, "cpu", 97.6e9, 300e9, "2 cores x 64 FLOP/cycle x 2.3 GHz");
  EXPECT_NEAR(m.mfu(48.8e9, 1), 0.5, 1e-12);
  const double outran = m.mfu(145.3e9, 1);
  EXPECT_LE(outran, 1.0);
  // Raised to the CPU's ceiling (known, and above the step's rate), not to the step's rate.
  EXPECT_DOUBLE_EQ(m.peak_per_rank(), 300e9);
  EXPECT_NEAR(outran, 145.3 / 300.0, 1e-12);
  EXPECT_NE(m.label().find("raised"), std::string::npos) << m.label();
  // Without a known ceiling the peak becomes the step's own rate: 100 %, not 148 %.
  train::MfuMeter bare = train::MfuMeter::choose(0, false, "cpu", 97.6e9, 0, "");
  EXPECT_DOUBLE_EQ(bare.mfu(145.3e9, 1), 1.0);
  EXPECT_DOUBLE_EQ(bare.peak_per_rank(), 145.3e9);
  EXPECT_NEAR(bare.mfu(72.65e9, 1), 0.5, 1e-12);  // later steps against the raised peak
  EXPECT_LE(bare.mfu_of_measured(200e9, 1), 1.0);
}

TEST(MfuMeter, AConfiguredPeakIsUsedAndLabelled) {
  train::MfuMeter m = train::MfuMeter::choose(100e9, false, "cpu", 0, 0, "");
  EXPECT_EQ(m.kind(), train::PeakKind::Configured);
  EXPECT_NEAR(m.mfu(50e9, 1), 0.5, 1e-12);
  EXPECT_TRUE(std::isnan(m.mfu_of_measured(50e9, 1)));  // nothing was measured: no figure (it was 0.0, "0 %")
  EXPECT_NE(m.label().find("logging.peak_flops"), std::string::npos);
  // A step that outruns it: the label names the figure MFU is now taken against (it said "0.0 GFLOP/s" of a peak of 1).
  train::MfuMeter one = train::MfuMeter::choose(1, false, "cpu", 0, 150e9, "2 cores");
  EXPECT_NEAR(one.mfu(75e9, 1), 0.5, 1e-12);
  EXPECT_NE(one.label().find("logging.peak_flops: 1 FLOP/s per rank (raised to 150.0 GFLOP/s: a step outran it)"),
            std::string::npos)
      << one.label();
}

// On the CPU the measured matmul is MFU's own peak and mfu_measured_peak's too: one figure, so a step that outruns
// it is said once, not once for each (the loop asks for both after every step).
TEST(MfuMeter, AMeasuredPeakThatIsMfusOwnIsSaidRaisedOnce) {
  train::MfuMeter m = train::MfuMeter::choose(0, false, "cpu", 18.7e9, 147.2e9, "1 core x 64 FLOP/cycle x 2.3 GHz");
  ::testing::internal::CaptureStderr();
  const double mfu = m.mfu(20.5e9, 1), measured = m.mfu_of_measured(20.5e9, 1);
  m.mfu(30e9, 1);
  m.mfu_of_measured(30e9, 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NEAR(mfu, 20.5 / 147.2, 1e-12);
  EXPECT_NEAR(measured, 20.5 / 147.2, 1e-12);
  size_t lines = 0;
  for (size_t at = err.find("above the"); at != std::string::npos; at = err.find("above the", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_NE(err.find("147.2 GFLOP/s"), std::string::npos) << err;
}
