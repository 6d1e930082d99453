// Flat buffers of the FSDP engine: in the compute device's memory (host memory on the CPU backend)
// or in pinned host memory (CPU offload), each recorded in the memory ledger while it lives; and the
// pool that recycles unshard buffers so gathered units cost (1 + prefetch) buffers, not one per unit.
#pragma once

#include <cstddef>
#include <vector>

#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/ops/tensor.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/memory_ledger.hpp"

namespace shardtrain::fsdp {

enum class Placement { Compute, PinnedHost };

class FlatBuffer {
 public:
  FlatBuffer() = default;
  FlatBuffer(DeviceKind device, Placement placement, size_t bytes, MemoryLedger* ledger, MemoryCategory category);
  ~FlatBuffer();
  FlatBuffer(FlatBuffer&& o) noexcept;
  FlatBuffer& operator=(FlatBuffer&& o) noexcept;
  FlatBuffer(const FlatBuffer&) = delete;
  FlatBuffer& operator=(const FlatBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Where the memory is, as ops see it: the compute device, or the CPU for pinned host memory.
  DeviceKind device() const { return placement_ == Placement::PinnedHost ? DeviceKind::Cpu : device_; }
  ops::Tensor view(DType dtype, int64_t offset_elements, ops::Shape shape) const;
  explicit operator bool() const { return data_ != nullptr; }

 private:
  void release();
  DeviceKind device_ = DeviceKind::Cpu;
  Placement placement_ = Placement::Compute;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryLedger* ledger_ = nullptr;
  MemoryCategory category_ = MemoryCategory::UnshardedParams;
  ops::HostBuffer host_;
  PinnedBuffer pinned_;
  DeviceBuffer device_buffer_;

 public:
  // Recorded on the last stream that reads the buffer before it goes back to a pool; whoever takes it
  // next makes its stream wait for it (the overlapped GPU schedule; a no-op on the CPU).
  CudaEvent fence;
};

// Recycles buffers: acquire() returns the smallest free buffer that fits, or allocates one.
class FlatPool {
 public:
  FlatPool(DeviceKind device, MemoryLedger* ledger, MemoryCategory category)
      : device_(device), ledger_(ledger), category_(category) {}
  FlatBuffer acquire(size_t bytes);
  void release(FlatBuffer buffer);
  int outstanding() const { return outstanding_; }
  void clear() { free_.clear(); }

 private:
  DeviceKind device_;
  MemoryLedger* ledger_;
  MemoryCategory category_;
  std::vector<FlatBuffer> free_;
  int outstanding_ = 0;
};

}  // namespace shardtrain::fsdp
