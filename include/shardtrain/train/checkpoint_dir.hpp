// A run's claim on its checkpoint directory (docs/checkpoints.md, "One run per checkpoint directory"): rank 0
// creates it, proves it can be written, and holds an exclusive lock on a file in it for the run's life, so a
// second run saving there (which would assemble checkpoints from both) is refused at start. And a run never mixes
// its saves with complete checkpoints it did not resume from (their steps' saves would be skipped and its own
// rotated away in their favour): a fresh run beside them is refused, a run branched from an older checkpoint sets
// the newer ones aside. `shardtrain check` asks the same questions offline.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::train {

// The lock file inside the checkpoint directory; it holds "host H, pid P, since T, run directory R".
inline constexpr const char* kCheckpointLockFile = ".shardtrain.lock";
// The lock file inside the run directory (logging.run_dir), the same way: one run writes its metrics, config.toml and
// result.json at a time.
inline constexpr const char* kRunDirLockFile = ".shardtrain-run.lock";

// An exclusive lock (flock) on a lock file, held while the object lives and released by the kernel when the process
// ends, killed or not (a stale lock never blocks); the file records its holder ("host H, pid P, since T, run
// directory R").
class DirLock {
 public:
  enum class Taken { Yes, HeldByAnother, NoLocks };
  DirLock() = default;
  ~DirLock() { release(); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Opens (creating) `lock_path`, locks it without waiting and writes this process's holder text into it.
  // HeldByAnother: `holder` says who holds it ("its lock file PATH is locked" when it says nothing). NoLocks: the file
  // system has no locks (Lustre without -o flock): warned about, the text written, nothing held. `written`: the text,
  // or "" when it could not be written. IoError naming `key` when the file cannot be created.
  Taken take(const std::string& lock_path, const std::string& key, const std::string& run_dir, std::string& holder,
             std::string& written);
  void release();
  // Whether the file this lock holds is still the one at `lock_path`: not when the file, or the directory it was in,
  // was removed (the lock went with it: nothing then stops a second run) or replaced.
  bool holds(const std::string& lock_path) const;
  bool held() const { return fd_ >= 0; }  // a lock is held (not: none taken, another's, or a file system without locks)
  // Where the held file is now, by its open descriptor (/proc/self/fd): "" when it was removed, none is held, or the
  // system cannot tell. A directory moved (`mv`) while held takes the file with it: this is its new path.
  std::string now_at() const;

 private:
  int fd_ = -1;
};
// Who holds the lock file `lock_path` now ("" when nobody does, or it cannot be told). Only looks.
std::string lock_holder(const std::string& lock_path);

class CheckpointDirClaim {
 public:
  CheckpointDirClaim() = default;
  ~CheckpointDirClaim();
  CheckpointDirClaim(const CheckpointDirClaim&) = delete;
  CheckpointDirClaim& operator=(const CheckpointDirClaim&) = delete;

  // Collective over `world`. Rank 0 creates `dir` and checks that it can be written (IoError naming the path and the
  // file system's reason: exit code 8) and locks it (CheckpointError naming the holder when another run holds it:
  // 5). Every rank throws the same error. A file system without locks (flock unsupported) is warned about and used
  // unlocked. Then every rank looks for the lock file rank 0 wrote: a rank that does not see it (a node-local disk, a
  // relative path under another working directory) is a CheckpointError on every rank, naming the rank and its host.
  // Before, every save of such a run failed (the other nodes never see the save's temporary directory), and the run
  // trained on until checkpoint.max_failed_saves or its end, to exit 8 with its training lost.
  void acquire(MPI_Comm world, const std::string& dir, const std::string& run_dir);
  bool acquired() const { return acquired_; }  // on every rank, once acquire() returned
  // Collective over `world`, before each save. A directory removed while the run held it (rm -rf of the checkpoints
  // mid-run) took the lock with it, and the save would make it again unlocked, open to a second run: rank 0 makes it
  // again and takes the lock again, with a warning. IoError on every rank (a failed save) when it cannot, or when
  // another run claimed the directory meanwhile: a save there would mix with that run's checkpoints.
  void renew(MPI_Comm world);
  const std::string& dir() const { return dir_; }

 private:
  DirLock lock_;  // rank 0's
  void check_every_rank_sees(MPI_Comm world, int rank, const std::string& dir, std::string text);

  bool acquired_ = false;
  bool locked_ = false;  // rank 0 holds the lock (not on a file system without locks)
  std::string dir_, run_dir_;
};

// The complete checkpoints of `dir` that a run starting at `start_step` did not come from: with `resumed_from` ""
// (a fresh run) or outside `dir` all of them; else those newer than `start_step`, and one of that step that is not
// `resumed_from`.
std::vector<std::string> checkpoints_beside(const std::string& dir, int64_t start_step, const std::string& resumed_from);
// Whether `resumed_from` (a checkpoint) is not one of `dir`'s own.
bool resumes_from_outside(const std::string& dir, const std::string& resumed_from);
// The refusal of a fresh run in a directory holding complete checkpoints ("" when it holds none): one line naming
// the directory, the checkpoints and what to do. Exit code 5.
std::string fresh_run_problem(const std::string& dir);
// Renames a checkpoint a branched run does not continue to PATH.superseded (.superseded-2, ...): no longer a step
// directory, so never resumed, rotated or skipped over, and never deleted. Returns the new name (IoError on failure).
std::string set_aside_superseded(const std::string& path);

// The refusal of a run whose logging.run_dir another run holds (its kRunDirLockFile locked): one line naming the
// directory, the holder and what to do. Exit code 3.
std::string run_dir_in_use_problem(const std::string& dir, const std::string& holder);

// Who holds the lock of `dir` now ("" when nobody does, or it cannot be told): for `shardtrain check`. Only looks.
std::string checkpoint_dir_holder(const std::string& dir);
// The refusal of a run whose checkpoint directory another run holds: one line naming the directory, the holder and
// what to do. Exit code 5.
std::string dir_in_use_problem(const std::string& dir, const std::string& holder);

}  // namespace shardtrain::train
