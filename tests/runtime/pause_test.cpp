// Time the process spent stopped, not counted by the watchdogs: PauseDetector on an injected clock (exact), and a
// Deadline in a child process stopped with SIGSTOP and continued with SIGCONT (the real thing: every thread stops). No
// assertion rests on how fast this machine is: the child's stretch has 2 s of running time to end in, and it needs
// a pipe's byte.
#include "shardtrain/runtime/pause.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "shardtrain/runtime/deadline.hpp"

namespace shardtrain {
namespace {

using namespace std::chrono_literals;
using Clock = PauseDetector::Clock;

TEST(PauseDetector, WakesAboutOnePeriodApartAreNoPause) {
  const Clock::time_point t0{};
  PauseDetector p(20ms, t0);
  EXPECT_EQ(p.wake(t0 + 20ms), Clock::duration::zero());
  EXPECT_EQ(p.wake(t0 + 25ms), Clock::duration::zero());    // woken early (a notify)
  EXPECT_EQ(p.wake(t0 + 525ms), Clock::duration::zero());   // half a second late: a loaded machine's scheduling
  EXPECT_EQ(p.wake(t0 + 1545ms), Clock::duration::zero());  // exactly kLateness late: not beyond it
}

TEST(PauseDetector, AWakeFarBeyondThePeriodIsAPauseOfTheExcess) {
  const Clock::time_point t0{};
  PauseDetector p(20ms, t0);
  EXPECT_EQ(p.wake(t0 + 20ms), Clock::duration::zero());
  EXPECT_EQ(p.wake(t0 + 20ms + 6020ms), 6000ms);            // stopped for 6 s between two wakes
  EXPECT_EQ(p.wake(t0 + 6060ms), Clock::duration::zero());  // counted once: the next wake is an ordinary one
}

TEST(PauseDetector, TheThreadsOwnWorkIsNoPause) {
  // A survey of the peers waits up to 2 s for answers; the thread resets after it.
  const Clock::time_point t0{};
  PauseDetector p(20ms, t0);
  p.reset(t0 + 2500ms);
  EXPECT_EQ(p.wake(t0 + 2520ms), Clock::duration::zero());
}

// Runs `child` in a child process that tells the parent it is ready (one byte) and waits for one byte back; the parent
// stops it for `stopped` after it is ready, continues it, and then sends the byte. The child's exit status.
int stopped_child(std::chrono::milliseconds stopped, void (*child)(int ready, int go)) {
  int ready[2], go[2];
  if (pipe(ready) != 0 || pipe(go) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    close(go[1]);
    child(ready[1], go[0]);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  char byte = 0;
  if (read(ready[0], &byte, 1) != 1) return -1;
  kill(pid, SIGSTOP);
  std::this_thread::sleep_for(stopped);
  kill(pid, SIGCONT);
  // A moment for the child's deadline thread to wake first: before the fix it fired here, the stretch long past due.
  std::this_thread::sleep_for(300ms);
  // A child that ended already (expired) must fail the test, not end it with SIGPIPE.
  const auto pipe_was = signal(SIGPIPE, SIG_IGN);
  (void)!write(go[1], &byte, 1);
  signal(SIGPIPE, pipe_was);
  int status = 0;
  waitpid(pid, &status, 0);
  close(ready[0]);
  close(go[1]);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(DeadlinePaused, AStretchStoppedPastItsLimitDoesNotExpireWhenContinued) {
  const int status = stopped_child(3500ms, [](int ready, int go) {
    Deadline deadline([](const Deadline::Stretch&) { _exit(3); });
    deadline.begin({"the save of step 8", 2, "checkpoint.save_timeout"});
    char byte = 1;
    if (write(ready, &byte, 1) != 1 || read(go, &byte, 1) != 1) _exit(4);
    deadline.end();
  });
  EXPECT_EQ(status, 0) << "3: the stretch expired when the child was continued (its 3.5 s stopped counted)";
}

TEST(DeadlinePaused, AStretchThatExpiresAfterAPauseSaysHowLongTheProcessWasStopped) {
  // The child is stopped 3.5 s into a stretch of 4 s; it then runs on past the limit. The expired stretch carries the
  // seconds stopped (for its message), about 3.5 s less the deadline's wake period.
  const int status = stopped_child(3500ms, [](int ready, int go) {
    Deadline deadline([](const Deadline::Stretch& s) { _exit(s.stopped >= 3.0 && s.stopped <= 60 ? 5 : 6); });
    deadline.begin({"the save of step 8", 4, "checkpoint.save_timeout"});
    char byte = 1;
    if (write(ready, &byte, 1) != 1 || read(go, &byte, 1) != 1) _exit(4);
    std::this_thread::sleep_for(std::chrono::hours(1));  // the expiry ends the process
  });
  EXPECT_EQ(status, 5) << "6: the expired stretch's seconds stopped are wrong; 4: no handshake";
}

}  // namespace
}  // namespace shardtrain
