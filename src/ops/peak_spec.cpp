// Datasheet peaks of GPUs and the fp32 ceiling of this CPU (peak_spec.hpp).
#include "shardtrain/ops/peak_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace shardtrain::ops {
namespace {

struct Entry {
  std::string_view name_part;  // matched as a substring of the runtime's device name
  std::string_view part;
  double tflops;  // dense bf16, fp32 accumulation; 0: no datasheet figure (the name is listed so a shorter
                  // entry does not claim it: "A10G" is not an A10)
};

// Vendor datasheets (dense, i.e. half the "with sparsity" figure). Order matters: the first entry whose name
// part occurs in the device's name wins, so the specific names come first ("A10G" before "A10").
constexpr Entry kTable[] = {
    {"H100 PCIe", "H100 PCIe", 756},
    {"H100 NVL", "H100 NVL", 835},
    {"H100", "H100 SXM", 989},
    {"H800", "H800 SXM", 989},
    {"H200 NVL", "H200 NVL", 835},
    {"GH200", "GH200", 989},
    {"H200", "H200 SXM", 989},
    {"H20", "H20", 148},
    {"B200", "B200", 2250},
    {"GB200", "GB200", 2500},
    {"A100", "A100", 312},
    {"A800", "A800", 312},
    {"A30", "A30", 165},
    {"A10G", "A10G", 0},
    {"A10", "A10", 125},
    {"L40S", "L40S", 362},
    {"L40", "L40", 181},
    {"L4", "L4", 121},
};

double read_double(const char* path) {
  std::ifstream f(path);
  double v = 0;
  return (f >> v) ? v : 0.0;
}

// The highest clock the kernel reports, in Hz: cpufreq's maximum (kHz), else /proc/cpuinfo's largest "cpu MHz".
double max_clock_hz(std::string& source) {
  if (const double khz = read_double("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); khz > 0) {
    source = "cpufreq maximum";
    return khz * 1e3;
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  double mhz = 0;
  while (std::getline(f, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    try {
      mhz = std::max(mhz, std::stod(line.substr(colon + 1)));
    } catch (const std::exception&) {
    }
  }
  source = "/proc/cpuinfo";
  return mhz * 1e6;
}

}  // namespace

SpecPeak gpu_spec_peak(std::string_view device_name) {
  for (const Entry& e : kTable) {
    // "H20" must not match "H200": a match must not be followed by a digit.
    for (size_t at = device_name.find(e.name_part); at != std::string_view::npos;
         at = device_name.find(e.name_part, at + 1)) {
      const size_t end = at + e.name_part.size();
      if (end < device_name.size() && device_name[end] >= '0' && device_name[end] <= '9') continue;
      if (e.tflops <= 0) return {};
      return SpecPeak{e.tflops * 1e12, std::string(e.part)};
    }
  }
  return {};
}

CpuCeiling cpu_fp32_ceiling(int threads) {
  std::string clock_source;
  const double hz = max_clock_hz(clock_source);
  if (hz <= 0 || threads <= 0) return {};
  int lanes = 4;
  const char* isa = "SSE";
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) lanes = 16, isa = "AVX-512";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) lanes = 8, isa = "AVX2+FMA";
#endif
  const double per_cycle = 2.0 /* FMA pipes */ * lanes * 2.0 /* multiply + add */;
  return CpuCeiling{threads * per_cycle * hz,
                    fmt::format("{} core(s) x {:.0f} FLOP/cycle ({}, 2 FMA pipes) x {:.2f} GHz ({})", threads, per_cycle,
                                isa, hz * 1e-9, clock_source)};
}

}  // namespace shardtrain::ops
