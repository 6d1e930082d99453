// FSDP options: names and validation.
#include "shardtrain/fsdp/config.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::fsdp {

const char* grad_accumulation_name(GradAccumulation g) {
  switch (g) {
    case GradAccumulation::ReduceEachMicroBatch: return "reduce_each";
    case GradAccumulation::NoSync: return "no_sync";
    case GradAccumulation::AllReduceLast: return "all_reduce_last";
  }
  return "?";
}

GradAccumulation parse_grad_accumulation(std::string_view t) {
  if (t == "reduce_each" || t == "lean") return GradAccumulation::ReduceEachMicroBatch;
  if (t == "no_sync") return GradAccumulation::NoSync;
  if (t == "all_reduce_last") return GradAccumulation::AllReduceLast;
  throw ConfigError(
      fmt::format("fsdp.grad_accumulation: unknown mode '{}' (expected reduce_each, no_sync or all_reduce_last)", t));
}

void FsdpConfig::validate() const {
  if (param_dtype != DType::F32 && param_dtype != DType::BF16)
    throw ConfigError(fmt::format("fsdp.param_dtype: {} is not supported (expected fp32 or bf16)", dtype_name(param_dtype)));
  if (reduce_dtype != DType::F32 && reduce_dtype != DType::BF16)
    throw ConfigError(
        fmt::format("fsdp.reduce_dtype: {} is not supported (expected fp32 or bf16)", dtype_name(reduce_dtype)));
  if (forward_prefetch < 0)
    throw ConfigError(fmt::format("fsdp.forward_prefetch: {} (expected 0 or more)", forward_prefetch));
  if (backward_prefetch < 0)
    throw ConfigError(fmt::format("fsdp.backward_prefetch: {} (expected 0 or more)", backward_prefetch));
  if (accumulation == GradAccumulation::AllReduceLast && offload_params) {
    // The accumulated shard lives in host memory there, and its all-reduce would need a round trip to the device.
    throw ConfigError(
        "fsdp.grad_accumulation: all_reduce_last does not combine with offload_params = true (use reduce_each or no_sync)");
  }
  if (shard_size < 0) throw ConfigError(fmt::format("fsdp.shard_size: {} (expected 0 or more)", shard_size));
}

}  // namespace shardtrain::fsdp
