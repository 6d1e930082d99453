// The five sharding strategies of the seeds (PyTorch FSDP / Accelerate names and numbers 1-5).
#pragma once

#include <string_view>

namespace shardtrain {

enum class ShardingStrategy {
  FullShard = 1,        // params, grads, optimizer sharded over the world; params resharded after forward
  ShardGradOp = 2,      // as FULL_SHARD, but params kept gathered from forward until backward ends (ZeRO-2)
  NoShard = 3,          // nothing sharded: every rank a replica (DDP)
  HybridShard = 4,      // FULL_SHARD inside a node, replicated across nodes
  HybridShardZero2 = 5  // SHARD_GRAD_OP inside a node, replicated across nodes
};

// Accepts the names (FULL_SHARD, full_shard, "full shard"), Accelerate's numbers "1".."5", and
// FSDP2's spelling is not a strategy (reshard_after_forward is separate). Throws ConfigError listing the choices.
ShardingStrategy parse_sharding_strategy(std::string_view text);
const char* sharding_strategy_name(ShardingStrategy s);  // "FULL_SHARD", ...

constexpr bool strategy_is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardZero2;
}
// Whether parameters are resharded right after a unit's forward (the strategy's default for
// reshard_after_forward; the FSDP engine lets the user override it).
constexpr bool strategy_reshards_after_forward(ShardingStrategy s) {
  return s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
}

}  // namespace shardtrain
