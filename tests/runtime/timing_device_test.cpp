// The timing device: streams as clocks, events as times, host issue costs, idle time of the compute stream by
// cause, and the runtime's stream/event/buffer calls routed to it while it is installed.
#include <gtest/gtest.h>

#include <vector>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain::timing {
namespace {

HostCosts free_issue() {
  HostCosts c;
  c.launch_s = 0;
  c.comm_launch_s = 0;
  c.sync_s = 0;
  return c;
}

TEST(TimingDevice, WorkOnOneStreamRunsBackToBack) {
  TimingDevice d(free_issue());
  d.enqueue({}, WorkKind::Compute, 2.0, 0, "a");
  d.enqueue({}, WorkKind::Compute, 3.0, 0, "b");
  EXPECT_DOUBLE_EQ(d.stream_now({}), 5.0);
  EXPECT_DOUBLE_EQ(d.host_now(), 0.0);  // the host ran ahead
  ASSERT_EQ(d.tasks().size(), 2u);
  EXPECT_DOUBLE_EQ(d.tasks()[1].start, 2.0);
  EXPECT_TRUE(d.compute_idle().empty());
}

TEST(TimingDevice, IssueCostDelaysAStreamThatRanDry) {
  HostCosts c = free_issue();
  c.launch_s = 1.0;
  TimingDevice d(c);
  d.enqueue({}, WorkKind::Compute, 0.5, c.launch_s, "a");  // issued at 1, ends 1.5
  d.enqueue({}, WorkKind::Compute, 0.5, c.launch_s, "b");  // issued at 2: 0.5 idle for the host
  EXPECT_DOUBLE_EQ(d.stream_now({}), 2.5);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("host").host_s, 1.0 + 0.5);  // before a, and between a and b
}

TEST(TimingDevice, EventWaitDelaysComputeAndNamesItsCause) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  CudaStream comm;
  CudaEvent done;
  d.set_context("layers.0");
  d.enqueue(comm.ref(), WorkKind::Comm, 4.0, 0, "all-gather");
  done.record(comm.ref());
  d.set_context("");
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "embedding");  // 0..1, beside the gather
  done.wait({});
  d.enqueue({}, WorkKind::Compute, 2.0, 0, "q_proj");  // waits until 4
  EXPECT_DOUBLE_EQ(d.stream_now({}), 6.0);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("layers.0 all-gather").waiting_s, 3.0);
  // The host blocks on the compute stream.
  stream_synchronize({});
  EXPECT_DOUBLE_EQ(d.host_now(), 6.0);
}

// A reduction's sum of squares queued behind its all-reduce: compute's wait is the all-reduce's until it ends,
// and only the rest the kernel's.
TEST(TimingDevice, WorkBehindACollectiveLeavesTheWaitToTheCollective) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  CudaStream comm;
  CudaEvent done;
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "backward");                   // 0..1
  d.enqueue(comm.ref(), WorkKind::Comm, 4.0, 0, "model all_reduce");      // 0..4
  d.enqueue(comm.ref(), WorkKind::Compute, 0.5, 0, "model sum_squares");  // 4..4.5, back to back
  done.record(comm.ref());
  done.wait({});
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "adamw");  // waits 1..4.5
  EXPECT_DOUBLE_EQ(d.stream_now({}), 5.5);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("model all_reduce").waiting_s, 3.0);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("model sum_squares").waiting_s, 0.5);
  EXPECT_EQ(d.compute_idle().size(), 2u);
}

// The same kernel issued late by the host does not follow the collective: the wait after it is its own.
TEST(TimingDevice, WorkTheHostIssuedLateIsItsOwnCause) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  CudaStream comm;
  CudaEvent done;
  d.enqueue(comm.ref(), WorkKind::Comm, 1.0, 0, "all_reduce");      // 0..1
  d.host_work(2.0, "host");                                         // the host is at 2
  d.enqueue(comm.ref(), WorkKind::Compute, 0.5, 0, "sum_squares");  // 2..2.5
  done.record(comm.ref());
  done.wait({});
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "adamw");  // 2.5..3.5
  EXPECT_EQ(d.compute_idle().count("all_reduce"), 0u);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("sum_squares").waiting_s, 0.5);
  EXPECT_DOUBLE_EQ(d.compute_idle().at("host").host_s, 2.0);
}

