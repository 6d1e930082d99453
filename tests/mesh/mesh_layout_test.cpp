// Mesh shapes and groups for every strategy at 1, 2 and 4 ranks (4 also as 2 nodes x 2), and the
// errors for meshes that cannot be built.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;
using Groups = std::vector<std::vector<int>>;

namespace {
std::string config_error_of(const MeshSpec& spec, int world, int rpn) {
  try {
    make_mesh_layout(spec, world, rpn);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return {};
}
}  // namespace

TEST(MeshLayout, OneDimensionalStrategies) {
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    const MeshLayout m = make_mesh_layout({s, 0}, 4, 2);
    EXPECT_EQ(m.replicate_size, 1);
    EXPECT_EQ(m.shard_size, 4);
    EXPECT_EQ(m.shard_groups(), (Groups{{0, 1, 2, 3}}));
    EXPECT_EQ(m.replicate_groups(), (Groups{{0}, {1}, {2}, {3}}));
    EXPECT_EQ(m.coord_of(3).shard, 3);
    EXPECT_EQ(m.coord_of(3).replicate, 0);
  }
  const MeshLayout d = make_mesh_layout({ShardingStrategy::NoShard, 0}, 4, 2);
  EXPECT_EQ(d.replicate_size, 4);
  EXPECT_EQ(d.shard_size, 1);
  EXPECT_EQ(d.shard_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(d.replicate_groups(), (Groups{{0, 1, 2, 3}}));
}

TEST(MeshLayout, HybridOnTwoNodesOfTwo) {
  for (ShardingStrategy s : {ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2}) {
    const MeshLayout m = make_mesh_layout({s, 0}, 4, 2);
    EXPECT_EQ(m.replicate_size, 2);
    EXPECT_EQ(m.shard_size, 2);
    EXPECT_EQ(m.shard_groups(), (Groups{{0, 1}, {2, 3}}));
    EXPECT_EQ(m.replicate_groups(), (Groups{{0, 2}, {1, 3}}));
    EXPECT_EQ(m.coord_of(2).replicate, 1);
    EXPECT_EQ(m.coord_of(2).shard, 0);
    EXPECT_EQ(m.describe(), "2 (replicate) x 2 (shard)");
  }
}

TEST(MeshLayout, HybridWithExplicitShardSize) {
  // Shard over 2 nodes of 2, replicate across the pairs of nodes: 8 ranks = 2 x 4.
  const MeshLayout m = make_mesh_layout({ShardingStrategy::HybridShard, 4}, 8, 2);
  EXPECT_EQ(m.replicate_size, 2);
  EXPECT_EQ(m.shard_groups(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.replicate_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Shard groups smaller than a node: 4 ranks per node, shard_size 2.
  const MeshLayout h = make_mesh_layout({ShardingStrategy::HybridShardZero2, 2}, 8, 4);
  EXPECT_EQ(h.replicate_size, 4);
  EXPECT_EQ(h.shard_groups(), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

TEST(MeshLayout, EveryStrategyAtEveryWorldSize) {
  for (int world : {1, 2, 4}) {
    for (int s = 1; s <= 5; ++s) {
      const auto strategy = static_cast<ShardingStrategy>(s);
      const int rpn = world == 4 ? 2 : world;
      const MeshLayout m = make_mesh_layout({strategy, 0}, world, rpn);
      EXPECT_EQ(m.replicate_size * m.shard_size, world);
      // Every position appears in exactly one shard group and one replicate group, at its coordinates.
      std::vector<int> seen(world, 0);
      for (int r = 0; r < m.replicate_size; ++r)
        for (int i = 0; i < m.shard_size; ++i) {
          const int p = m.shard_group(r)[i];
          ++seen[p];
          EXPECT_EQ(m.coord_of(p).replicate, r);
          EXPECT_EQ(m.coord_of(p).shard, i);
          EXPECT_EQ(m.replicate_group(i)[r], p);
        }
      for (int c : seen) EXPECT_EQ(c, 1);
    }
  }
}

TEST(MeshLayout, ErrorsNameEachFactor) {
  const std::string a = config_error_of({ShardingStrategy::HybridShard, 0}, 6, 4);
  EXPECT_NE(a.find("world size 6"), std::string::npos) << a;
  EXPECT_NE(a.find("ranks_per_node 4"), std::string::npos) << a;
  const std::string b = config_error_of({ShardingStrategy::HybridShard, 3}, 4, 2);
  EXPECT_NE(b.find("shard_size 3"), std::string::npos) << b;
  EXPECT_NE(b.find("world size 4"), std::string::npos) << b;
  const std::string c = config_error_of({ShardingStrategy::HybridShard, 3}, 12, 2);
  EXPECT_NE(c.find("ranks_per_node 2"), std::string::npos) << c;
  const std::string d = config_error_of({ShardingStrategy::FullShard, 2}, 4, 2);
  EXPECT_NE(d.find("FULL_SHARD"), std::string::npos) << d;
}

TEST(Strategy, ParsesNamesAndAccelerateNumbers) {
  EXPECT_EQ(parse_sharding_strategy("FULL_SHARD"), ShardingStrategy::FullShard);
  EXPECT_EQ(parse_sharding_strategy("full shard"), ShardingStrategy::FullShard);
  EXPECT_EQ(parse_sharding_strategy("2"), ShardingStrategy::ShardGradOp);
  EXPECT_EQ(parse_sharding_strategy("no_shard"), ShardingStrategy::NoShard);
  EXPECT_EQ(parse_sharding_strategy("4"), ShardingStrategy::HybridShard);
  EXPECT_EQ(parse_sharding_strategy("HYBRID_SHARD_ZERO2"), ShardingStrategy::HybridShardZero2);
  for (int s = 1; s <= 5; ++s) {
    const auto st = static_cast<ShardingStrategy>(s);
    EXPECT_EQ(parse_sharding_strategy(sharding_strategy_name(st)), st);
  }
  try {
    parse_sharding_strategy("ZERO3");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'ZERO3'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("HYBRID_SHARD_ZERO2"), std::string::npos);
  }
}
