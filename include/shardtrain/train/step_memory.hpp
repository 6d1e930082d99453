// Whether one rank's share of a training step fits its memory, before anything is allocated (train): the model's
// state alone is TrainConfig::validate_memory's check; this one adds what the batch makes, so that a batch no
// machine could hold is a configuration error naming its key instead of an allocation failure minutes later.
#pragma once

#include <string>

#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

// Bytes of one micro-batch buffer the loaders keep (data::allocate_micro_batch): token ids, targets and document
// ids of each position, a sample index and a source per row.
double micro_batch_buffer_bytes(int64_t micro_batch, int64_t seq_len);

// A lower bound of one rank's memory for a step, by `shardtrain plan`'s accounting (fsdp::estimate_memory: sharded
// state, gathered parameters and gradients, one micro-batch's activations; op scratch left out) plus the loaders'
// micro-batch buffers (data.prefetch ready and the 2 x accumulation steps the trainer holds, 4 per evaluated
// source), against the rank's share of the memory it lands in: its GPU's (ranks sharing it), or the host's over the
// node's ranks (on the CPU, and for the loaders and offloaded state), or less when an address-space limit (ulimit -v)
// leaves less (runtime/address_space.hpp: OpenBLAS hangs rather than fails past it). ConfigError naming the key that
// makes most of it: data.micro_batch_size (data.global_batch_size when the micro-batch is derived from it),
// data.prefetch, or the model's largest size. A world the batch does not divide is left to validate_for_world.
void check_step_memory(const TrainConfig& c, const Runtime& rt);

// The memory check_step_memory measures a step against: this rank's share of its GPU (0: the CPU backend, one memory)
// and of its host, each with the name a refusal gives it. `shardtrain check` gives its --gpu-memory and an unbounded
// host (the nodes' host memory is not known offline), and so refuses what the run would, in the run's words.
struct RankMemory {
  int world = 1, local_size = 1;
  double gpu = 0;
  std::string gpu_name;
  double host = 0;
  std::string host_name;
  std::string host_advice_first;  // what to change before the step's own sizes (an address-space limit)
};
RankMemory rank_memory(const Runtime& rt);
void check_step_memory(const TrainConfig& c, const RankMemory& memory);

}  // namespace shardtrain::train
