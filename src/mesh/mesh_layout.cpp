// Mesh shapes per strategy (the table in docs/architecture.md) and their validation.
#include "shardtrain/mesh/mesh_layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

const char* mesh_axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::Replicate: return "replicate";
    case MeshAxis::Shard: return "shard";
    case MeshAxis::World: return "world";
  }
  return "?";
}

MeshLayout make_mesh_layout(const MeshSpec& spec, int world_size, int ranks_per_node) {
  if (world_size <= 0) throw ConfigError(fmt::format("world size {}: expected at least 1 rank", world_size));
  if (ranks_per_node <= 0) throw ConfigError(fmt::format("ranks_per_node {}: expected a positive integer", ranks_per_node));
  if (world_size % ranks_per_node != 0) {
    throw ConfigError(
        fmt::format("world size {} is not divisible by ranks_per_node {}: nodes must hold equal numbers of ranks",
                    world_size, ranks_per_node));
  }
  if (spec.shard_size < 0)
    throw ConfigError(fmt::format("shard_size {}: expected a positive integer (or 0 for ranks_per_node)", spec.shard_size));
  if (spec.shard_size > 0 && !strategy_is_hybrid(spec.strategy)) {
    throw ConfigError(fmt::format("shard_size {} applies only to HYBRID_SHARD and HYBRID_SHARD_ZERO2, not to {}",
                                  spec.shard_size, sharding_strategy_name(spec.strategy)));
  }

  MeshLayout m;
  m.strategy = spec.strategy;
  m.world_size = world_size;
  m.ranks_per_node = ranks_per_node;
  switch (spec.strategy) {
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: m.shard_size = world_size; break;
    case ShardingStrategy::NoShard: m.shard_size = 1; break;
    case ShardingStrategy::HybridShard:
    case ShardingStrategy::HybridShardZero2: {
      const int s = spec.shard_size > 0 ? spec.shard_size : ranks_per_node;
      if (world_size % s != 0) {
        throw ConfigError(
            fmt::format("shard_size {} does not divide world size {}: {} needs shard groups of equal size "
                        "(a divisor of {})",
                        s, world_size, sharding_strategy_name(spec.strategy), world_size));
      }
      if (s % ranks_per_node != 0 && ranks_per_node % s != 0) {
        throw ConfigError(
            fmt::format("shard_size {} neither divides nor is a multiple of ranks_per_node {}: a shard group "
                        "must be part of one node or a run of whole nodes",
                        s, ranks_per_node));
      }
      m.shard_size = s;
      break;
    }
  }
  m.replicate_size = world_size / m.shard_size;
  return m;
}

std::vector<int> MeshLayout::shard_group(int replicate_index) const {
  std::vector<int> g(shard_size);
  for (int s = 0; s < shard_size; ++s) g[s] = position_of({replicate_index, s});
  return g;
}

std::vector<int> MeshLayout::replicate_group(int shard_index) const {
  std::vector<int> g(replicate_size);
  for (int r = 0; r < replicate_size; ++r) g[r] = position_of({r, shard_index});
  return g;
}

std::vector<std::vector<int>> MeshLayout::shard_groups() const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < replicate_size; ++r) out.push_back(shard_group(r));
  return out;
}

std::vector<std::vector<int>> MeshLayout::replicate_groups() const {
  std::vector<std::vector<int>> out;
  for (int s = 0; s < shard_size; ++s) out.push_back(replicate_group(s));
  return out;
}

std::string MeshLayout::describe() const { return fmt::format("{} (replicate) x {} (shard)", replicate_size, shard_size); }

}  // namespace shardtrain
