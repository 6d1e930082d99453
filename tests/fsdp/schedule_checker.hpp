// Checks the FSDP engine's overlap on the CUDA emulator's stream trace (tests/emulator/cuda_emulator.hpp): the
// dependency graph of one step, with the engine's schedule points marked in it ("G u": unit u's all-gather is
// issued next, "F u" / "B u": unit u's forward / backward starts computing, "R u": its reduction is issued next).
// Each property is checked on the graph itself (what waits for what), not on the engine's word.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "tests/emulator/cuda_emulator.hpp"

namespace shardtrain::testing_fsdp {

struct ScheduleExpectations {
  bool prefetch = true;          // unit i+1's all-gather is queued before unit i's first compute op, in forward and backward
  bool async_reductions = true;  // no compute op depends on a reduction before the next unit's work is queued
  bool offload_copies = false;   // shard-sized copies between pinned host memory and the device run off compute
  std::set<size_t> shard_bytes;  // offload: the sizes of the master and gradient shards' copies
};

struct ScheduleReport {
  std::vector<std::string> violations;  // one line each, naming the units and trace positions
  int prefetch_pairs = 0;               // consecutive units checked for prefetch
  int reductions = 0;                   // reduction collectives checked
  int offload_copies = 0;               // shard copies checked
  int gathers_waited = 0;               // side-stream all-gathers whose unit's compute waited for them by an event
};

ScheduleReport check_schedule(const std::vector<cuda_emulator::TraceOp>& trace, const ScheduleExpectations& expect);

}  // namespace shardtrain::testing_fsdp
