// A limit on stretches of host work that no collective watchdog covers: a rank that never reaches a host
// collective (a file system that stopped answering, NCCL that cannot reach a peer at its start) would otherwise
// hold every other rank, and the job's allocation, until the time limit, saying nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "shardtrain/runtime/pause.hpp"

namespace shardtrain {

// Stretches follow one another (`begin`), each timed from its own start against its own limit. When one runs past
// it, `expire` is called on the deadline's thread with that stretch; it is to end the process (MPI_Abort). One that
// returns (a test's) ends the timing for good. Time the process spent stopped is not counted (PauseDetector): the thread
// wakes every kWake to see it.
class Deadline {
 public:
  struct Stretch {
    std::string what;  // "opening the datasets"
    double limit = 0;  // seconds; 0: not timed
    std::string key;   // the setting that sets the limit, for the message ("fsdp.collective_timeout")
    // Seconds past the limit before a stretch that waits on other ranks expires: every rank times its own stretch,
    // and the rank they wait for, held up in a stretch of its own, is the one that knows what is wrong and speaks
    // first (its abort ends the others). 0 for a stretch that does not wait on other ranks.
    double grace = 0;
    // Seconds this process was stopped during the stretch (Ctrl-Z, SIGSTOP, a paused machine): not counted, so that a
    // job paused and continued goes on; set when the stretch expires, for its message (stopped_note, pause.hpp).
    double stopped = 0;
  };
  using Expire = std::function<void(const Stretch&)>;
  // A stretch this long or longer (limit + grace, about three years) is not timed.
  static constexpr double kNoLimitSeconds = 1e8;
  static constexpr std::chrono::milliseconds kWake{100};

  explicit Deadline(Expire expire);
  ~Deadline();  // stops timing; joins the thread
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  // Times `s` from now (the previous stretch ends). The thread starts with the first stretch that has a limit.
  void begin(Stretch s);
  void end();  // nothing timed until the next begin
  // Times `s` from `started` (a stretch that began before this deadline existed), against `limit` as given.
  void begin_at(Stretch s, std::chrono::steady_clock::time_point started);

 private:
  void watch();

  Expire expire_;
  std::mutex mutex_;
  std::condition_variable cv_;
  Stretch stretch_;
  std::chrono::steady_clock::time_point started_{};
  std::chrono::steady_clock::time_point begun_{};  // when begin_at was called: a pause after it is the stretch's
  double stopped_ = 0;  // seconds of the stretch's time that were a pause (started_ moved on by them)
  bool timing_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace shardtrain
