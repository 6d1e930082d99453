// Temporaries that a stop signal does not leave behind.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain {

// The name of a temporary this process writes beside `out` before renaming it into place: OUT.KIND-HOST-PID (KIND
// "tmp", or prepare-data's "tokens-tmp"; HOST this machine's name). Host and PID tell a later run whether the process
// that made it still runs (sweep_dead_temporaries), and tell the user which node's process it was.
std::string temporary_beside(const std::string& out, std::string_view kind = "tmp");

// The start of the name of every temporary of KIND beside an output named `name` (its file name, without the folder):
// "NAME.KIND-", then the host, a dash and the PID. A name too long to take all that within a file system's 255 bytes
// (NAME_MAX) is cut, the same for every host (room is kept for the longest host name, a PID and a "-N"): an output of
// a legal name must not fail for its temporary's ("File name too long" at the end of a prepare-data).
std::string temporary_stem(std::string_view name, std::string_view kind);

// Removes the temporaries beside `out` (OUT.KIND-HOST-PID, OUT.KIND-HOST-PID-N; any of `kinds`) that a process of
// this host made and that no longer runs: what SIGKILL (the kernel's out-of-memory killer, a scheduler's last resort)
// leaves, since no handler runs then; a killed 40 GB export stayed until the user found it. Another host's, this
// process's and a running process's are left alone, as is anything not named so. Returns the paths removed, for
// the caller to say.
std::vector<std::string> sweep_dead_temporaries(const std::string& out, std::initializer_list<std::string_view> kinds);

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
