// One Communicator interface over a mesh axis, with MPI (host memory, or device memory staged
// through pinned host buffers) and NCCL (device memory) backends. Every collective counts its
// bytes per kind; the FSDP tests assert traffic from these counters.
//
// Byte conventions (what the counters add, in elements of the call's dtype):
//   all_gather     the gathered output:      count_per_rank * size() elements
//   reduce_scatter the reduced input:        count_per_rank * size() elements
//   all_reduce     the buffer:               count elements
//   broadcast      the buffer:               count elements
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain {

enum class ReduceOp { Sum, Avg, Max };
enum class CommBackend { Mpi, Nccl };
enum class CollectiveKind : int { AllGather = 0, ReduceScatter, AllReduce, Broadcast, Barrier };
inline constexpr int kCollectiveKinds = 5;

const char* reduce_op_name(ReduceOp op);
const char* comm_backend_name(CommBackend b);
const char* collective_kind_name(CollectiveKind k);

// Thread-safe counters of one communicator.
class TrafficCounters {
 public:
  void add(CollectiveKind k, uint64_t bytes) {
    bytes_[static_cast<int>(k)].fetch_add(bytes, std::memory_order_relaxed);
    calls_[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t bytes(CollectiveKind k) const { return bytes_[static_cast<int>(k)].load(std::memory_order_relaxed); }
  uint64_t calls(CollectiveKind k) const { return calls_[static_cast<int>(k)].load(std::memory_order_relaxed); }
  uint64_t total_bytes() const;
  void reset();

 private:
  std::array<std::atomic<uint64_t>, kCollectiveKinds> bytes_{};
  std::array<std::atomic<uint64_t>, kCollectiveKinds> calls_{};
};

class CollectiveWatchdog;
struct CollectiveCall;

class Communicator {
 public:
  Communicator(MeshAxis axis, int rank, int size, MemorySpace space)
      : axis_(axis), rank_(rank), size_(size), space_(space) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  MeshAxis axis() const { return axis_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  MemorySpace space() const { return space_; }  // where the buffers passed to collectives live
  virtual CommBackend backend() const = 0;

  // recv holds count_per_rank * size() elements; rank r's contribution lands at offset r * count_per_rank.
  // In place when send == recv + rank() * count_per_rank (bytes).
  void all_gather(const void* send, void* recv, size_t count_per_rank, DType dtype, StreamRef stream = {});
  // send holds count_per_rank * size() elements; recv gets this rank's reduced block.
  // In place when recv == send + rank() * count_per_rank; the rest of send is then unspecified.
  void reduce_scatter(const void* send, void* recv, size_t count_per_rank, DType dtype, ReduceOp op, StreamRef stream = {});
  // In place when send == recv.
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream = {});
  void broadcast(void* buffer, size_t count, DType dtype, int root, StreamRef stream = {});
  void barrier();

  // Host memory, whatever space() is, blocking: the host's own values (a step's token count and loss,
  // agreement checks). A device-space backend takes them over MPI on the same group, never through the
  // device (NCCL cannot read pageable host memory). Counted and watched like the others. Not bf16.
  void host_all_gather(const void* send, void* recv, size_t count_per_rank, DType dtype);
  void host_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op);
  // Typed conveniences for host values.
  template <typename T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    host_all_gather(send.data(), recv.data(), send.size(), dtype_of_v<T>);
  }
  template <typename T>
  void all_reduce(std::span<T> buf, ReduceOp op) {
    host_all_reduce(buf.data(), buf.size(), dtype_of_v<T>, op);
  }

  const TrafficCounters& traffic() const { return traffic_; }
  TrafficCounters& traffic() { return traffic_; }
  // Times every collective from now on (not owned; nullptr: none). Host-blocking ones are timed while
  // they block; a backend whose collectives are asynchronous on a device stream (NCCL) hands each one to
  // the watchdog after enqueueing it (after_enqueue) and its asynchronous errors too.
  virtual void set_watchdog(CollectiveWatchdog* w) { watchdog_ = w; }
  // Collectives entered so far (each call counts on entry, before it can block): every rank of the
  // axis group calls the same collectives in the same order, so a rank whose count is lower than a
  // peer's never arrived at the peer's collective. The hang watchdog compares these counts.
  uint64_t entered() const { return entered_.load(std::memory_order_relaxed); }
  // World ranks (MPI_COMM_WORLD) of this axis group, in axis-rank order; empty when not set.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  void set_world_ranks(std::vector<int> ranks) { world_ranks_ = std::move(ranks); }

 protected:
  virtual void do_all_gather(const void* send, void* recv, size_t count, DType dtype, StreamRef stream) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream) = 0;
  virtual void do_all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream) = 0;
  virtual void do_broadcast(void* buffer, size_t count, DType dtype, int root, StreamRef stream) = 0;
  virtual void do_barrier() = 0;
  // Host buffers; the default suits a host-space backend (the ordinary collective, no stream).
  virtual void do_host_all_gather(const void* send, void* recv, size_t count, DType dtype) {
    do_all_gather(send, recv, count, dtype, {});
  }
  virtual void do_host_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
    do_all_reduce(buf, buf, count, dtype, op, {});
  }
  // Called after each collective was issued, when a watchdog is set; `call` describes it.
  virtual void after_enqueue(const CollectiveCall& call, StreamRef stream) {}
  CollectiveWatchdog* watchdog() const { return watchdog_; }

 private:
  void check_reduce(DType dtype, ReduceOp op, const char* what) const;
  uint64_t enter() { return entered_.fetch_add(1, std::memory_order_relaxed) + 1; }
  MeshAxis axis_;
  int rank_;
  int size_;
  MemorySpace space_;
  TrafficCounters traffic_;
  CollectiveWatchdog* watchdog_ = nullptr;
  std::atomic<uint64_t> entered_{0};
  std::vector<int> world_ranks_;
};

}  // namespace shardtrain
