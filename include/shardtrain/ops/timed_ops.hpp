// The timed ops: an Ops that forwards every call to another (the CPU backend) and adds the call's wall time to an
// OpTimes under the call's key (op_calls.hpp), so that real training steps give the times their ops take inside
// them, caches and the other ranks' load included (`shardtrain bench step --ops-profile`, for `shardtrain predict`).
// The CPU backend is synchronous, so a call's wall time is the op's. A CUDA call only queues a kernel: its time would
// need events around every call, which these ops do not do, and they refuse CUDA ops.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardtrain/ops/op_calls.hpp"
#include "shardtrain/ops/ops.hpp"

namespace shardtrain::ops {

// Each key's calls and seconds, in periods (a training step each) that end_period() closes. While disabled (the
// default) the timed ops forward their calls and neither describe nor time them. Safe to share among threads.
class OpTimes {
 public:
  struct Period {
    int64_t calls = 0;
    double seconds = 0;
    double cpu_seconds = 0;  // the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
  };
  struct Key {
    OpCall call;                  // its first call, described
    std::vector<Period> periods;  // one per closed period that called it
    Period open;                  // the calls since the last end_period()
  };
  // One key over the closed periods.
  struct Summary {
    OpCall call;
    int64_t calls = 0;            // in all closed periods
    double calls_per_period = 0;  // calls / closed periods (those that did not call it too)
    double seconds = 0;           // per call: the median over the periods that called it of the period's mean per call
    double seconds_mean = 0;      // per call: all seconds / all calls
    // Per call, as `seconds`, of the calling thread's CPU time: with one thread a rank, the op's work without the
    // time other processes held the core (what predict scales when ranks share the cores).
    double cpu_seconds = 0;
  };

  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void add(OpCall call, double seconds, double cpu_seconds = 0);
  void end_period();  // the open calls of every key become a period of theirs
  int64_t periods() const;
  std::vector<Summary> summary() const;  // by key, over the closed periods; open calls are left out

 private:
  std::atomic<bool> enabled_ = false;
  mutable std::mutex mutex_;
  std::map<std::string, Key> keys_;
  int64_t periods_ = 0;
};

// `inner` with every call timed into `times` while it is enabled; make_side_ops wraps the inner's side ops into the
// same `times`, which must outlive the ops and their side ops. Throws InternalError for CUDA ops (see above).
std::unique_ptr<Ops> make_timed_ops(std::unique_ptr<Ops> inner, OpTimes& times);

}  // namespace shardtrain::ops
