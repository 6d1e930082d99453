// The device mesh of a running job: the layout, this rank's coordinates, and one MPI
// sub-communicator per axis (shard: ranks of one shard group; replicate: ranks holding the same
// shard in different groups). The comm layer builds its Communicators on these.
#pragma once

#include <mpi.h>

#include <vector>

#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain {

class DeviceMesh {
 public:
  // Collective over `world`. Throws ConfigError when the strategy's mesh does not fit the topology.
  DeviceMesh(MPI_Comm world, const Topology& topo, const MeshSpec& spec);
  // A mesh no MPI job stands behind: the layout of a job of layout.world_size ranks and the place of one of them
  // (block placement: world rank = position), with no communicators (comm() returns MPI_COMM_NULL). What the
  // step-time prediction runs the engine on (sim/predict.hpp), one rank standing for all.
  DeviceMesh(const MeshLayout& layout, MeshCoord coord);

  const MeshLayout& layout() const { return layout_; }
  ShardingStrategy strategy() const { return layout_.strategy; }
  MeshCoord coord() const { return coord_; }
  int replicate_size() const { return layout_.replicate_size; }
  int shard_size() const { return layout_.shard_size; }
  int world_size() const { return layout_.world_size; }

  MPI_Comm world_comm() const { return world_.get(); }
  MPI_Comm shard_comm() const { return shard_.get(); }
  MPI_Comm replicate_comm() const { return replicate_.get(); }
  MPI_Comm comm(MeshAxis axis) const;

  // World rank at each mesh position, and the groups in world ranks (for printing and tests).
  int world_rank_at(MeshCoord c) const { return world_rank_of_position_[layout_.position_of(c)]; }
  std::vector<std::vector<int>> shard_groups_world() const;
  std::vector<std::vector<int>> replicate_groups_world() const;

 private:
  MeshLayout layout_;
  MeshCoord coord_;
  std::vector<int> world_rank_of_position_;
  MpiComm world_;
  MpiComm shard_;
  MpiComm replicate_;
};

}  // namespace shardtrain
