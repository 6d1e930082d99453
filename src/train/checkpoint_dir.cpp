// The checkpoint directory's claim: created and probed for writing at start, locked for the run's life
// (flock: released by the kernel when the process ends, killed or not, so a stale lock never blocks), and
// refused when it holds complete checkpoints the run would mix its own saves with.
#include "shardtrain/train/checkpoint_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/train/preflight.hpp"
#include "shardtrain/train/rank_agreement.hpp"

namespace fs = std::filesystem;

namespace shardtrain::train {
namespace {

std::string read_holder(int fd) {
  std::string text;
  char buf[4096];
  for (ssize_t n; text.size() < 65536 && (n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(text.size()))) > 0;)
    text.append(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string holder_text(const std::string& run_dir) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("host {}, pid {}, since {}, run directory {}\n", host, ::getpid(), stamp, run_dir);
}

}  // namespace

DirLock::Taken DirLock::take(const std::string& lock_path, const std::string& key, const std::string& run_dir,
                             std::string& holder, std::string& written) {
  release();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("{}: cannot create {}: {}", key, lock_path, std::strerror(errno)));
  Taken taken = Taken::Yes;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      holder = read_holder(fd);
      if (holder.empty()) holder = "its lock file " + lock_path + " is locked";
      ::close(fd);
      return Taken::HeldByAnother;
    }
    log::warn("{}: cannot lock {} ({}): nothing stops a second run from writing into {} at the same time", key, lock_path,
              std::strerror(err), fs::path(lock_path).parent_path().string());
    taken = Taken::NoLocks;
  }
  written = holder_text(run_dir);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, written.data(), written.size(), 0) < 0 || ::fsync(fd) != 0) {
    log::warn("{}: cannot record this run in {}: {}", key, lock_path, std::strerror(errno));
    written.clear();
  }
  if (taken == Taken::NoLocks) ::close(fd);
  else fd_ = fd;
  return taken;
}

void DirLock::release() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race with the next run's open)
  fd_ = -1;
}

bool DirLock::holds(const std::string& lock_path) const {
  struct stat held {
  }, there{};
  if (fd_ < 0 || ::fstat(fd_, &held) != 0 || ::stat(lock_path.c_str(), &there) != 0) return false;
  return held.st_nlink > 0 && held.st_dev == there.st_dev && held.st_ino == there.st_ino;
}

std::string DirLock::now_at() const {
  struct stat held {};
  if (fd_ < 0 || ::fstat(fd_, &held) != 0 || held.st_nlink == 0) return {};
  std::error_code ec;
  const fs::path path = fs::read_symlink(fmt::format("/proc/self/fd/{}", fd_), ec);
  struct stat there {};
  if (ec || ::stat(path.c_str(), &there) != 0 || there.st_dev != held.st_dev || there.st_ino != held.st_ino) return {};
  return path.string();
}

std::string lock_holder(const std::string& lock_path) {
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string holder;
  // A shared probe, released at once: it fails only while a run holds the exclusive lock.
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      holder = read_holder(fd);
      if (holder.empty()) holder = "its lock file " + lock_path + " is locked";
    }
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return holder;
}

bool resumes_from_outside(const std::string& dir, const std::string& resumed_from) {
  std::error_code ec;
  return !resumed_from.empty() && fs::weakly_canonical(resumed_from, ec).parent_path() != fs::weakly_canonical(dir, ec);
}

std::vector<std::string> checkpoints_beside(const std::string& dir, int64_t start_step, const std::string& resumed_from) {
  std::vector<std::string> out;
  std::error_code ec;
  const std::string own = resumed_from.empty() ? std::string() : fs::weakly_canonical(resumed_from, ec).string();
  // From a checkpoint elsewhere, the ones here are no part of what the run continues, older ones included: the rotation
  // removed them as this run's own (keep_last) once its saves passed them.
  const bool outside = resumes_from_outside(dir, resumed_from);
  for (const auto& [step, path] : checkpoint::complete_checkpoints(dir)) {
    if (!resumed_from.empty() && !outside && (step < start_step || fs::weakly_canonical(path, ec).string() == own)) continue;
    out.push_back(path);  // a fresh run's every one; a resumed run's newer ones, or another of its own step
  }
  return out;
}

std::string fresh_run_problem(const std::string& dir) {
  const std::vector<std::string> found = checkpoints_beside(dir, 0, "");
  if (found.empty()) return {};
  std::string names;
  for (size_t k = 0; k < found.size() && k < 4; ++k) names += (k ? ", " : "") + fs::path(found[k]).filename().string();
  if (found.size() > 4) names += fmt::format(" and {} more", found.size() - 4);
  return fmt::format(
      "checkpoint.dir {} holds {} complete checkpoint(s) ({}) and this run does not resume from them: its saves would be "
      "mixed with them (a step saved there is not saved again, and the rotation would remove this run's checkpoints in "
      "their favour). To continue them, add --resume auto; to start a new run, give it a checkpoint.dir of its own (or "
      "another logging.run_dir), or move them out of the directory first",
      dir, found.size(), names);
}

std::string set_aside_superseded(const std::string& path) {
  std::string target = path + ".superseded";
  for (int k = 2; fs::exists(target); ++k) target = fmt::format("{}.superseded-{}", path, k);
  std::error_code ec;
  fs::rename(path, target, ec);
  if (ec) throw IoError(fmt::format("cannot rename {} to {}: {}", path, target, ec.message()));
  return target;
}

CheckpointDirClaim::~CheckpointDirClaim() = default;

