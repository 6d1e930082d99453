// Parsing and naming of sharding strategies.
#include "shardtrain/mesh/strategy.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

const char* sharding_strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FullShard: return "FULL_SHARD";
    case ShardingStrategy::ShardGradOp: return "SHARD_GRAD_OP";
    case ShardingStrategy::NoShard: return "NO_SHARD";
    case ShardingStrategy::HybridShard: return "HYBRID_SHARD";
    case ShardingStrategy::HybridShardZero2: return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(std::string_view text) {
  std::string key;
  for (char c : text)
    key.push_back(c == ' ' || c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  for (int i = 1; i <= 5; ++i) {
    const auto s = static_cast<ShardingStrategy>(i);
    if (key == sharding_strategy_name(s) || key == std::to_string(i)) return s;
  }
  throw ConfigError(
      fmt::format("unknown sharding strategy '{}' (expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or "
                  "HYBRID_SHARD_ZERO2, or Accelerate's numbers 1-5)",
                  text));
}

}  // namespace shardtrain
