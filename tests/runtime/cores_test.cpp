// usable_cores() follows the process's CPU affinity (what Slurm's --cpus-per-task or taskset gives it), not
// the machine's core count.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include "shardtrain/runtime/topology.hpp"

using namespace shardtrain;

TEST(UsableCores, FollowTheAffinityMask) {
  cpu_set_t before;
  CPU_ZERO(&before);
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(usable_cores(), CPU_COUNT(&before));
  EXPECT_LE(usable_cores(), static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  // Down to one core, as `taskset -c N` or a one-CPU Slurm task would leave it.
  int first = 0;
  while (!CPU_ISSET(first, &before)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(usable_cores(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(usable_cores(), CPU_COUNT(&before));
}
