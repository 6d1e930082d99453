// Choosing a backend and building the communicators of a mesh.
#include "shardtrain/comm/mesh_comms.hpp"

#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/session.hpp"

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

std::string CommBackendChoice::describe() const {
  return fmt::format("{}{}: {}", comm_backend_name(backend), host_staging ? " (host staging)" : "", reason);
}

namespace {

constexpr int kNoRank = std::numeric_limits<int>::max();

// The lowest world rank for which `mine` holds (kNoRank: none), the same on every rank.
int lowest_rank_where(bool mine, int world_rank, MPI_Comm world) {
  int r = mine ? world_rank : kNoRank;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MIN, world));
  return r;
}

}  // namespace

CommBackendChoice choose_comm_backend(const Runtime& rt, CommBackendPreference pref) {
  const Device& d = rt.device();
  const Topology& t = rt.topology();
  MPI_Comm world = rt.world();
  // NCCL refuses two ranks of one communicator on the same GPU; every rank must agree on the choice, and say
  // the same reason. The first rank (in world order) of a GPU shared, or without a GPU, speaks for it.
  const int first_cpu = lowest_rank_where(!d.is_cuda(), t.world_rank, world);
  const int first_gpu = lowest_rank_where(d.is_cuda(), t.world_rank, world);
  const int first_shared =
      lowest_rank_where(d.is_cuda() && d.ranks_sharing > 1 && d.sharing_ranks.front() == t.world_rank, t.world_rank, world);
  int machine_rank = 0, machine_size = 1;
  ST_CHECK_MPI(MPI_Comm_rank(rt.machine(), &machine_rank));
  ST_CHECK_MPI(MPI_Comm_size(rt.machine(), &machine_size));
  int machines = machine_rank == 0 ? 1 : 0, fewest = machine_size, most = machine_size;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &machines, 1, MPI_INT, MPI_SUM, world));
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &fewest, 1, MPI_INT, MPI_MIN, world));
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, world));

  std::string shared;  // "ranks 0 and 1 share GPU-... (0000:18:00.0)": the first such GPU in world-rank order
  if (first_shared != kNoRank) {
    std::string mine;
    if (t.world_rank == first_shared)
      mine = fmt::format("{} share {} ({}{})", describe_ranks(d.sharing_ranks), d.uuid, d.pci_bus_id,
                         machines > 1 ? fmt::format(" on {}", t.hostname) : std::string());
    shared = broadcast_text(world, first_shared, mine);
  }
  const std::string placement = machines == 1
                                    ? fmt::format("{} rank{} on this node", t.world_size, t.world_size == 1 ? "" : "s")
                                : fewest == most ? fmt::format("{} ranks on each of {} nodes", most, machines)
                                                 : fmt::format("{} ranks on {} nodes", t.world_size, machines);
  const char* key = "fsdp.comm_backend or --comm-backend";
  // Ranks on the CPU backend beside ranks on GPUs (--device auto where a launcher's binding left some rank no GPU:
  // CUDA_VISIBLE_DEVICES naming none) issue the engine's collectives in another order: the job hung until
  // fsdp.collective_timeout, and the watchdog then blamed the network. One backend for every rank.
  if (first_cpu != kNoRank && first_gpu != kNoRank) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const std::string who = broadcast_text(
        world, first_cpu,
        t.world_rank == first_cpu ? fmt::format("rank {} (on {}, CUDA_VISIBLE_DEVICES {})", first_cpu, t.hostname,
                                                visible ? fmt::format("\"{}\"", visible) : std::string("unset"))
                                  : std::string());
    throw on_every_rank(Error(
        ExitCode::Device,
        fmt::format("{} has no GPU and runs on the CPU backend, while rank {} runs on a GPU: every rank of a job must run "
                    "on the same backend (their collectives would not match, and the job would hang). Give each rank a "
                    "GPU (the launcher's GPU binding: docs/cluster.md, \"GPU binding\"), or run every rank with "
                    "--device cpu",
                    who, first_gpu)));
  }

  CommBackendChoice c;
  if (first_cpu != kNoRank) {  // every rank on the CPU backend (above): MPI in host memory
    c.reason = "the CPU backend";
    if (pref == CommBackendPreference::Nccl)
      throw on_every_rank(ConfigError(fmt::format(
          "comm backend nccl ({}): NCCL needs a GPU on every rank, and every rank runs on the CPU backend", key)));
    return c;
  }
  if (pref == CommBackendPreference::Mpi) {
    c.backend = CommBackend::Mpi;
    c.host_staging = true;
    c.reason = fmt::format("{} is mpi", key);
    return c;
  }
  if (!shared.empty()) {
    if (pref == CommBackendPreference::Nccl)
      throw on_every_rank(ConfigError(fmt::format(
          "comm backend nccl ({}): {}, and NCCL needs a GPU of its own for each rank. Give each rank its own GPU (as "
          "many ranks per node as GPUs; srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES per rank are matched by GPU "
          "identity), or use mpi, which stages device memory through the host",
          key, shared)));
    c.backend = CommBackend::Mpi;
    c.host_staging = true;
    c.reason = shared;
    return c;
  }
  if (!nccl_built()) {
    if (pref == CommBackendPreference::Nccl)
      throw on_every_rank(ConfigError(fmt::format("comm backend nccl ({}): shardtrain was built without NCCL", key)));
    c.backend = CommBackend::Mpi;
    c.host_staging = true;
    c.reason = "shardtrain was built without NCCL";
    return c;
  }
  c.backend = CommBackend::Nccl;
  c.reason = fmt::format("{}, each on its own GPU", placement);
  return c;
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
    std::unique_ptr<Communicator> c = backend == CommBackend::Nccl ? make_nccl_communicator(mesh.comm(a), a)
                                                                   : make_mpi_communicator(mesh.comm(a), a, space);
    c->set_world_ranks(world_ranks_of(mesh.comm(a)));  // whom the hang watchdog asks about this axis
    return c;
  };
  // The world axis: MPI on every backend (see world() in the header). Its device buffers, if any, are staged.
  world_ = make_mpi_communicator(mesh.comm(MeshAxis::World), MeshAxis::World, space);
  world_->set_world_ranks(world_ranks_of(mesh.comm(MeshAxis::World)));
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
