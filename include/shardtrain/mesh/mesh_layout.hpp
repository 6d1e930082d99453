// The pure arithmetic of a 2-D device mesh (replicate x shard), without MPI: which mesh shape a
// strategy gets on a given world, and which ranks form each group. Used by DeviceMesh, by
// `shardtrain plan`, and by tests.
#pragma once

#include <string>
#include <vector>

#include "shardtrain/mesh/strategy.hpp"

namespace shardtrain {

enum class MeshAxis { Replicate, Shard, World };
const char* mesh_axis_name(MeshAxis axis);  // "replicate", "shard", "world"

struct MeshSpec {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int shard_size = 0;  // hybrid only: ranks per shard group; 0 = ranks_per_node
};

struct MeshCoord {
  int replicate = 0;  // index along the replicate axis (which shard group)
  int shard = 0;      // index along the shard axis (position inside the shard group)
};

struct MeshLayout {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int world_size = 1;
  int ranks_per_node = 1;
  int replicate_size = 1;  // R
  int shard_size = 1;      // S, with R * S = world_size

  // Mesh positions are node-major ranks (node * ranks_per_node + local rank), which equal world
  // ranks under block placement. Shard groups are contiguous runs of S positions.
  MeshCoord coord_of(int position) const { return {position / shard_size, position % shard_size}; }
  int position_of(MeshCoord c) const { return c.replicate * shard_size + c.shard; }
  std::vector<int> shard_group(int replicate_index) const;  // positions, ordered by shard index
  std::vector<int> replicate_group(int shard_index) const;  // positions, ordered by replicate index
  std::vector<std::vector<int>> shard_groups() const;
  std::vector<std::vector<int>> replicate_groups() const;
  std::string describe() const;  // "2 (replicate) x 2 (shard)"
};

// Throws ConfigError naming each factor that does not fit (world size, ranks_per_node, shard_size).
MeshLayout make_mesh_layout(const MeshSpec& spec, int world_size, int ranks_per_node);

}  // namespace shardtrain
