// MPI backend. Host buffers go straight to MPI; device buffers are staged through pinned host
// memory, so several ranks can share one GPU. bf16 reductions use our own MPI_Op (fp32 arithmetic,
// round-to-nearest-even), since MPI has no bf16 type.
#include <mpi.h>

#include <climits>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "mpi_host.hpp"
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {
namespace {

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (static_cast<float>(a[i]) > static_cast<float>(b[i])) b[i] = a[i];
  }
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;  // moved as 16-bit words; reduced by the ops above
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U32: return MPI_UINT32_T;
    case DType::U8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

void divide_in_place(void* p, size_t n, DType t, int divisor) {
  switch (t) {
    case DType::F32: {
      auto* x = static_cast<float*>(p);
      for (size_t i = 0; i < n; ++i) x[i] /= static_cast<float>(divisor);
      break;
    }
    case DType::F64: {
      auto* x = static_cast<double*>(p);
      for (size_t i = 0; i < n; ++i) x[i] /= divisor;
      break;
    }
    case DType::BF16: {
      auto* x = static_cast<bf16*>(p);
      for (size_t i = 0; i < n; ++i) x[i] = bf16(static_cast<float>(x[i]) / static_cast<float>(divisor));
      break;
    }
    default: break;  // Avg on integers is rejected before reaching a backend
  }
}

// MPI's own reduction for every dtype but bf16 (Avg: a sum, divided afterwards).
MPI_Op builtin_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

int mpi_count(size_t n, MeshAxis axis) {
  if (n > static_cast<size_t>(INT_MAX)) {
    throw Error(ExitCode::Comm, fmt::format("collective of {} elements per rank on the {} axis exceeds MPI's int count "
                                            "limit; use smaller units (wrap policy) or the NCCL backend",
                                            n, mesh_axis_name(axis)));
  }
  return static_cast<int>(n);
}

}  // namespace

namespace detail {

void mpi_host_all_gather(MPI_Comm comm, const void* send, void* recv, size_t count, DType t, MeshAxis axis) {
  ST_CHECK_MPI(MPI_Allgather(send, mpi_count(count, axis), mpi_type(t), recv, mpi_count(count, axis), mpi_type(t), comm));
}

void mpi_host_all_reduce(MPI_Comm comm, void* buf, size_t count, DType t, ReduceOp op, MeshAxis axis) {
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count, axis), mpi_type(t), builtin_op(op), comm));
  if (op == ReduceOp::Avg) {
    int size = 1;
    ST_CHECK_MPI(MPI_Comm_size(comm, &size));
    divide_in_place(buf, count, t, size);
  }
}

}  // namespace detail

