// Rank and node discovery: MPI_Comm_split_type(SHARED) for real nodes, or simulated nodes of
// `ranks_per_node` consecutive world ranks.
#include "shardtrain/runtime/topology.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/session.hpp"

namespace shardtrain {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

double core_oversubscription(int ranks, int threads, int cores) {
  if (ranks <= 0 || threads <= 0 || cores <= 0) return 1.0;
  return std::max(1.0, static_cast<double>(ranks) * threads / cores);
}

int ranks_per_node_from_env() {
  const char* v = std::getenv("SHARDTRAIN_RANKS_PER_NODE");
  if (!v || !*v) return 0;
  int n = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || p != s.data() + s.size() || n <= 0) {
    throw ConfigError(fmt::format("SHARDTRAIN_RANKS_PER_NODE='{}': expected a positive integer", s));
  }
  return n;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  }
  return 0;
}

int launcher_size() {
  // SLURM_STEP_NUM_TASKS only inside an srun step: a batch script's own environment describes the allocation.
  const bool slurm_step = std::getenv("SLURM_STEP_ID") != nullptr;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", slurm_step ? "SLURM_STEP_NUM_TASKS" : nullptr}) {
    if (!name) continue;
    if (const char* v = std::getenv(name); v && *v) return std::max(1, std::atoi(v));
  }
  return 1;
}

MpiComm machine_comm(MPI_Comm world) {
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  MPI_Comm c = MPI_COMM_NULL;
  ST_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &c));
  return MpiComm(c);
}

Topology discover_topology(MPI_Comm world, int ranks_per_node) {
  Topology t;
  ST_CHECK_MPI(MPI_Comm_rank(world, &t.world_rank));
  ST_CHECK_MPI(MPI_Comm_size(world, &t.world_size));
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  t.hostname = host.data();

  if (ranks_per_node < 0) throw ConfigError(fmt::format("ranks_per_node {}: expected a positive integer", ranks_per_node));
  // Every rank takes the same path below: the setting is each rank's own (its command line, its environment), and
  // ranks that differed (the variable set on one node only) entered different collectives and waited for ever.
  int given[2] = {ranks_per_node, -ranks_per_node};  // the smallest and (negated) the largest
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, given, 2, MPI_INT, MPI_MIN, world));
  if (given[0] != -given[1])
    throw ConfigError(fmt::format(
        "the ranks were given different ranks_per_node (--ranks-per-node / SHARDTRAIN_RANKS_PER_NODE): {} on rank {}, "
        "between {} and {} over the ranks (0: not set, the machine's own); set it alike for every rank, or for none",
        ranks_per_node, t.world_rank, given[0], -given[1]));
  if (ranks_per_node > 0) {
    if (t.world_size % ranks_per_node != 0) {
      throw ConfigError(
          fmt::format("world size {} is not divisible by ranks_per_node {} (--ranks-per-node / SHARDTRAIN_RANKS_PER_NODE): "
                      "launch a multiple of {} ranks or choose a ranks_per_node that divides {}",
                      t.world_size, ranks_per_node, ranks_per_node, t.world_size));
    }
    t.simulated_nodes = true;
    t.local_size = ranks_per_node;
    t.local_rank = t.world_rank % ranks_per_node;
    t.node_index = t.world_rank / ranks_per_node;
    t.node_count = t.world_size / ranks_per_node;
    return t;
  }

  MpiComm local = machine_comm(world);
  t.local_rank = local.rank();
  t.local_size = local.size();
  // Node leaders number the nodes in world-rank order of their first rank; the index reaches the rest.
  MpiComm leaders = MpiComm::split(world, t.local_rank == 0 ? 0 : MPI_UNDEFINED, t.world_rank);
  std::array<int, 2> node{0, 0};
  if (t.local_rank == 0) node = {leaders.rank(), leaders.size()};
  ST_CHECK_MPI(MPI_Bcast(node.data(), 2, MPI_INT, 0, local.get()));
  t.node_index = node[0];
  t.node_count = node[1];
  int min_local = 0, max_local = 0;
  ST_CHECK_MPI(MPI_Allreduce(&t.local_size, &min_local, 1, MPI_INT, MPI_MIN, world));
  ST_CHECK_MPI(MPI_Allreduce(&t.local_size, &max_local, 1, MPI_INT, MPI_MAX, world));
  t.uniform_nodes = min_local == max_local;
  return t;
}

}  // namespace shardtrain
