// Topology discovery under mpirun: real nodes (one machine = one node) and simulated nodes.
#include <gtest/gtest.h>
#include <mpi.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/topology.hpp"

using namespace shardtrain;

TEST(Topology, MatchesTheLauncher) {
  const int rpn = ranks_per_node_from_env();
  const Topology t = discover_topology(MPI_COMM_WORLD, rpn);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(t.world_rank, rank);
  EXPECT_EQ(t.world_size, size);
  EXPECT_FALSE(t.hostname.empty());
  if (rpn == 0) {
    // mpirun on one machine: one real node holding every rank.
    EXPECT_FALSE(t.simulated_nodes);
    EXPECT_EQ(t.node_count, 1);
    EXPECT_EQ(t.node_index, 0);
    EXPECT_EQ(t.local_size, size);
    EXPECT_EQ(t.local_rank, rank);
  } else {
    EXPECT_TRUE(t.simulated_nodes);
    EXPECT_EQ(t.local_size, rpn);
    EXPECT_EQ(t.node_count, size / rpn);
    EXPECT_EQ(t.node_index, rank / rpn);
    EXPECT_EQ(t.local_rank, rank % rpn);
  }
  EXPECT_EQ(t.node_major_rank(), rank);
}

TEST(Topology, RejectsRanksPerNodeThatDoesNotDivideTheWorld) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    discover_topology(MPI_COMM_WORLD, size + 1);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("world size " + std::to_string(size)), std::string::npos) << what;
    EXPECT_NE(what.find("ranks_per_node " + std::to_string(size + 1)), std::string::npos) << what;
  }
}
