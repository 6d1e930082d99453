// Faults injected for tests through SHARDTRAIN_FAULT (docs/training.md): the plan, its parser, and the
// injection of one rank's fault. The loop asks the plan before each step; nothing here runs otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain::train {

// One rank's fault before a (1-based) step: "stall:RANK@STEP" sleeps in the loop (the watchdog thread
// still answers), "kill:RANK@STEP" raises SIGKILL on the process, "freeze:RANK@STEP" raises SIGSTOP
// (every thread stops: a rank that no longer makes MPI progress), "device_error:RANK@STEP" throws the device
// error a failing GPU gives (exit code 7), "mce:RANK@STEP" sends the rank the SIGBUS (BUS_MCEERR_AR) the kernel
// sends on an uncorrectable host memory error. "...@STEP@NODE" strikes only where the rank runs on NODE
// (failure_record::node_name: Slurm's node name, else the host name): a bad node, gone once the job moves.
struct RankFault {
  enum class Kind { Stall, Kill, Freeze, DeviceError, MachineCheck };
  Kind kind = Kind::Stall;
  int rank = 0;
  int64_t step = 1;
  std::string node;  // "" = on any node
};
const char* rank_fault_name(RankFault::Kind k);  // "stall", "kill", "freeze", "device_error", "mce"
// Strikes this process with `f`: sleeps, signals itself or throws the device error; returns only from a stall
// or a freeze once continued.
void inject(const RankFault& f);

// Faults separated by ';', each "nan_grad:3,5,7-9" (a NaN in every rank's gradient shard after the backward of
// those steps), "slow_update:MS" (the host update on its worker thread sleeps MS ms before each shard: CPU
// offload's overlap with a slow host, which any read of a shard before its update is done turns into wrong
// losses) or a RankFault, e.g. "nan_grad:2;kill:1@5".
// "bad_data:FIRST-LAST" poisons the gradient of every step whose global batch reads any of the samples
// FIRST..LAST (0-based, counted over all ranks in the first epoch's order): bad data rather than a bad step, so
// it strikes again unless a rollback skips that data.
struct FaultPlan {
  std::vector<int64_t> nan_grad_steps;
  std::vector<std::pair<uint64_t, uint64_t>> bad_samples;  // [first, last] of epoch 0
  int slow_update_ms = 0;
  int slow_step_ms = 0;  // "slow_step:MS": every rank sleeps MS ms before each step (outside its timing), so a
                         // test can signal a run of a tiny model part-way on any machine
  std::vector<RankFault> rank_faults;
  static FaultPlan parse(const std::string& spec);  // "" = none; throws UsageError naming SHARDTRAIN_FAULT
  bool nan_grad_at(int64_t step) const;
  // Whether a global batch of epoch `epoch` covering samples [first, first + count) reads bad data.
  bool bad_data_in(uint64_t epoch, uint64_t first, uint64_t count) const;
  const RankFault* rank_fault_at(int rank, int64_t step) const;  // nullptr: none
  void check_ranks(int world_size) const;                        // throws UsageError for a rank outside the world
};

}  // namespace shardtrain::train
