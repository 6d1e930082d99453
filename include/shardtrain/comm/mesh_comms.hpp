// The communicators of one device mesh (world, shard axis, replicate axis) on one backend, and
// how the backend is chosen.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/mesh/device_mesh.hpp"
#include "shardtrain/runtime/runtime.hpp"

namespace shardtrain {

enum class CommBackendPreference { Auto, Mpi, Nccl };
CommBackendPreference parse_comm_backend(std::string_view s);  // auto|mpi|nccl, throws UsageError
const char* comm_backend_preference_name(CommBackendPreference p);

// The backend chosen, and why, in the same words on every rank.
struct CommBackendChoice {
  CommBackend backend = CommBackend::Mpi;
  // "8 ranks on this node, each on its own GPU", "ranks 0 and 1 share GPU-8f6c1a2b-... (0000:18:00.0)",
  // "the CPU backend", "fsdp.comm_backend or --comm-backend is mpi"
  std::string reason;
  bool host_staging = false;  // MPI with device buffers staged through pinned host memory
  // "nccl: 8 ranks on this node, each on its own GPU", "mpi (host staging): ranks 0 and 1 share GPU-..."
  std::string describe() const;
};

// Collective over the world. Auto: NCCL when no two ranks share a physical GPU (matched by identity:
// Device::sharing_ranks, whatever CUDA_VISIBLE_DEVICES numbered them) and every rank has one; MPI otherwise
// (the CPU backend, or ranks sharing a GPU, staged through pinned host memory). Nccl where that is not so
// throws one ConfigError (the same on every rank) naming the ranks and the GPU they share.
CommBackendChoice choose_comm_backend(const Runtime& rt, CommBackendPreference pref);

// An MPI communicator over a duplicate of `comm`. Device-space communicators stage through pinned host memory.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, MeshAxis axis, MemorySpace space);
// A NCCL communicator over the ranks of `comm` (its rank 0 creates the ncclUniqueId and broadcasts it).
// Throws a Device error when shardtrain was built without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MeshAxis axis);
bool nccl_built();
// The MPI_COMM_WORLD ranks of `comm`'s members, in `comm`'s rank order (MPI_Group_translate_ranks).
std::vector<int> world_ranks_of(MPI_Comm comm);

class MeshComms {
 public:
  // Collective over the mesh's world. Buffers live in `space` (Device with a GPU, Host otherwise).
  MeshComms(const DeviceMesh& mesh, CommBackend backend, MemorySpace space);
  // Communicators made elsewhere (the step-time prediction's simulated ones: sim_communicator.hpp).
  MeshComms(CommBackend backend, std::unique_ptr<Communicator> world, std::unique_ptr<Communicator> shard,
            std::unique_ptr<Communicator> replicate)
      : backend_(backend), world_(std::move(world)), shard_(std::move(shard)), replicate_(std::move(replicate)) {}

  // The world axis carries host values only in training (token counts, loss sums, agreement checks: through
  // host_all_reduce, over MPI whatever the backend), so it is an MPI communicator even on the NCCL backend:
  // no NCCL communicator (its buffers, its set-up) for it. Device buffers given to it are staged.
  Communicator& world() { return *world_; }
  Communicator& shard() { return *shard_; }
  Communicator& replicate() { return *replicate_; }
  Communicator& axis(MeshAxis a);
  CommBackend backend() const { return backend_; }

  uint64_t bytes(MeshAxis a, CollectiveKind k);  // per axis and kind
  void set_watchdog(CollectiveWatchdog* w);      // times the collectives of every axis
  void reset_traffic();

 private:
  CommBackend backend_;
  std::unique_ptr<Communicator> world_, shard_, replicate_;
};

}  // namespace shardtrain
