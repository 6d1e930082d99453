// Datasheet peaks of GPUs and the fp32 ceiling of this CPU (peak_spec.hpp).
#include "shardtrain/ops/peak_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace shardtrain::ops {
namespace {

struct Entry {
  std::string_view name_part;  // matched as a whole model name inside the runtime's device name (gpu_spec_peak)
  std::string_view part;
  double tflops;  // dense bf16, fp32 accumulation; 0: no datasheet figure (the name is listed so a shorter
                  // entry does not claim it: "A10G" is not an A10)
};

// Vendor datasheets (dense, i.e. half the "with sparsity" figure). Order does not matter: of the entries whose
// name part occurs in the device's name as a whole model name, the longest wins ("H800 PCIe" over "H800",
// "A10G" over "A10"), and a name part must not continue a longer model name ("B200" is not found in "GB200",
// nor "H200" in "GH200"; the first-match-in-order rule this replaces read a GB200 as a B200, 2250, and an H800
// PCIe as an H800 SXM, 989: audit I2).
constexpr Entry kTable[] = {
    {"H100 PCIe", "H100 PCIe", 756},
    {"H100 NVL", "H100 NVL", 835},
    {"H100", "H100 SXM", 989},
    {"H800 PCIe", "H800 PCIe", 756},
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

// The highest clock the kernel reports, in Hz: cpufreq's maximum (kHz; `bound` true), else /proc/cpuinfo's
// largest "cpu MHz", which is the clock now and may be below the boost clock (`bound` false).
double max_clock_hz(std::string& source, bool& bound) {
  bound = false;
  if (const double khz = read_double("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); khz > 0) {
    source = "cpufreq maximum";
    bound = true;
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
  source = "/proc/cpuinfo's current clock, not a maximum: an estimate, not a ceiling";
  return mhz * 1e6;
}

// Whether `part` occurs in `name` as a model name: not preceded by a letter or digit ("B200" is not in "GB200")
// and not followed by a digit ("H20" is not in "H200"; a letter may follow: "A100-SXM4", "L40S" has its own row).
bool names_model(std::string_view name, std::string_view part) {
  const auto alnum = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  for (size_t at = name.find(part); at != std::string_view::npos; at = name.find(part, at + 1)) {
    const size_t end = at + part.size();
    if (at > 0 && alnum(name[at - 1])) continue;
    if (end < name.size() && name[end] >= '0' && name[end] <= '9') continue;
    return true;
  }
  return false;
}

}  // namespace

SpecPeak gpu_spec_peak(std::string_view device_name) {
  const Entry* best = nullptr;
  for (const Entry& e : kTable)
    if (names_model(device_name, e.name_part) && (!best || e.name_part.size() > best->name_part.size())) best = &e;
  if (!best || best->tflops <= 0) return {};
  return SpecPeak{best->tflops * 1e12, std::string(best->part)};
}

CpuCeiling cpu_fp32_ceiling(int threads) {
  std::string clock_source;
  bool bound = false;
  const double hz = max_clock_hz(clock_source, bound);
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
                                isa, hz * 1e-9, clock_source),
                    bound};
}

}  // namespace shardtrain::ops
