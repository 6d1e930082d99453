// Choosing a backend and building the communicators of a mesh.
#include "shardtrain/comm/mesh_comms.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

CommBackendPreference parse_comm_backend(std::string_view s) {
  if (s == "auto") return CommBackendPreference::Auto;
  if (s == "mpi") return CommBackendPreference::Mpi;
  if (s == "nccl") return CommBackendPreference::Nccl;
  throw UsageError(fmt::format("--comm-backend: unknown backend '{}' (expected auto, mpi or nccl)", s));
}

const char* comm_backend_preference_name(CommBackendPreference p) {
  switch (p) {
    case CommBackendPreference::Auto: return "auto";
    case CommBackendPreference::Mpi: return "mpi";
    case CommBackendPreference::Nccl: return "nccl";
  }
  return "auto";
}

CommBackend choose_comm_backend(const Runtime& rt, CommBackendPreference pref) {
  const Device& d = rt.device();
  // NCCL refuses two ranks of one communicator on the same GPU; every rank must agree on the choice.
  int shared_anywhere = d.is_cuda() && d.ranks_sharing > 1 ? 1 : 0;
  int cpu_anywhere = d.is_cuda() ? 0 : 1;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &shared_anywhere, 1, MPI_INT, MPI_MAX, rt.world()));
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &cpu_anywhere, 1, MPI_INT, MPI_MAX, rt.world()));
  const bool nccl_possible = nccl_built() && !cpu_anywhere && !shared_anywhere;
  if (pref == CommBackendPreference::Mpi) return CommBackend::Mpi;
  if (pref == CommBackendPreference::Nccl && !nccl_possible) {
    throw ConfigError(cpu_anywhere ? "comm backend nccl (fsdp.comm_backend or --comm-backend): NCCL needs a GPU on every rank, and some rank runs on the CPU"
                                   : "comm backend nccl (fsdp.comm_backend or --comm-backend): NCCL needs one GPU per rank, and some GPU is shared by several "
                                     "ranks (use mpi, which stages device memory through the host)");
  }
  return nccl_possible ? CommBackend::Nccl : CommBackend::Mpi;
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  ST_CHECK_MPI(MPI_Comm_group(comm, &group));
  ST_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
  int n = 0;
  ST_CHECK_MPI(MPI_Group_size(group, &n));
  std::vector<int> ranks(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i;
  ST_CHECK_MPI(MPI_Group_translate_ranks(group, n, ranks.data(), world, out.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

MeshComms::MeshComms(const DeviceMesh& mesh, CommBackend backend, MemorySpace space) : backend_(backend) {
  auto make = [&](MeshAxis a) {
    std::unique_ptr<Communicator> c =
        backend == CommBackend::Nccl ? make_nccl_communicator(mesh.comm(a), a) : make_mpi_communicator(mesh.comm(a), a, space);
    c->set_world_ranks(world_ranks_of(mesh.comm(a)));  // whom the hang watchdog asks about this axis
    return c;
  };
  world_ = make(MeshAxis::World);
  shard_ = make(MeshAxis::Shard);
  replicate_ = make(MeshAxis::Replicate);
}

Communicator& MeshComms::axis(MeshAxis a) {
  switch (a) {
    case MeshAxis::Shard: return *shard_;
    case MeshAxis::Replicate: return *replicate_;
    case MeshAxis::World: return *world_;
  }
  return *world_;
}

uint64_t MeshComms::bytes(MeshAxis a, CollectiveKind k) { return axis(a).traffic().bytes(k); }

void MeshComms::set_watchdog(CollectiveWatchdog* w) {
  world_->set_watchdog(w);
  shard_->set_watchdog(w);
  replicate_->set_watchdog(w);
}

void MeshComms::reset_traffic() {
  world_->traffic().reset();
  shard_->traffic().reset();
  replicate_->traffic().reset();
}

}  // namespace shardtrain
