// Internal: broadcasts of any length. MPI counts are ints, and a unit of a large model (NO_WRAP, or SIZE_BASED_WRAP
// with a large min_num_params) holds more than 2^31 elements: one call would be refused, or cut to count mod 2^32.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <span>

namespace shardtrain::checkpoint {

inline constexpr size_t kMaxBroadcastPiece = size_t{1} << 30;  // elements per MPI_Bcast

// `data` from `root` to every rank of `comm`, in pieces of at most `max_piece` elements (every rank passes the same
// length). Throws the MPI error checks' error on failure.
void broadcast_floats(MPI_Comm comm, std::span<float> data, int root, size_t max_piece = kMaxBroadcastPiece);

}  // namespace shardtrain::checkpoint
