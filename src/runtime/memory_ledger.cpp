// Memory accounting by category.
#include "shardtrain/runtime/memory_ledger.hpp"

namespace shardtrain {

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::ShardedParams: return "sharded_params";
    case MemoryCategory::ShardedGrads: return "sharded_grads";
    case MemoryCategory::OptimizerStates: return "optimizer_states";
    case MemoryCategory::UnshardedParams: return "unsharded_params";
    case MemoryCategory::UnshardedGrads: return "unsharded_grads";
    case MemoryCategory::CommBuffers: return "comm_buffers";
    case MemoryCategory::Activations: return "activations";
  }
  return "?";
}

void MemoryLedger::raise(std::atomic<int64_t>& peak, int64_t value) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (value > p && !peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) {
  }
}

void MemoryLedger::add(MemoryCategory c, int64_t bytes) {
  const int64_t now = current_[idx(c)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const int64_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise(peak_[idx(c)], now);
  raise(peak_total_, total);
}

void MemoryLedger::reset_peaks() {
  for (int i = 0; i < kMemoryCategories; ++i) peak_[i].store(current_[i].load());
  peak_total_.store(total_.load());
}

}  // namespace shardtrain
