#include "shardtrain/runtime/deadline.hpp"

#include <algorithm>

namespace shardtrain {

Deadline::Deadline(Expire expire) : expire_(std::move(expire)) {}

Deadline::~Deadline() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Deadline::begin(Stretch s) { begin_at(std::move(s), std::chrono::steady_clock::now()); }

void Deadline::begin_at(Stretch s, std::chrono::steady_clock::time_point started) {
  {
    std::lock_guard lock(mutex_);
    timing_ = s.limit > 0;
    stretch_ = std::move(s);
    started_ = started;
    begun_ = std::chrono::steady_clock::now();
    stopped_ = 0;
    if (timing_ && !thread_.joinable()) thread_ = std::thread([this] { watch(); });
  }
  cv_.notify_one();
}

void Deadline::end() {
  {
    std::lock_guard lock(mutex_);
    timing_ = false;
  }
  cv_.notify_one();
}

void Deadline::watch() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock lock(mutex_);
  // From the stretch's begin, not this thread's start, nor its wake after an untimed wait: the process may be stopped
  // between the two (right after begin: a test's SIGSTOP did), and that pause is the stretch's.
  PauseDetector pauses(kWake, begun_);
  while (!stop_) {
    // Past about three years a limit is no limit. Far beyond it, from 9.2e9 s, the cast to the clock's int64
    // nanoseconds overflowed into the past: a start-up timeout of 1e10 s ended every start at once (exit 10).
    if (!timing_ || stretch_.limit + stretch_.grace >= kNoLimitSeconds) {
      cv_.wait(lock);
      pauses.reset(begun_);  // a pause while nothing was timed does not matter
      continue;
    }
    const auto now = Clock::now();
    // A stopped process's stretch is not late: its time stopped moves the start on. A stretch the training thread
    // began after the continue, before this wake, is moved on to now at most.
    const Clock::duration paused = pauses.wake(now);
    if (paused > Clock::duration::zero()) {
      const double seconds = std::chrono::duration<double>(paused).count();
      started_ = std::min(started_ + paused, now);
      stopped_ += seconds;
      log_stopped(seconds, "during " + stretch_.what, stretch_.key);
    }
    // Due is worked out again at every wake: a new stretch may have begun meanwhile.
    const auto due = started_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(stretch_.limit + stretch_.grace));
    if (now >= due) {
      Stretch expired = stretch_;
      expired.stopped = stopped_;
      lock.unlock();
      expire_(expired);  // ends the process
      return;
    }
    cv_.wait_until(lock, std::min(due, now + kWake));
  }
}

}  // namespace shardtrain
