// Bytes resident per category, current and peak: what the FSDP engine allocates is recorded here, so
// tests, metrics and `shardtrain plan` read the same numbers. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace shardtrain {

enum class MemoryCategory : int {
  ShardedParams = 0,  // fp32 master shards
  ShardedGrads,       // fp32 gradient shards
  OptimizerStates,    // AdamW exp_avg and exp_avg_sq
  UnshardedParams,    // gathered param_dtype buffers (the unshard pool, root included)
  UnshardedGrads,     // full-size gradient buffers before reduce-scatter
  CommBuffers,        // staging and reduce_dtype buffers
  Activations,        // the model's activation arena
};
inline constexpr int kMemoryCategories = 7;
const char* memory_category_name(MemoryCategory c);

class MemoryLedger {
 public:
  void add(MemoryCategory c, int64_t bytes);
  void release(MemoryCategory c, int64_t bytes) { add(c, -bytes); }
  int64_t current(MemoryCategory c) const { return current_[idx(c)].load(std::memory_order_relaxed); }
  int64_t peak(MemoryCategory c) const { return peak_[idx(c)].load(std::memory_order_relaxed); }
  int64_t current_total() const { return total_.load(std::memory_order_relaxed); }
  int64_t peak_total() const { return peak_total_.load(std::memory_order_relaxed); }
  void reset_peaks();  // peaks := current values

 private:
  static int idx(MemoryCategory c) { return static_cast<int>(c); }
  static void raise(std::atomic<int64_t>& peak, int64_t value);
  std::array<std::atomic<int64_t>, kMemoryCategories> current_{};
  std::array<std::atomic<int64_t>, kMemoryCategories> peak_{};
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_total_{0};
};

}  // namespace shardtrain
