// runtime::Deadline: which stretch expires, timed from where. No assertion rests on how fast this machine is: a
// stretch that must fire is waited for (up to a minute), and one that must not has a limit of an hour.
#include "shardtrain/runtime/deadline.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>

namespace shardtrain {
namespace {

using namespace std::chrono_literals;

// The expired stretch, handed back through a promise (an expire that returns ends the deadline's timing for good).
struct Expired {
  std::promise<Deadline::Stretch> promise;
  std::future<Deadline::Stretch> future = promise.get_future();
  Deadline::Expire callback() {
    return [this](const Deadline::Stretch& s) { promise.set_value(s); };
  }
};

TEST(Deadline, TheStretchInProgressExpiresWithItsNameLimitAndKey) {
  Expired expired;
  Deadline deadline(expired.callback());
  deadline.begin({"opening the datasets", 3600, "fsdp.startup_timeout"});
  deadline.begin({"claiming the checkpoint directory", 0.05, "fsdp.startup_timeout"});
  ASSERT_EQ(expired.future.wait_for(60s), std::future_status::ready);
  const Deadline::Stretch s = expired.future.get();
  EXPECT_EQ(s.what, "claiming the checkpoint directory");
  EXPECT_EQ(s.limit, 0.05);
  EXPECT_EQ(s.key, "fsdp.startup_timeout");
}

TEST(Deadline, AStretchWithoutALimitIsNotTimedAndEndStopsTheTiming) {
  Expired expired;
  {
    Deadline deadline(expired.callback());
    deadline.begin({"untimed", 0, "k"});
    deadline.begin({"timed", 3600, "k"});
    deadline.end();
    deadline.begin({"untimed again", 0, "k"});
  }  // joins its thread: nothing expired
  EXPECT_EQ(expired.future.wait_for(0s), std::future_status::timeout);
}

TEST(Deadline, AnEnormousLimitIsNoLimit) {
  // 1e10 s once passed the clock's int64 nanoseconds and fired at once (a start-up timeout of 1e10: exit 10 at start).
  // Then a short stretch after it still fires: the watch went on.
  Expired expired;
  Deadline deadline(expired.callback());
  for (const double limit : {1e10, 1e19, 1e300, Deadline::kNoLimitSeconds}) {
    deadline.begin({"a long stretch", limit, "k"});
    EXPECT_EQ(expired.future.wait_for(200ms), std::future_status::timeout) << limit;
  }
  deadline.begin({"a short one", 0.05, "k"});
  ASSERT_EQ(expired.future.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(expired.future.get().what, "a short one");
}

TEST(Deadline, BeginAtTimesFromAnEarlierStart) {
  // An asynchronous save's wait: its limit counts from when the save began, long past here.
  Expired expired;
  Deadline deadline(expired.callback());
  deadline.begin_at({"the asynchronous save of step 8", 60, "checkpoint.save_timeout"},
                    std::chrono::steady_clock::now() - 61s);
  ASSERT_EQ(expired.future.wait_for(60s), std::future_status::ready);
  EXPECT_EQ(expired.future.get().what, "the asynchronous save of step 8");
}

TEST(Deadline, AStretchThatWaitsOnOthersExpiresNoSoonerThanItsLimitAndGrace) {
  // A rank waiting in a collective gives the rank it waits for, timed by its own deadline, time to speak first.
  Expired expired;
  Deadline deadline(expired.callback());
  const auto begun = std::chrono::steady_clock::now();
  deadline.begin({"the exchange of GPU identities", 0.05, "fsdp.startup_timeout", 0.5});
  ASSERT_EQ(expired.future.wait_for(60s), std::future_status::ready);
  const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
  const Deadline::Stretch s = expired.future.get();
  EXPECT_GE(waited, 0.55);   // a lower bound only: a busy machine fires later, never sooner
  EXPECT_EQ(s.limit, 0.05);  // the message names the limit the setting gave
  EXPECT_EQ(s.grace, 0.5);
}

}  // namespace
}  // namespace shardtrain