TEST(TimingDevice, EventRecordedBeforeWorkIsDoneAtOnce) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  CudaStream side;
  CudaEvent e;
  e.record(side.ref());
  e.wait({});
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "x");
  EXPECT_DOUBLE_EQ(d.stream_now({}), 1.0);
  EXPECT_TRUE(d.compute_idle().empty());
}

TEST(TimingDevice, DeviceBuffersHoldNoMemoryButCount) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  reset_device_memory_peak();
  const size_t before = device_memory_stats().in_use;
  {
    DeviceBuffer a(size_t{80} << 30);  // 80 GiB: nothing is allocated
    DeviceBuffer b(1000);
    EXPECT_TRUE(TimingDevice::is_device_address(a.data()));
    EXPECT_TRUE(TimingDevice::is_device_address(b.data()));
    EXPECT_NE(a.data(), b.data());
    EXPECT_EQ(device_memory_stats().in_use - before, (size_t{80} << 30) + 1000);
  }
  EXPECT_EQ(device_memory_stats().in_use, before);
  EXPECT_EQ(device_memory_stats().peak - before, (size_t{80} << 30) + 1000);
}

TEST(TimingDevice, CopiesTakeTheirLinksTimeAndReadBackZeros) {
  HostCosts c = free_issue();
  c.h2d_bytes_per_s = 1000;
  c.d2h_bytes_per_s = 500;
  c.memory_bytes_per_s = 4000;
  c.kernel_overhead_s = 0;
  TimingDevice d(c);
  TimingScope scope(d);
  DeviceBuffer dev(100);
  std::vector<char> host(100, 7);
  copy_async(dev.data(), host.data(), 100, {});  // 0.1 s
  copy_async(host.data(), dev.data(), 100, {});  // 0.2 s
  DeviceBuffer other(100);
  copy_async(other.data(), dev.data(), 100, {});  // 200 bytes moved at 4000: 0.05 s
  EXPECT_NEAR(d.stream_now({}), 0.35, 1e-12);
  EXPECT_EQ(host[0], 0);
  EXPECT_EQ(host[99], 0);
}

TEST(TimingDevice, HostWorkAdvancesTheHostOnly) {
  TimingDevice d(free_issue());
  d.host_work(2.5, "allreduce");
  EXPECT_DOUBLE_EQ(d.host_now(), 2.5);
  d.enqueue({}, WorkKind::Compute, 1.0, 0, "x");  // issued at 2.5
  EXPECT_DOUBLE_EQ(d.stream_now({}), 3.5);
  EXPECT_EQ(d.tasks().front().stream, -1);
}

TEST(TimingDevice, WorkOnOneResourceTakesTurnsInTheFirstGapThatHoldsIt) {
  TimingDevice d(free_issue());
  TimingScope scope(d);
  CudaStream a, b, c;
  CudaEvent late;
  d.enqueue(c.ref(), WorkKind::Compute, 10.0, 0, "compute");
  late.record(c.ref());
  late.wait(a.ref());
  d.enqueue(a.ref(), WorkKind::Comm, 2.0, 0, "reduce", 1);      // ready at 10: holds the link 10..12
  d.enqueue(b.ref(), WorkKind::Comm, 3.0, 0, "gather", 1);      // ready at 0: the gap before 10 holds it, 0..3
  d.enqueue(b.ref(), WorkKind::Comm, 8.0, 0, "gather 2", 1);    // ready at 3: 3..11 overlaps 10..12, so 12..20
  d.enqueue(a.ref(), WorkKind::Comm, 1.0, 0, "other link", 0);  // another resource: no wait beyond its stream
  EXPECT_DOUBLE_EQ(d.tasks()[1].start, 10.0);
  EXPECT_DOUBLE_EQ(d.tasks()[2].start, 0.0);
  EXPECT_DOUBLE_EQ(d.tasks()[3].start, 12.0);
  EXPECT_DOUBLE_EQ(d.tasks()[4].start, 12.0);  // after its own stream's "reduce"
}

TEST(TimingDevice, OneAtATime) {
  TimingDevice a, b;
  TimingScope scope(a);
  EXPECT_EQ(current(), &a);
  EXPECT_ANY_THROW(TimingScope{b});
}

}  // namespace
}  // namespace shardtrain::timing
