// Internal: fault injection for the checkpoint tests, from SHARDTRAIN_CHECKPOINT_FAULT (read at each
// save, so nothing is cached): "stall_before_publish:SECONDS[@STEP]" sleeps after the files are written and
// before they are published (a kill then lands mid-save); "slow_write:SECONDS[@STEP]" sleeps before a rank
// file is written (a slow file system: an asynchronous save is then still writing while training goes on);
// "fail_write" makes writing fail.
#pragma once

#include <cstdint>
#include <string>

namespace shardtrain::checkpoint {

struct CheckpointFault {
  double stall_before_publish = 0;  // seconds
  int64_t only_step = -1;           // stall only the save of this step ("stall_before_publish:20@4"); -1: every save
  double slow_write = 0;            // seconds, before each rank file is written (only_step applies)
  bool fail_write = false;
  bool applies_to(int64_t step) const { return only_step < 0 || only_step == step; }
};

CheckpointFault checkpoint_fault_from_env();

}  // namespace shardtrain::checkpoint
