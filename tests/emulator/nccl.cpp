// The NCCL API that src/comm/nccl_communicator.cpp uses, on the host (SHARDTRAIN_CUDA=EMULATED), for
// communicators of one rank: what a single GPU runs (several ranks on one GPU use the MPI backend, which
// stages device buffers through the host; see docs/gpu.md). A collective is queued on its stream like any
// device work and, with one rank, is a copy from the send to the receive buffer (none in place); both must
// be device memory. A communicator of more ranks fails with ncclInvalidUsage and says why.
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tests/emulator/cuda_emulator.hpp"

struct ncclComm {
  int nranks = 1;
  bool aborted = false;
};

namespace shardtrain::cuda_emulator {
namespace {

std::string last_error;

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

ncclResult_t usage(const std::string& message) {
  last_error = message;
  std::fprintf(stderr, "cuda emulator (NCCL): %s\n", message.c_str());
  return ncclInvalidUsage;
}

// One rank: recv = send (bytes of it), on the stream.
ncclResult_t collective(const char* what, ncclComm_t comm, const void* send, void* recv, size_t count,
                        ncclDataType_t type, cudaStream_t stream) {
  if (!comm || comm->aborted) return usage(std::string(what) + " on a destroyed or aborted communicator");
  const size_t bytes = count * type_bytes(type);
  if (type_bytes(type) == 0) return usage(std::string(what) + ": unknown data type");
  require_device_range(send, bytes, (std::string(what) + " send buffer").c_str(), false);
  require_device_range(recv, bytes, (std::string(what) + " receive buffer").c_str(), false);
  if (bytes == 0 || send == recv) return ncclSuccess;
  submit(stream, [send, recv, bytes] { std::memmove(recv, send, bytes); }, what);
  return ncclSuccess;
}

}  // namespace
}  // namespace shardtrain::cuda_emulator

using namespace shardtrain::cuda_emulator;  // NOLINT: the C API below is this file's whole purpose

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "shardtrain-cuda-emulator");
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  *comm = nullptr;
  if (nranks != 1 || rank != 0)
    return usage("a communicator of " + std::to_string(nranks) + " ranks: the CUDA emulator runs NCCL on one rank "
                 "(one GPU); several ranks on one device use the MPI backend (comm_backend = \"mpi\")");
  *comm = new ncclComm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm) comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm) return ncclInvalidArgument;
  *state = ncclSuccess;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage (see the CUDA emulator's message)";
    default: return "unhandled error (CUDA emulator)";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclAllGather", comm, send, recv, count, type, stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t,
                               ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduceScatter", comm, send, recv, count, type, stream);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", comm, send, recv, count, type, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0) return usage("ncclBroadcast: root " + std::to_string(root) + " of a one-rank communicator");
  return collective("ncclBroadcast", comm, send, recv, count, type, stream);
}

}  // extern "C"
