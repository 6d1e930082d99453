// Where this rank sits: world rank and size, rank within its node, node index and count, host.
// `ranks_per_node` > 0 simulates nodes of that many consecutive ranks on one machine, so hybrid
// meshes can be exercised on a workstation (--ranks-per-node, SHARDTRAIN_RANKS_PER_NODE).
#pragma once

#include <mpi.h>

#include <string>

#include "shardtrain/runtime/session.hpp"

namespace shardtrain {

struct Topology {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank within its (real or simulated) node
  int local_size = 1;  // ranks on that node
  int node_index = 0;
  int node_count = 1;
  bool simulated_nodes = false;
  bool uniform_nodes = true;  // every node holds local_size ranks
  std::string hostname;

  // Node-major position of this rank: node_index * local_size + local_rank. Equal to the world rank
  // under block placement; the mesh uses it so that shard groups stay within a node under any placement.
  int node_major_rank() const { return node_index * local_size + local_rank; }
};

// The cores this process may run on: its CPU affinity (what Slurm's --cpus-per-task, taskset or a cgroup
// cpuset gives it), not the machine's count, so a job on part of a node does not start a thread per core of
// the node. At least 1.
int usable_cores();

// How many times over `ranks` ranks of `threads` threads each ask for `cores` cores of one machine: ranks x threads
// / cores, at least 1. A rank's host work runs that much slower than on cores of its own: predict prices CPU ranks'
// host work so (cmd_predict.cpp), and a CPU rank's peak for MFU is its threads' rate divided by it (trainer.cpp).
double core_oversubscription(int ranks, int threads, int cores);

// Reads SHARDTRAIN_RANKS_PER_NODE; 0 when unset. Throws ConfigError on a value that is not a positive integer.
int ranks_per_node_from_env();

// The rank this process will have, read from the launcher's environment before MPI is initialized
// (Open MPI, PMI, Slurm); 0 when not launched by one. Used to print command-line errors once.
int launcher_rank();

// How many processes the launcher started, from the same environment (Open MPI, PMI; srun's step, not a batch
// script's allocation); 1 when not launched by one or when it does not say.
int launcher_size();

// Collective over `world`. Throws ConfigError when ranks_per_node does not divide the world size.
Topology discover_topology(MPI_Comm world, int ranks_per_node);

// The ranks of `world` on this machine (MPI_COMM_TYPE_SHARED), ordered by world rank. Unlike the topology's
// node, never simulated: what ranks share is physical (a GPU, memory), whatever --ranks-per-node says.
// Collective over `world`.
MpiComm machine_comm(MPI_Comm world);

}  // namespace shardtrain
