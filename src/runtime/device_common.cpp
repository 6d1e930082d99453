// Parts of device handling that are the same with and without CUDA.
#include <atomic>
#include <filesystem>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

DevicePreference parse_device_preference(std::string_view s) {
  if (s == "auto") return DevicePreference::Auto;
  if (s == "cpu") return DevicePreference::Cpu;
  if (s == "cuda" || s == "gpu") return DevicePreference::Cuda;
  throw UsageError(fmt::format("--device: unknown device '{}' (expected auto, cpu or cuda)", s));
}

std::string Device::describe() const {
  if (!is_cuda()) return "cpu";
  return fmt::format("cuda:{} ({}, {:.1f} GiB{})", index, name, static_cast<double>(memory_bytes) / (1ull << 30),
                     ranks_sharing > 1 ? fmt::format(", shared by {} ranks", ranks_sharing) : std::string());
}

std::string gpus_present_but_unreachable(const std::string& gpus_dir, const char* cuda_visible_devices) {
  if (cuda_visible_devices != nullptr) {
    const std::string_view v(cuda_visible_devices);
    // Hidden on purpose: an empty list, a negative ordinal, or Slurm's value for a job with no GPU.
    if (v.empty() || v.front() == '-' || v == "NoDevFiles") return "";
  }
  std::error_code ec;
  size_t gpus = 0;
  for (auto it = std::filesystem::directory_iterator(gpus_dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++gpus;
  }
  if (gpus == 0) return "";
  return fmt::format("the NVIDIA driver lists {} GPU{} ({}){}", gpus, gpus == 1 ? "" : "s", gpus_dir,
                     cuda_visible_devices ? fmt::format(" and CUDA_VISIBLE_DEVICES=\"{}\"", cuda_visible_devices)
                                          : std::string());
}

namespace {
std::atomic<size_t> g_device_in_use{0}, g_device_peak{0};
}  // namespace

namespace detail {
void note_device_alloc(size_t bytes) {
  const size_t now = g_device_in_use.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t peak = g_device_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_device_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void note_device_free(size_t bytes) { g_device_in_use.fetch_sub(bytes, std::memory_order_relaxed); }
}  // namespace detail

DeviceMemoryStats device_memory_stats() {
  return {g_device_in_use.load(std::memory_order_relaxed), g_device_peak.load(std::memory_order_relaxed)};
}
void reset_device_memory_peak() { g_device_peak.store(g_device_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace shardtrain
