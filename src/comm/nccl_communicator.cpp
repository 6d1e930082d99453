// NCCL backend: device buffers, asynchronous on the caller's stream. The communicator is created
// from an ncclUniqueId that rank 0 of the axis broadcasts over the axis's MPI communicator.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>

#include "shardtrain/comm/mesh_comms.hpp"
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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiComm mpi, MeshAxis axis) : Communicator(axis, mpi.rank(), mpi.size(), MemorySpace::Device), mpi_(std::move(mpi)) {
    ncclUniqueId id{};
    if (rank() == 0) ST_CHECK_NCCL(ncclGetUniqueId(&id));
    ST_CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_.get()));
    ST_CHECK_NCCL(ncclCommInitRank(&comm_, size(), id, rank()));
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  CommBackend backend() const override { return CommBackend::Nccl; }

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
  void do_barrier() override {
    ST_CHECK_CUDA(cudaDeviceSynchronize());
    ST_CHECK_MPI(MPI_Barrier(mpi_.get()));
  }

 private:
  MpiComm mpi_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MeshAxis axis) {
  return std::make_unique<NcclCommunicator>(MpiComm::duplicate(comm), axis);
}

}  // namespace shardtrain