namespace {

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MpiComm comm, MeshAxis axis, MemorySpace space)
      : Communicator(axis, comm.rank(), comm.size(), space), comm_(std::move(comm)) {
    ST_CHECK_MPI(MPI_Op_create(&bf16_sum, 1, &bf16_sum_op_));
    ST_CHECK_MPI(MPI_Op_create(&bf16_max, 1, &bf16_max_op_));
  }
  ~MpiCommunicator() override {
    if (MpiSession::active()) {
      MPI_Op_free(&bf16_sum_op_);
      MPI_Op_free(&bf16_max_op_);
    }
  }
  CommBackend backend() const override { return CommBackend::Mpi; }

 protected:
  void do_all_gather(const void* send, void* recv, size_t count, DType t, StreamRef stream) override {
    const size_t esz = dtype_size(t);
    const size_t total = count * size() * esz;
    const bool in_place = send == static_cast<const char*>(recv) + rank() * count * esz;
    Staged s(*this, recv, total, stream);
    if (space() == MemorySpace::Device) {
      if (in_place) {
        s.fetch(rank() * count * esz, count * esz);
      } else {
        copy_async(s.host + rank() * count * esz, send, count * esz, stream);
        stream_synchronize(stream);
      }
    }
    const void* host_send = in_place || space() == MemorySpace::Device ? MPI_IN_PLACE : send;
    ST_CHECK_MPI(MPI_Allgather(host_send, host_send == MPI_IN_PLACE ? 0 : mpi_count(count, axis()),
                               host_send == MPI_IN_PLACE ? MPI_DATATYPE_NULL : mpi_type(t), s.host, mpi_count(count, axis()),
                               mpi_type(t), comm_.get()));
    s.publish(0, total);
  }

  void do_reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op, StreamRef stream) override {
    const size_t esz = dtype_size(t);
    const size_t block = count * esz;
    const bool in_place = recv == static_cast<const char*>(send) + rank() * block;
    if (space() == MemorySpace::Host && !in_place) {
      ST_CHECK_MPI(MPI_Reduce_scatter_block(send, recv, mpi_count(count, axis()), mpi_type(t), mpi_op(t, op), comm_.get()));
    } else {
      // MPI_IN_PLACE leaves the result at the start of the buffer; move it to this rank's block.
      std::lock_guard<std::mutex> lock(staging_mutex_);
      char* host = nullptr;
      if (space() == MemorySpace::Device) {
        host = staging(block * size());
        copy_async(host, send, block * size(), stream);
        stream_synchronize(stream);
      } else {
        host = static_cast<char*>(const_cast<void*>(send));
      }
      ST_CHECK_MPI(
          MPI_Reduce_scatter_block(MPI_IN_PLACE, host, mpi_count(count, axis()), mpi_type(t), mpi_op(t, op), comm_.get()));
      if (op == ReduceOp::Avg) divide_in_place(host, count, t, size());
      if (space() == MemorySpace::Device) {
        copy_async(recv, host, block, stream);
        stream_synchronize(stream);
      } else {
        std::memmove(recv, host, block);
      }
      return;
    }
    if (op == ReduceOp::Avg) divide_in_place(recv, count, t, size());
  }

  void do_all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op, StreamRef stream) override {
    const size_t bytes = count * dtype_size(t);
    Staged s(*this, recv, bytes, stream);
    if (space() == MemorySpace::Device) {
      copy_async(s.host, send, bytes, stream);
      stream_synchronize(stream);
    }
    const void* host_send = (space() == MemorySpace::Device || send == recv) ? MPI_IN_PLACE : send;
    ST_CHECK_MPI(MPI_Allreduce(host_send, s.host, mpi_count(count, axis()), mpi_type(t), mpi_op(t, op), comm_.get()));
    if (op == ReduceOp::Avg) divide_in_place(s.host, count, t, size());
    s.publish(0, bytes);
  }

  void do_broadcast(void* buffer, size_t count, DType t, int root, StreamRef stream) override {
    const size_t bytes = count * dtype_size(t);
    Staged s(*this, buffer, bytes, stream);
    if (space() == MemorySpace::Device && rank() == root) s.fetch(0, bytes);
    ST_CHECK_MPI(MPI_Bcast(s.host, mpi_count(count, axis()), mpi_type(t), root, comm_.get()));
    s.publish(0, bytes);
  }

  void do_barrier() override { ST_CHECK_MPI(MPI_Barrier(comm_.get())); }
  // Host values go straight to MPI, also when the communicator stages device buffers.
  void do_host_all_gather(const void* send, void* recv, size_t count, DType t) override {
    detail::mpi_host_all_gather(comm_.get(), send, recv, count, t, axis());
  }
  void do_host_all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    detail::mpi_host_all_reduce(comm_.get(), buf, count, t, op, axis());
  }

 private:
  // The host view of a caller's buffer: the buffer itself in host space, a pinned staging copy in
  // device space (fetch = device to host, publish = host to device, both completed before return).
  struct Staged {
    Staged(MpiCommunicator& c, void* user, size_t bytes, StreamRef s) : comm(c), user(static_cast<char*>(user)), stream(s) {
      if (c.space() == MemorySpace::Device) {
        lock = std::unique_lock<std::mutex>(c.staging_mutex_);
        host = c.staging(bytes);
      } else {
        host = this->user;
      }
    }
    void fetch(size_t offset, size_t bytes) {
      if (host == user) return;
      copy_async(host + offset, user + offset, bytes, stream);
      stream_synchronize(stream);
    }
    void publish(size_t offset, size_t bytes) {
      if (host == user) return;
      copy_async(user + offset, host + offset, bytes, stream);
      stream_synchronize(stream);
    }
    MpiCommunicator& comm;
    char* user;
    StreamRef stream;
    char* host = nullptr;
    std::unique_lock<std::mutex> lock;
  };

  char* staging(size_t bytes) {
    if (staging_.size() < bytes) staging_ = PinnedBuffer(bytes);
    return static_cast<char*>(staging_.data());
  }

  MPI_Op mpi_op(DType t, ReduceOp op) const {
    if (t == DType::BF16) return op == ReduceOp::Max ? bf16_max_op_ : bf16_sum_op_;
    return builtin_op(op);
  }

  MpiComm comm_;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
  MPI_Op bf16_max_op_ = MPI_OP_NULL;
  std::mutex staging_mutex_;
  PinnedBuffer staging_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, MeshAxis axis, MemorySpace space) {
  return std::make_unique<MpiCommunicator>(MpiComm::duplicate(comm), axis, space);
}

}  // namespace shardtrain