void CheckpointDirClaim::acquire(MPI_Comm world, const std::string& dir, const std::string& run_dir) {
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  dir_ = dir;
  run_dir_ = run_dir;
  int code = 0;
  std::string error, text;  // text: what rank 0 wrote into the lock file, which every rank then looks for
  if (rank == 0) {
    try {
      require_writable_dir("checkpoint.dir", dir, DirProbe::Create);
      std::string holder;
      // A file system without locks (a Lustre mount without -o flock, say): the run goes on, unprotected.
      const DirLock::Taken taken =
          lock_.take((fs::path(dir) / kCheckpointLockFile).string(), "checkpoint.dir", run_dir, holder, text);
      if (taken == DirLock::Taken::HeldByAnother) throw CheckpointError(dir_in_use_problem(dir, holder));
      locked_ = taken == DirLock::Taken::Yes;
    } catch (const Error& e) {
      code = static_cast<int>(e.code());
      error = e.what();
    }
  }
  // Every rank throws rank 0's error: one line from rank 0, the same exit code everywhere.
  ST_CHECK_MPI(MPI_Bcast(&code, 1, MPI_INT, 0, world));
  acquired_ = code == 0;
  if (code == 0) {
    check_every_rank_sees(world, rank, dir, text);
    return;
  }
  error = broadcast_text(world, 0, std::move(error));
  lock_.release();
  throw_typed(static_cast<ExitCode>(code), error, /*every_rank=*/true);
}

void CheckpointDirClaim::renew(MPI_Comm world) {
  if (!acquired_) return;
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  std::string problem;
  const std::string lock_path = (fs::path(dir_) / kCheckpointLockFile).string();
  if (rank == 0 && locked_ && !lock_.holds(lock_path)) {
    // Moved (`mv ckpt elsewhere`), not removed: the checkpoints are there, and the warning below says where.
    const std::string moved_to = lock_.now_at();
    try {
      require_writable_dir("checkpoint.dir", dir_, DirProbe::Create);
      std::string holder, text;
      const DirLock::Taken taken = lock_.take(lock_path, "checkpoint.dir", run_dir_, holder, text);
      locked_ = taken != DirLock::Taken::NoLocks;  // held by another: every later save looks again, and fails
      if (taken == DirLock::Taken::HeldByAnother)
        problem = fmt::format(
            "checkpoint.dir {} was removed while this run held it, and another run has claimed it since ({}): this "
            "run's saves there would mix with that run's checkpoints, so none is made; stop one of the two runs",
            dir_, holder);
      else if (!moved_to.empty())
        log::warn(
            "checkpoint.dir {}: the directory was moved to {} while this run held it, with its checkpoints: this run's "
            "later checkpoints go into {}, made again and locked again. Its checkpoints are now in two directories: "
            "move the new ones beside the old, or resume from either with --checkpoint.dir",
            dir_, fs::path(moved_to).parent_path().string(), dir_);
      else
        log::warn(
            "checkpoint.dir {}: the directory or its lock file was removed while this run held it (the checkpoints in it "
            "are gone with it): made again and locked again, so that no second run takes it",
            dir_);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  problem = lowest_error(world, rank, problem);
  if (!problem.empty()) throw IoError(problem);
}

void CheckpointDirClaim::check_every_rank_sees(MPI_Comm world, int rank, const std::string& dir, std::string text) {
  text = broadcast_text(world, 0, std::move(text));
  if (text.empty()) return;  // rank 0 could not write its lock file: nothing to look for
  std::string problem;
  if (rank != 0) {
    // A file another node's client has not looked up before is read from the server; a few tries cover a client that
    // is slow to see it all the same.
    const std::string lock = (fs::path(dir) / kCheckpointLockFile).string();
    std::string seen;
    for (int attempt = 0; attempt < 50; ++attempt) {
      const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
      seen = fd >= 0 ? read_holder(fd) : std::string();
      if (fd >= 0) ::close(fd);
      if (seen + "\n" == text) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (seen + "\n" != text)
      problem = fmt::format(
          "checkpoint.dir {}: this rank (on {}) does not see the directory rank 0 claimed: its lock file {} is {} there. Every "
          "rank writes its part of each checkpoint into that directory, so it must be one directory that every rank "
          "sees at the same path: a shared file system, not a node-local disk (nor a relative path under different "
          "working directories). Otherwise every save fails, and the training done is lost",
          dir, failure_record::node_name(), lock,
          seen.empty() ? std::string("missing") : fmt::format("another run's ({})", seen));
  }
  problem = lowest_error(world, rank, problem);
  if (problem.empty()) return;
  lock_.release();
  acquired_ = false;
  throw on_every_rank(CheckpointError(problem));
}

std::string dir_in_use_problem(const std::string& dir, const std::string& holder) {
  return fmt::format(
      "checkpoint.dir {} is in use by another run ({}): two runs saving into one directory would mix their checkpoints; "
      "give this run a checkpoint.dir of its own (or another logging.run_dir), or wait for that run to end",
      dir, holder);
}

std::string run_dir_in_use_problem(const std::string& dir, const std::string& holder) {
  return fmt::format(
      "logging.run_dir {} is in use by another run ({}): two runs writing one directory mix their metrics.jsonl, "
      "config.toml and result.json (a resume from it would continue the wrong run); give this run a logging.run_dir "
      "of its own, or wait for that run to end",
      dir, holder);
}

std::string checkpoint_dir_holder(const std::string& dir) {
  return lock_holder((fs::path(dir) / kCheckpointLockFile).string());
}

}  // namespace shardtrain::train
