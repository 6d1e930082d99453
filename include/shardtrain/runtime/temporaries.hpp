// Temporaries that a stop signal does not leave behind.
#pragma once

#include <string>

namespace shardtrain {

// While one lives, the temporary file or folder at `path` (an offline command's OUT.tmp-PID beside its output) is
// removed if SIGINT, SIGTERM or SIGHUP ends the process: Ctrl-C, a Slurm time limit, a closed terminal. Their owners
// already remove them on an error, in destructors that a signal's default action never runs; a 40 GB
// `OUT.tokens-tmp-PID` of prepare-data stayed after each Ctrl-C. The handler is installed for a signal only where its
// disposition is the default (train's own stop handlers stay); it removes what is registered (a folder one level
// deep: the files in it, then the folder), restores the default and raises the signal again, so the process ends as it
// would have. The path is forgotten, not removed, when the guard is destroyed: the owner renames or removes it.
// At most 16 at once; beyond that a guard does nothing (the owner's own clean-up still runs on errors).
class SweptOnSignal {
 public:
  explicit SweptOnSignal(const std::string& path);
  ~SweptOnSignal();
  SweptOnSignal(const SweptOnSignal&) = delete;
  SweptOnSignal& operator=(const SweptOnSignal&) = delete;

 private:
  int slot_ = -1;
};

}  // namespace shardtrain
