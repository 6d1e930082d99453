// Collectives on host memory over an MPI communicator, for every backend's host_all_reduce /
// host_all_gather (communicator.hpp): the MPI backend's, and the NCCL backend's over the MPI communicator
// its group was made from. Not bf16 (host values are counts and fp32/fp64 sums).
#pragma once

#include <mpi.h>

#include <cstddef>

#include "shardtrain/comm/communicator.hpp"

namespace shardtrain::detail {

void mpi_host_all_gather(MPI_Comm comm, const void* send, void* recv, size_t count, DType dtype, MeshAxis axis);
void mpi_host_all_reduce(MPI_Comm comm, void* buf, size_t count, DType dtype, ReduceOp op, MeshAxis axis);

}  // namespace shardtrain::detail
