// The hang watchdog: every collective is timed, and one that does not finish within the timeout ends
// the whole job (MPI_Abort with ExitCode::Timeout) with a message naming the collective, its axis and
// size, this rank, what the job was doing (the step and unit the training loop and engine set), and
// the ranks of that axis that did not arrive: the firing rank asks every peer of the axis, over a
// private duplicate of MPI_COMM_WORLD that the watchdog thread serves, how many collectives it has
// entered on that axis and what it is doing. A peer that does not answer is dead or not making MPI
// progress. A rank that never arrives leaves the others blocked in the collective: their watchdogs fire.
// Time this process spent stopped (Ctrl-Z, SIGSTOP, a paused machine) is not counted (PauseDetector, pause.hpp).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/comm/communicator.hpp"

namespace shardtrain {

// One collective as a communicator enters it.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::Barrier;
  MeshAxis axis = MeshAxis::World;
  uint64_t bytes = 0;
  uint64_t seq = 0;                         // collectives entered on this communicator, this one included
  const std::vector<int>* group = nullptr;  // world ranks of the axis group (may be empty: unknown)
};

// What a peer said about itself when asked about one collective (axis, seq).
struct PeerReport {
  enum class Status { Arrived, Behind, Ahead, NoAnswer };
  int world_rank = -1;
  Status status = Status::NoAnswer;
  uint64_t entered = 0;        // collectives the peer has entered on the axis asked about
  bool in_collective = false;  // the peer's own collective in flight, if any:
  CollectiveKind kind = CollectiveKind::Barrier;
  MeshAxis axis = MeshAxis::World;
  int64_t step = -1;  // the peer's step (-1: none set)
};

// The part of the timeout message about the peers asked about collective `seq` on `axis`, e.g.
// "ranks that did not arrive: 1 (at step 3, not in a collective; 1 collective behind); arrived: 0, 2-3".
std::string describe_peer_reports(MeshAxis axis, uint64_t seq, const std::vector<PeerReport>& reports);

class CollectiveWatchdog {
 public:
  // timeout <= 0: disabled (nothing is started). Enabled with MPI active: collective over
  // MPI_COMM_WORLD (every rank creates its watchdog at the same point, with the same timeout).
  explicit CollectiveWatchdog(std::chrono::duration<double> timeout);
  ~CollectiveWatchdog();  // stops the thread (its pending receive cancelled): before MPI_Finalize
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  bool enabled() const { return timeout_.count() > 0; }
  // What the job is doing, for the message: the training loop sets the step, the FSDP engine the unit.
  void set_step(int64_t step);
  void set_unit(const std::string& unit);

  // Asks every other rank of `group` (world ranks) about collective `seq` on `axis` and waits up to
  // `wait` for the answers; one report per other rank of the group. Collective in spirit: the peers'
  // watchdog threads answer. What fire() does on a timeout, callable from any thread (for tests).
  // Empty when the watchdog is disabled or MPI is not active.
  std::vector<PeerReport> survey(MeshAxis axis, uint64_t seq, const std::vector<int>& group,
                                 std::chrono::duration<double> wait);

  // Device-asynchronous collectives (NCCL): issuing one returns at once, so no Guard can time it. The
  // communicator hands each one over after issuing it, with `done` (a CUDA event query: true once it has
  // finished on the device) and `abort` (ncclCommAbort: releases the stream the collective blocks). The
  // thread drops finished ones in issue order; when the oldest unfinished one has run past the timeout it ends the
  // job as for a host collective (survey of the axis, message, failure record) and calls `abort` last, just before
  // MPI_Abort: the training thread, released by it, went on issuing collectives on the aborted communicator for the
  // survey's seconds (NCCL's use-after-free).
  void watch_async(const CollectiveCall& call, std::function<bool()> done, std::function<void()> abort);
  // Device collectives issued and not yet seen finished.
  size_t async_in_flight();
  // An asynchronous error source (ncclCommGetAsyncError), polled every tick: a non-empty message ends the
  // job with ExitCode::Comm, `abort` called after the message and record, just before MPI_Abort. remove_error_source
  // before the communicator goes away.
  int add_error_source(std::function<std::string()> poll, std::function<void()> abort);
  void remove_error_source(int id);

  // Marks one collective in flight for the lifetime of the guard.
  class Guard {
   public:
    Guard(CollectiveWatchdog* w, const CollectiveCall& call);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    CollectiveWatchdog* w_;
  };

 private:
  struct Mailbox;  // the private communicator, its posted receive and the answers in flight (watchdog.cpp)
  struct Survey {  // a survey asked of the watchdog thread
    MeshAxis axis;
    uint64_t seq;
    std::vector<int> group;
    std::chrono::duration<double> wait;
    std::optional<std::vector<PeerReport>> result;
  };

  struct AsyncCall {
    CollectiveCall call;
    std::vector<int> group;  // a copy: the entry may outlive the call's communicator
    std::chrono::steady_clock::time_point started;
    double stopped = 0;  // seconds of it this process was stopped (started moved on by them)
    std::function<bool()> done;
    std::function<void()> abort;
  };
  struct ErrorSource {
    std::function<std::string()> poll;
    std::function<void()> abort;
  };

  void run(std::chrono::steady_clock::time_point created);
  void serve(Survey* survey, int64_t token, std::vector<PeerReport>* reports);
  std::vector<PeerReport> run_survey(const Survey& s);
  [[noreturn]] void fire(double waited);
  // `stopped`: seconds this process was stopped during the collective, not counted in `waited`. `release`: called last,
  // before MPI_Abort (ncclCommAbort of the communicator a device collective blocks).
  [[noreturn]] void report_and_abort(const CollectiveCall& call, const std::vector<int>& group, double waited,
                                     double stopped, const char* where, const std::function<void()>& release = {});
  // With the mutex held: `paused` of the time since the thread's last wake this process was stopped; the collectives in
  // flight are timed as if it had not been.
  void discount_pause(std::chrono::steady_clock::duration paused);
  // With the mutex held: drops finished device collectives; fires (unlocking) on one past the timeout or on
  // an asynchronous error.
  void check_async(std::unique_lock<std::mutex>& lock);

  std::chrono::duration<double> timeout_;
  std::unique_ptr<Mailbox> mailbox_;
  std::mutex mutex_;
  std::condition_variable wake_, surveyed_;
  bool stop_ = false;
  // The collective in flight.
  bool in_flight_ = false;
  CollectiveCall call_;
  std::chrono::steady_clock::time_point started_;
  double stopped_ = 0;  // seconds of it this process was stopped (started_ moved on by them)
  // Per axis (MeshAxis as index): the seq of the last collective entered there.
  std::array<uint64_t, 3> entered_{};
  int64_t step_ = -1;
  std::string unit_;
  std::deque<AsyncCall> async_;  // device collectives in issue order
  std::map<int, ErrorSource> error_sources_;
  int next_error_source_ = 0;
  Survey* survey_request_ = nullptr;  // set by survey(), run and answered by the thread
  int64_t next_token_ = 0;
  std::thread thread_;
};

}  // namespace shardtrain
