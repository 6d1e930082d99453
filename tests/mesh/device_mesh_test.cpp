// DeviceMesh under mpirun: every strategy's sub-communicators hold exactly the ranks the layout
// says, in coordinate order (checked by gathering world ranks over each axis).
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "shardtrain/mesh/device_mesh.hpp"
#include "shardtrain/runtime/topology.hpp"

using namespace shardtrain;

namespace {
std::vector<int> gather_world_ranks(MPI_Comm comm) {
  int world_rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(comm, &n);
  std::vector<int> out(n);
  MPI_Allgather(&world_rank, 1, MPI_INT, out.data(), 1, MPI_INT, comm);
  return out;
}
}  // namespace

TEST(DeviceMesh, AxesHoldTheLayoutsGroups) {
  const Topology topo = discover_topology(MPI_COMM_WORLD, ranks_per_node_from_env());
  for (int s = 1; s <= 5; ++s) {
    const auto strategy = static_cast<ShardingStrategy>(s);
    SCOPED_TRACE(sharding_strategy_name(strategy));
    const DeviceMesh mesh(MPI_COMM_WORLD, topo, {strategy, 0});
    const MeshLayout& m = mesh.layout();
    EXPECT_EQ(m.replicate_size * m.shard_size, topo.world_size);
    if (strategy_is_hybrid(strategy)) {
      EXPECT_EQ(m.shard_size, topo.local_size);
      EXPECT_EQ(m.replicate_size, topo.node_count);
      EXPECT_EQ(mesh.coord().replicate, topo.node_index);
      EXPECT_EQ(mesh.coord().shard, topo.local_rank);
    }
    int shard_rank = -1, replicate_rank = -1;
    MPI_Comm_rank(mesh.shard_comm(), &shard_rank);
    MPI_Comm_rank(mesh.replicate_comm(), &replicate_rank);
    EXPECT_EQ(shard_rank, mesh.coord().shard);
    EXPECT_EQ(replicate_rank, mesh.coord().replicate);
    EXPECT_EQ(gather_world_ranks(mesh.shard_comm()), mesh.shard_groups_world()[mesh.coord().replicate]);
    EXPECT_EQ(gather_world_ranks(mesh.replicate_comm()), mesh.replicate_groups_world()[mesh.coord().shard]);
    EXPECT_EQ(mesh.world_rank_at(mesh.coord()), topo.world_rank);
  }
}
