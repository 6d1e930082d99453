// The hang watchdog: every collective is timed, and one that does not finish within the timeout ends
// the whole job (MPI_Abort with ExitCode::Timeout) with a message naming the collective, its axis and
// size, this rank, and what the job was doing (the context the training loop sets: step and unit).
// A rank that never arrives leaves the others blocked in the collective: their watchdogs fire.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "shardtrain/comm/communicator.hpp"

namespace shardtrain {

class CollectiveWatchdog {
 public:
  // timeout <= 0: disabled (nothing is started).
  explicit CollectiveWatchdog(std::chrono::duration<double> timeout);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  bool enabled() const { return timeout_.count() > 0; }
  // What the job is doing, for the message: the training loop sets the step, the FSDP engine the unit.
  void set_step(int64_t step);
  void set_unit(const std::string& unit);

  // Marks one collective in flight for the lifetime of the guard.
  class Guard {
   public:
    Guard(CollectiveWatchdog* w, CollectiveKind kind, MeshAxis axis, uint64_t bytes);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    CollectiveWatchdog* w_;
  };

 private:
  void run();
  [[noreturn]] void fire(double waited);

  std::chrono::duration<double> timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool in_flight_ = false;
  CollectiveKind kind_ = CollectiveKind::Barrier;
  MeshAxis axis_ = MeshAxis::World;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point started_;
  int64_t step_ = -1;
  std::string unit_;
  std::thread thread_;
};

}  // namespace shardtrain
