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

// A ranks_per_node given to some ranks only (SHARDTRAIN_RANKS_PER_NODE set on one node) once sent them down the
// simulated path while the others split the machine's communicator: both waited for ever in MPI. Now every rank
// refuses it at once, with the same error.
TEST(Topology, RanksGivenDifferentRanksPerNodeAllRefuse) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) return;  // one rank cannot disagree with itself: the 2- and 4-rank runs test it
  try {
    discover_topology(MPI_COMM_WORLD, rank == 0 ? 1 : 0);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the ranks were given different ranks_per_node"), std::string::npos) << what;
    EXPECT_NE(what.find("between 0 and 1 over the ranks"), std::string::npos) << what;
  }
}
