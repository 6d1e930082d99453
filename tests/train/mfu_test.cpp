// MFU's denominator: the datasheet table by device name, the CPU ceiling, and the rule that no utilisation
// above 100 % is ever reported (issue 36: a busy machine measured a low peak and the trainer printed 148 %).
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/topology.hpp"
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
  // Audit I2: the first entry found anywhere in the name won, so a GB200 read as a B200 (2250) and an H800 PCIe as
  // an H800 SXM (989). A whole model name now matches, the longest.
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA GB200").flops_per_s, 2500e12);
  EXPECT_EQ(ops::gpu_spec_peak("NVIDIA GB200").part, "GB200");
  EXPECT_DOUBLE_EQ(ops::gpu_spec_peak("NVIDIA H800 PCIe").flops_per_s, 756e12);
  EXPECT_EQ(ops::gpu_spec_peak("NVIDIA H800 PCIe").part, "H800 PCIe");
}

// Every row of the table, by a name as the CUDA runtime reports it: each finds its own row, whatever the order.
TEST(SpecPeak, EveryRowFindsItself) {
  const struct {
    const char* name;
    const char* part;
    double tflops;
  } rows[] = {
      {"NVIDIA H100 PCIe", "H100 PCIe", 756},
      {"NVIDIA H100 NVL", "H100 NVL", 835},
      {"NVIDIA H100 80GB HBM3", "H100 SXM", 989},
      {"NVIDIA H800 PCIe", "H800 PCIe", 756},
      {"NVIDIA H800", "H800 SXM", 989},
      {"NVIDIA H200 NVL", "H200 NVL", 835},
      {"NVIDIA GH200 480GB", "GH200", 989},
      {"NVIDIA H200", "H200 SXM", 989},
      {"NVIDIA H20", "H20", 148},
      {"NVIDIA B200", "B200", 2250},
      {"NVIDIA GB200", "GB200", 2500},
      {"NVIDIA A100-SXM4-80GB", "A100", 312},
      {"NVIDIA A800-SXM4-80GB", "A800", 312},
      {"NVIDIA A30", "A30", 165},
      {"NVIDIA A10", "A10", 125},
      {"NVIDIA L40S", "L40S", 362},
      {"NVIDIA L40", "L40", 181},
      {"NVIDIA L4", "L4", 121},
  };
  for (const auto& r : rows) {
    const ops::SpecPeak p = ops::gpu_spec_peak(r.name);
    EXPECT_DOUBLE_EQ(p.flops_per_s, r.tflops * 1e12) << r.name;
    EXPECT_EQ(p.part, r.part) << r.name;
  }
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
  // A bound only with cpufreq's maximum clock; /proc/cpuinfo's current clock says it is an estimate (audit I4).
  EXPECT_EQ(one.bound, one.how.find("cpufreq maximum") != std::string::npos) << one.how;
  if (!one.bound) EXPECT_NE(one.how.find("not a ceiling"), std::string::npos) << one.how;
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

// Audit I3: CPU ranks that share a node's cores. The factor is predict's (runtime::core_oversubscription): ranks x
// threads over the cores, at least 1; a rank's peak is its threads' rate alone over it.
TEST(MfuMeter, RanksSharingTheCoresAreHeldToTheirShare) {
  EXPECT_DOUBLE_EQ(core_oversubscription(4, 1, 2), 2.0);  // the audit's 4 ranks x 1 thread on 2 cores
  EXPECT_DOUBLE_EQ(core_oversubscription(1, 2, 2), 1.0);  // 1 rank x 2 threads: the cores are its own
  EXPECT_DOUBLE_EQ(core_oversubscription(2, 1, 4), 1.0);  // fewer threads than cores: never below 1
  EXPECT_DOUBLE_EQ(core_oversubscription(4, 2, 2), 4.0);
  const double share = 1.0 / core_oversubscription(4, 1, 2);
  train::MfuMeter m = train::MfuMeter::choose(0, false, "cpu", 80e9, 160e9, "1 core x 64 FLOP/cycle x 2.5 GHz", true, share,
                                              "4 ranks x 1 thread(s) share this node's 2 core(s)");
  EXPECT_EQ(m.kind(), train::PeakKind::Measured);
  EXPECT_DOUBLE_EQ(m.peak_per_rank(), 40e9);
  EXPECT_DOUBLE_EQ(m.measured_per_rank(), 40e9);
  EXPECT_DOUBLE_EQ(m.ceiling_per_rank(), 80e9);
  EXPECT_NE(m.label().find("80.0 GFLOP/s per rank alone, x 0.50 = 40.0 GFLOP/s per rank: 4 ranks x 1 thread(s) share"),
            std::string::npos)
      << m.label();
  // 4 ranks at 30 GFLOP/s each: 75 % of what 2 cores at 80 GFLOP/s can do (it read 37.5 %).
  EXPECT_NEAR(m.mfu(120e9, 4), 0.75, 1e-12);
  // A GPU, or a configured peak, is not scaled.
  EXPECT_DOUBLE_EQ(train::MfuMeter::choose(0, true, "NVIDIA H200", 800e12, 0, "", true, 0.5, "x").peak_per_rank(), 989e12);
  EXPECT_DOUBLE_EQ(train::MfuMeter::choose(50e9, false, "cpu", 0, 0, "", true, 0.5, "x").peak_per_rank(), 50e9);
}

// Audit I4: /proc/cpuinfo's "cpu MHz" is the clock now, not the boost clock: the figure computed from it (78.3
// GFLOP/s a core) was called the CPU's ceiling while a core measured 80-89. Not a bound: the larger of it and the
// measured rate, and no message calls it a ceiling.
TEST(MfuMeter, AnEstimateFromTheCurrentClockIsNoCeiling) {
  train::MfuMeter m = train::MfuMeter::choose(0, false, "cpu", 85e9, 78.3e9, "1 core x 32 FLOP/cycle x 2.45 GHz", false);
  EXPECT_FALSE(m.ceiling_bounds());
  EXPECT_DOUBLE_EQ(m.ceiling_per_rank(), 85e9);  // the measured rate, above the estimate
  ::testing::internal::CaptureStderr();
  EXPECT_DOUBLE_EQ(m.mfu(89e9, 1), 1.0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("ceiling"), std::string::npos) << err;
  EXPECT_NE(err.find("the step's own rate"), std::string::npos) << err;
  // An estimate above the measured rate is what a peak is raised to, named an estimate.
  train::MfuMeter high = train::MfuMeter::choose(0, false, "cpu", 60e9, 78.3e9, "1 core x 32 FLOP/cycle x 2.45 GHz", false);
  EXPECT_DOUBLE_EQ(high.ceiling_per_rank(), 78.3e9);
  ::testing::internal::CaptureStderr();
  EXPECT_NEAR(high.mfu(70e9, 1), 70.0 / 78.3, 1e-12);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("estimated rate (not a ceiling)"), std::string::npos) << said;
  // A computed bound below the measured rate is no ceiling either.
  EXPECT_FALSE(train::MfuMeter::choose(0, false, "cpu", 85e9, 78.3e9, "cpufreq", true).ceiling_bounds());
  EXPECT_TRUE(train::MfuMeter::choose(0, false, "cpu", 60e9, 78.3e9, "cpufreq", true).ceiling_bounds());
}
