// Parts of device handling that are the same with and without CUDA.
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

}  // namespace shardtrain
