// Building the mesh's sub-communicators from the topology.
#include "shardtrain/mesh/device_mesh.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

DeviceMesh::DeviceMesh(MPI_Comm world, const Topology& topo, const MeshSpec& spec) {
  if (strategy_is_hybrid(spec.strategy) && !topo.uniform_nodes) {
    throw ConfigError(fmt::format("{} needs the same number of ranks on every node, but node {} ({}) has {}",
                                  sharding_strategy_name(spec.strategy), topo.node_index, topo.hostname, topo.local_size));
  }
  layout_ = make_mesh_layout(spec, topo.world_size, topo.uniform_nodes ? topo.local_size : 1);
  // Positions are node-major so shard groups never straddle nodes, whatever the launcher's placement.
  const int position = topo.uniform_nodes ? topo.node_major_rank() : topo.world_rank;
  coord_ = layout_.coord_of(position);

  world_ = MpiComm::duplicate(world);
  std::vector<int> positions(topo.world_size);
  ST_CHECK_MPI(MPI_Allgather(&position, 1, MPI_INT, positions.data(), 1, MPI_INT, world_.get()));
  world_rank_of_position_.assign(topo.world_size, -1);
  for (int r = 0; r < topo.world_size; ++r) {
    const int p = positions[r];
    if (p < 0 || p >= topo.world_size || world_rank_of_position_[p] != -1) {
      throw InternalError(fmt::format("mesh position {} of world rank {} is out of range or taken twice", p, r));
    }
    world_rank_of_position_[p] = r;
  }
  shard_ = MpiComm::split(world_.get(), coord_.replicate, coord_.shard);
  replicate_ = MpiComm::split(world_.get(), coord_.shard, coord_.replicate);
}

DeviceMesh::DeviceMesh(const MeshLayout& layout, MeshCoord coord) : layout_(layout), coord_(coord) {
  world_rank_of_position_.resize(static_cast<size_t>(layout.world_size));
  for (int p = 0; p < layout.world_size; ++p) world_rank_of_position_[static_cast<size_t>(p)] = p;
}

MPI_Comm DeviceMesh::comm(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::Shard: return shard_.get();
    case MeshAxis::Replicate: return replicate_.get();
    case MeshAxis::World: return world_.get();
  }
  return MPI_COMM_NULL;
}

namespace {
std::vector<std::vector<int>> to_world(const std::vector<std::vector<int>>& groups, const std::vector<int>& rank_of) {
  auto out = groups;
  for (auto& g : out)
    for (int& p : g) p = rank_of[p];
  return out;
}
}  // namespace

std::vector<std::vector<int>> DeviceMesh::shard_groups_world() const {
  return to_world(layout_.shard_groups(), world_rank_of_position_);
}
std::vector<std::vector<int>> DeviceMesh::replicate_groups_world() const {
  return to_world(layout_.replicate_groups(), world_rank_of_position_);
}

}  // namespace shardtrain
