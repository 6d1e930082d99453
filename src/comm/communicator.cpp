// The backend-independent half of every collective: argument checks, traffic counting, and the
// sequence number and watchdog guard of each call.
#include "shardtrain/comm/communicator.hpp"

#include "shardtrain/comm/watchdog.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* comm_backend_name(CommBackend b) { return b == CommBackend::Mpi ? "mpi" : "nccl"; }

const char* collective_kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Barrier: return "barrier";
  }
  return "?";
}

uint64_t TrafficCounters::total_bytes() const {
  uint64_t t = 0;
  for (const auto& b : bytes_) t += b.load(std::memory_order_relaxed);
  return t;
}

void TrafficCounters::reset() {
  for (auto& b : bytes_) b.store(0, std::memory_order_relaxed);
  for (auto& c : calls_) c.store(0, std::memory_order_relaxed);
}

void Communicator::check_reduce(DType dtype, ReduceOp op, const char* what) const {
  if (op == ReduceOp::Avg && !dtype_is_float(dtype)) {
    throw InternalError(fmt::format("{} on the {} axis: avg is defined for floating-point dtypes only, not {}", what,
                                    mesh_axis_name(axis_), dtype_name(dtype)));
  }
}

void Communicator::all_gather(const void* send, void* recv, size_t count, DType dtype, StreamRef stream) {
  const uint64_t bytes = count * size_ * dtype_size(dtype);
  traffic_.add(CollectiveKind::AllGather, bytes);
  const CollectiveCall call{CollectiveKind::AllGather, axis_, bytes, enter(), &world_ranks_};
  {
    CollectiveWatchdog::Guard guard(watchdog_, call);
    do_all_gather(send, recv, count, dtype, stream);
  }
  if (watchdog_) after_enqueue(call, stream);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream) {
  check_reduce(dtype, op, "reduce_scatter");
  const uint64_t bytes = count * size_ * dtype_size(dtype);
  traffic_.add(CollectiveKind::ReduceScatter, bytes);
  const CollectiveCall call{CollectiveKind::ReduceScatter, axis_, bytes, enter(), &world_ranks_};
  {
    CollectiveWatchdog::Guard guard(watchdog_, call);
    do_reduce_scatter(send, recv, count, dtype, op, stream);
  }
  if (watchdog_) after_enqueue(call, stream);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream) {
  check_reduce(dtype, op, "all_reduce");
  const uint64_t bytes = count * dtype_size(dtype);
  traffic_.add(CollectiveKind::AllReduce, bytes);
  const CollectiveCall call{CollectiveKind::AllReduce, axis_, bytes, enter(), &world_ranks_};
  {
    CollectiveWatchdog::Guard guard(watchdog_, call);
    do_all_reduce(send, recv, count, dtype, op, stream);
  }
  if (watchdog_) after_enqueue(call, stream);
}

void Communicator::broadcast(void* buffer, size_t count, DType dtype, int root, StreamRef stream) {
  if (root < 0 || root >= size_) {
    throw InternalError(
        fmt::format("broadcast on the {} axis: root {} outside [0, {})", mesh_axis_name(axis_), root, size_));
  }
  const uint64_t bytes = count * dtype_size(dtype);
  traffic_.add(CollectiveKind::Broadcast, bytes);
  const CollectiveCall call{CollectiveKind::Broadcast, axis_, bytes, enter(), &world_ranks_};
  {
    CollectiveWatchdog::Guard guard(watchdog_, call);
    do_broadcast(buffer, count, dtype, root, stream);
  }
  if (watchdog_) after_enqueue(call, stream);
}

void Communicator::host_all_gather(const void* send, void* recv, size_t count, DType dtype) {
  if (dtype == DType::BF16) throw InternalError("host_all_gather: bf16 host values are not supported");
  const uint64_t bytes = count * size_ * dtype_size(dtype);
  traffic_.add(CollectiveKind::AllGather, bytes);
  const CollectiveCall call{CollectiveKind::AllGather, axis_, bytes, enter(), &world_ranks_};
  CollectiveWatchdog::Guard guard(watchdog_, call);  // blocking: timed while it blocks
  do_host_all_gather(send, recv, count, dtype);
}
void Communicator::host_all_reduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  check_reduce(dtype, op, "host_all_reduce");
  if (dtype == DType::BF16) throw InternalError("host_all_reduce: bf16 host values are not supported");
  const uint64_t bytes = count * dtype_size(dtype);
  traffic_.add(CollectiveKind::AllReduce, bytes);
  const CollectiveCall call{CollectiveKind::AllReduce, axis_, bytes, enter(), &world_ranks_};
  CollectiveWatchdog::Guard guard(watchdog_, call);
  do_host_all_reduce(buf, count, dtype, op);
}
void Communicator::barrier() {
  traffic_.add(CollectiveKind::Barrier, 0);
  const CollectiveCall call{CollectiveKind::Barrier, axis_, 0, enter(), &world_ranks_};
  {
    CollectiveWatchdog::Guard guard(watchdog_, call);
    do_barrier();
  }
  if (watchdog_) after_enqueue(call, {});
}

}  // namespace shardtrain
