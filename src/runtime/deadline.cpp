#include "shardtrain/runtime/deadline.hpp"

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
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (!timing_) {
      cv_.wait(lock);
      continue;
    }
    // Past about three years a limit is no limit. Far beyond it, from 9.2e9 s, the cast to the clock's int64
    // nanoseconds overflowed into the past: a start-up timeout of 1e10 s ended every start at once (exit 10).
    if (stretch_.limit + stretch_.grace >= kNoLimitSeconds) {
      cv_.wait(lock);
      continue;
    }
    // Due is worked out again at every wake: a new stretch may have begun meanwhile.
    const auto due = started_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(stretch_.limit + stretch_.grace));
    if (std::chrono::steady_clock::now() >= due) {
      const Stretch expired = stretch_;
      lock.unlock();
      expire_(expired);  // ends the process
      return;
    }
    cv_.wait_until(lock, due);
  }
}

}  // namespace shardtrain
