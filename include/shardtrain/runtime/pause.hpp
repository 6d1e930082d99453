// Time the process spent stopped (Ctrl-Z, SIGSTOP then SIGCONT, a virtual machine paused by its host), told apart
// from time spent waiting, so that the watchdogs time a collective or a save and not the user's pause: a stopped
// process's threads all stop, so a watchdog thread that wakes every period finds far more than a period gone at its
// first wake after the continue, and only then.
//
// Why a gap between wakes and not a clock that stops with the process: CLOCK_PROCESS_CPUTIME_ID (or a thread's)
// advances only while a thread runs on a CPU, so a collective blocked in the kernel (a poll, a futex, NCCL's blocking
// wait) would never time out, and MPI's busy polling advances it by up to one second per polling thread per second:
// neither is the wall time a timeout means. A SIGCONT handler sees Ctrl-Z and SIGSTOP but not a paused virtual machine
// (no signal), cannot tell when the stop began, and would take the signal's disposition from the program. Suspend to
// RAM needs nothing: steady_clock (CLOCK_MONOTONIC) stops while the machine sleeps.
#pragma once

#include <chrono>
#include <string>

namespace shardtrain {

// For a watchdog's message: ", not counting 6.0 s this process was stopped (Ctrl-Z, SIGSTOP or a paused machine)";
// empty for none. Outside the parentheses naming the setting: failure_record::restartable looks for those.
std::string stopped_note(double seconds);
// One warning for one pause: that `seconds` are not counted against `key` (`where`: "during the save of step 4").
void log_stopped(double seconds, const std::string& where, const std::string& key);

class PauseDetector {
 public:
  using Clock = std::chrono::steady_clock;
  // A wake this much later than the period is a pause. Far beyond a thread's scheduling delay on a loaded machine
  // (milliseconds), well under any timeout worth setting (seconds). A thread starved of the CPU longer than this is
  // taken for paused too: that only delays a timeout, never fires one.
  static constexpr std::chrono::seconds kLateness{1};

  PauseDetector(Clock::duration period, Clock::time_point now) : period_(period), last_(now) {}

  // At a wake of the watching thread: the part of the time since its previous wake (or reset) that the process spent
  // stopped, zero when it was not.
  Clock::duration wake(Clock::time_point now) {
    const Clock::duration late = now - last_ - period_;
    last_ = now;
    return late > kLateness ? late : Clock::duration::zero();
  }
  // After work of the thread's own that may take longer than kLateness (a survey of the peers): not a pause.
  void reset(Clock::time_point now) { last_ = now; }

 private:
  Clock::duration period_;
  Clock::time_point last_;
};

}  // namespace shardtrain
