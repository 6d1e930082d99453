// Parts of device handling that are the same with and without CUDA.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

DevicePreference parse_device_preference(std::string_view s) {
  if (s == "auto") return DevicePreference::Auto;
  if (s == "cpu") return DevicePreference::Cpu;
  if (s == "cuda") return DevicePreference::Cuda;  // one spelling, as --help and the docs give it ("gpu" was taken unsaid)
  throw UsageError(fmt::format("--device: unknown device '{}' (expected auto, cpu or cuda)", s));
}

std::string Device::describe() const {
  if (!is_cuda()) return "cpu";
  return fmt::format("cuda:{} ({}, {:.1f} GiB{})", index, name, static_cast<double>(memory_bytes) / (1ull << 30),
                     ranks_sharing > 1 ? fmt::format(", shared by {} ranks", ranks_sharing) : std::string());
}

std::vector<int> ranks_on_gpu(const std::vector<GpuSeat>& seats, const std::string& uuid) {
  std::vector<int> out;
  if (uuid.empty()) return out;
  for (const GpuSeat& s : seats)
    if (s.uuid == uuid) out.push_back(s.world_rank);
  std::sort(out.begin(), out.end());
  return out;
}

std::string describe_ranks(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

void find_ranks_sharing(Device& d, int world_rank, MPI_Comm machine) {
  struct Row {  // plain bytes: one per rank of the machine
    int world_rank;
    std::array<char, 64> uuid;
  };
  Row mine{};
  mine.world_rank = world_rank;
  std::snprintf(mine.uuid.data(), mine.uuid.size(), "%s", d.uuid.c_str());
  int n = 0;
  ST_CHECK_MPI(MPI_Comm_size(machine, &n));
  std::vector<Row> rows(static_cast<size_t>(n));
  ST_CHECK_MPI(MPI_Allgather(&mine, sizeof(Row), MPI_BYTE, rows.data(), sizeof(Row), MPI_BYTE, machine));
  std::vector<GpuSeat> seats;
  for (const Row& r : rows) seats.push_back({r.world_rank, r.uuid.data()});
  d.sharing_ranks = ranks_on_gpu(seats, d.uuid);
  d.ranks_sharing = std::max<int>(1, static_cast<int>(d.sharing_ranks.size()));
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
  return fmt::format(
      "the NVIDIA driver lists {} GPU{} ({}){}", gpus, gpus == 1 ? "" : "s", gpus_dir,
      cuda_visible_devices ? fmt::format(" and CUDA_VISIBLE_DEVICES=\"{}\"", cuda_visible_devices) : std::string());
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
// Both backends' buffers move alike; each backend has its own allocation and release().
DeviceBuffer::~DeviceBuffer() { release(); }
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void reset_device_memory_peak() {
  g_device_peak.store(g_device_in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace shardtrain
