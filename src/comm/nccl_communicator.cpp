// NCCL backend: device buffers, asynchronous on the caller's stream. The communicator is created
// from an ncclUniqueId that rank 0 of the axis broadcasts over the axis's MPI communicator.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "mpi_host.hpp"
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/comm/watchdog.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U32: return ncclUint32;
    case DType::U8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

cudaStream_t cuda(StreamRef s) { return static_cast<cudaStream_t>(s.handle); }

// CUDA events for the watchdog, created once and reused: one is recorded after each collective and
// handed back when the watchdog has seen it finish. Shared with the watchdog's entries, which may outlive
// the communicator by a tick.
class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  std::shared_ptr<CUevent_st> acquire() {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (!e) ST_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    auto self = shared_from_this();
    return std::shared_ptr<CUevent_st>(e, [self](cudaEvent_t ev) {
      std::lock_guard<std::mutex> lock(self->mutex_);
      self->free_.push_back(ev);
    });
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiComm mpi, MeshAxis axis)
      : Communicator(axis, mpi.rank(), mpi.size(), MemorySpace::Device), mpi_(std::move(mpi)) {
    ncclUniqueId id{};
    if (rank() == 0) ST_CHECK_NCCL(ncclGetUniqueId(&id));
    ST_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_.get()));
    ST_CHECK_NCCL(ncclCommInitRank(&comm_, size(), id, rank()));
  }
  ~NcclCommunicator() override {
    if (watchdog() && error_source_ >= 0) watchdog()->remove_error_source(error_source_);
    if (comm_) ncclCommDestroy(comm_);
  }
  CommBackend backend() const override { return CommBackend::Nccl; }

  // NCCL reports network failures and peer aborts asynchronously: the watchdog polls them every tick.
  void set_watchdog(CollectiveWatchdog* w) override {
    if (watchdog() && error_source_ >= 0) watchdog()->remove_error_source(error_source_);
    error_source_ = -1;
    Communicator::set_watchdog(w);
    if (!w || !w->enabled()) return;
    ncclComm_t comm = comm_;
    const MeshAxis axis = this->axis();
    error_source_ = w->add_error_source(
        [comm, axis]() -> std::string {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return {};
          if (state == ncclSuccess || state == ncclInProgress) return {};
          return fmt::format("NCCL asynchronous error on the {} axis: {}", mesh_axis_name(axis), ncclGetErrorString(state));
        },
        [comm] { ncclCommAbort(comm); });
  }

 protected:
  void do_all_gather(const void* send, void* recv, size_t count, DType t, StreamRef s) override {
    ST_CHECK_NCCL(ncclAllGather(send, recv, count, nccl_type(t), comm_, cuda(s)));
  }
  void do_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op, StreamRef s) override {
    ST_CHECK_NCCL(ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), comm_, cuda(s)));
  }
  void do_all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, StreamRef s) override {
    ST_CHECK_NCCL(ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, cuda(s)));
  }
  void do_broadcast(void* buffer, size_t count, DType t, int root, StreamRef s) override {
    ST_CHECK_NCCL(ncclBroadcast(buffer, buffer, count, nccl_type(t), root, comm_, cuda(s)));
  }
  // Host values over the group's MPI communicator: NCCL reads device memory only.
  void do_host_all_gather(const void* send, void* recv, size_t count, DType t) override {
    detail::mpi_host_all_gather(mpi_.get(), send, recv, count, t, axis());
  }
  void do_host_all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    detail::mpi_host_all_reduce(mpi_.get(), buf, count, t, op, axis());
  }
  void do_barrier() override {
    ST_CHECK_CUDA(cudaDeviceSynchronize());
    ST_CHECK_MPI(MPI_Barrier(mpi_.get()));
  }

  // The collective is queued on `stream` and the call has returned: an event recorded behind it tells the
  // watchdog when it finished on the device. (A barrier blocked the host; its guard timed it.)
  void after_enqueue(const CollectiveCall& call, StreamRef stream) override {
    if (call.kind == CollectiveKind::Barrier || !watchdog()->enabled()) return;
    std::shared_ptr<CUevent_st> event = events_->acquire();
    ST_CHECK_CUDA(cudaEventRecord(event.get(), cuda(stream)));
    ncclComm_t comm = comm_;
    watchdog()->watch_async(
        call, [event] { return cudaEventQuery(event.get()) != cudaErrorNotReady; }, [comm] { ncclCommAbort(comm); });
  }

 private:
  MpiComm mpi_;
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();
  int error_source_ = -1;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MeshAxis axis) {
  return std::make_unique<NcclCommunicator>(MpiComm::duplicate(comm), axis);
}

}  // namespace shardtrain
