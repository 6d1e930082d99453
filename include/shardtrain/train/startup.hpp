// The start-up's watch (docs/training.md, "Start-up"): from the configuration's agreement to the first step, host
// collectives that the collective watchdog does not see (it is made with the communicators, and watches those), and
// file work every other rank waits on. Each stage is timed against fsdp.startup_timeout, or against
// checkpoint.save_timeout for one that reads or tidies checkpoints; a stage past its limit ends the job with exit code
// 10, naming the stage, the rank and its host. Before: a rank whose file system stopped answering, or whose NCCL could
// not reach a peer, held every rank and the allocation until the job's time limit, saying nothing.
#pragma once

#include <string>

#include "shardtrain/runtime/deadline.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

class StartupWatch {
 public:
  // `failure_dir`: the run directory a stage that times out leaves this rank's failure record in, where the trainer
  // has not enabled the records yet (train: logging.run_dir; "" for none: evaluate, whose config is the checkpoint's
  // run, not its own).
  explicit StartupWatch(const TrainConfig& config, std::string failure_dir = {});
  void stage(std::string what);             // timed against fsdp.startup_timeout
  void checkpoint_stage(std::string what);  // timed against checkpoint.save_timeout
  void done();                              // the first step is next: the collective watchdog takes over

 private:
  double startup_timeout_, save_timeout_;
  Deadline deadline_;
};

// `watch`'s stage, where there is a watch (a trainer built by another command has none).
inline void startup_stage(StartupWatch* watch, std::string what) {
  if (watch) watch->stage(std::move(what));
}
inline void startup_checkpoint_stage(StartupWatch* watch, std::string what) {
  if (watch) watch->checkpoint_stage(std::move(what));
}

}  // namespace shardtrain::train
