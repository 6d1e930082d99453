// The ceilings MFU is reported against (docs/training.md, "MFU"): a GPU's dense bf16 tensor-core peak from
// its vendor's datasheet, found by the name the CUDA runtime reports, and an upper bound on a CPU's fp32
// rate from its SIMD width and clock. Both are plain lookups: nothing here runs a kernel.
#pragma once

#include <string>
#include <string_view>

namespace shardtrain::ops {

// A datasheet figure: dense (no structured sparsity) bf16 FLOP/s with fp32 accumulation.
struct SpecPeak {
  double flops_per_s = 0;  // 0: the table does not know the device
  std::string part;        // the part the figure belongs to, e.g. "H100 SXM"
};

// By cudaDeviceProp::name ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB",
// ...). A table entry matches as a whole model name (not inside a longer one: "B200" is not a GB200's), and of
// several the longest wins ("H100 PCIe" over "H100", "H800 PCIe" over "H800").
SpecPeak gpu_spec_peak(std::string_view device_name);

// An upper bound on `threads` cores' fp32 rate: threads x 2 FMA pipes x SIMD lanes (16 with AVX-512, 8 with AVX2
// and FMA, 4 otherwise) x 2 FLOP x the highest clock the kernel reports (cpufreq's cpuinfo_max_freq, else the
// largest "cpu MHz" of /proc/cpuinfo). Two FMA pipes is the most any x86 core has, so with cpufreq's maximum the
// figure bounds the rate from above. /proc/cpuinfo's "cpu MHz" is the clock now, not the boost clock: the figure is
// then an estimate, and `bound` is false (on a 2.45 GHz VM it gave 78.3 GFLOP/s a core, where a core measured
// 80-89). 0 when no clock can be read.
struct CpuCeiling {
  double flops_per_s = 0;
  std::string how;     // "2 cores x 64 FLOP/cycle (AVX-512, 2 FMA pipes) x 2.45 GHz (cpufreq maximum)"
  bool bound = false;  // the clock is the kernel's maximum: the figure bounds the rate from above
};
CpuCeiling cpu_fp32_ceiling(int threads);

}  // namespace shardtrain::ops
