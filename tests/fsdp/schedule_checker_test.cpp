// The schedule checker on hand-made traces: each property passes a schedule that has it and reports one that
// breaks it (the engine-level counterpart, on real traces, is overlap_test.cpp's TheChecksCatchABrokenSchedule).
#include <gtest/gtest.h>

#include "schedule_checker.hpp"

using shardtrain::cuda_emulator::TraceOp;
using namespace shardtrain::testing_fsdp;

namespace {

const void* const kGather = reinterpret_cast<const void*>(0x10);
const void* const kReduce = reinterpret_cast<const void*>(0x20);
const void* const kUpload = reinterpret_cast<const void*>(0x30);

struct Trace {
  std::vector<TraceOp> ops;
  uint64_t seq = 1;
  uint64_t add(const void* stream, std::string what, uint64_t waits_for = 0, std::string detail = "", size_t bytes = 0) {
    TraceOp op;
    op.seq = seq++;
    op.stream = stream;
    op.what = std::move(what);
    op.waits_for = waits_for;
    op.detail = std::move(detail);
    op.bytes = bytes;
    ops.push_back(op);
    return op.seq;
  }
  void mark(const std::string& label) { add(nullptr, "mark", 0, label); }
  // An all-gather of `unit` on the gather stream; returns the record compute waits for.
  uint64_t gather(int unit) {
    mark("G " + std::to_string(unit));
    add(kGather, "ncclAllGather");
    return add(kGather, "cudaEventRecord");
  }
};

// Two units' forward: unit 1's gather queued before (prefetch) or after (none) unit 0's first kernel.
std::vector<TraceOp> forward(bool prefetch) {
  Trace t;
  const uint64_t g0 = t.gather(0);
  uint64_t g1 = prefetch ? t.gather(1) : 0;
  t.add(nullptr, "cudaStreamWaitEvent", g0);
  t.mark("F 0");
  t.add(nullptr, "kernel launch");
  if (!prefetch) g1 = t.gather(1);
  t.add(nullptr, "cudaStreamWaitEvent", g1);
  t.mark("F 1");
  t.add(nullptr, "kernel launch");
  return t.ops;
}

// Unit 1's reduction, then unit 0's backward; compute waits for the reduction before (synchronous) or after.
std::vector<TraceOp> backward(bool synchronous, bool on_compute = false) {
  Trace t;
  t.mark("B 1");
  t.add(nullptr, "kernel launch");
  const uint64_t ready = t.add(nullptr, "cudaEventRecord");
  t.mark("R 1");
  const void* stream = on_compute ? nullptr : kReduce;
  if (!on_compute) t.add(kReduce, "cudaStreamWaitEvent", ready);
  t.add(stream, "ncclReduceScatter");
  const uint64_t reduced = t.add(stream, "cudaEventRecord");
  if (synchronous) t.add(nullptr, "cudaStreamWaitEvent", reduced);
  t.mark("B 0");
  t.add(nullptr, "kernel launch");
  t.add(nullptr, "cudaStreamWaitEvent", reduced);  // the end of the step
  return t.ops;
}

}  // namespace

TEST(ScheduleChecker, PrefetchedGathersPassAndOnDemandOnesAreReported) {
  const ScheduleReport good = check_schedule(forward(true), {});
  EXPECT_TRUE(good.violations.empty()) << good.violations.front();
  EXPECT_EQ(good.prefetch_pairs, 1);
  EXPECT_EQ(good.gathers_waited, 2);
  const ScheduleReport bad = check_schedule(forward(false), {});
  ASSERT_EQ(bad.violations.size(), 1u);
  EXPECT_NE(bad.violations[0].find("unit 1's all-gather queued"), std::string::npos) << bad.violations[0];
}

TEST(ScheduleChecker, ComputeMustWaitForAGather) {
  std::vector<TraceOp> ops = forward(true);
  for (TraceOp& op : ops)
    if (op.stream == nullptr && op.what == "cudaStreamWaitEvent") op.what = "kernel launch";  // the waits removed
  const ScheduleReport r = check_schedule(ops, {});
  ASSERT_FALSE(r.violations.empty());
  EXPECT_NE(r.violations[0].find("without waiting for its all-gather"), std::string::npos) << r.violations[0];
}

TEST(ScheduleChecker, AsynchronousReductionsPassAndWaitingOnesAreReported) {
  const ScheduleReport good = check_schedule(backward(false), {});
  EXPECT_TRUE(good.violations.empty()) << good.violations.front();
  EXPECT_EQ(good.reductions, 1);
  const ScheduleReport bad = check_schedule(backward(true), {});
  ASSERT_EQ(bad.violations.size(), 1u);
  EXPECT_NE(bad.violations[0].find("compute waits for unit 1's ncclReduceScatter"), std::string::npos) << bad.violations[0];
  const ScheduleReport on_compute = check_schedule(backward(false, true), {});
  ASSERT_EQ(on_compute.violations.size(), 1u);
  EXPECT_NE(on_compute.violations[0].find("runs on the compute stream"), std::string::npos) << on_compute.violations[0];
}

TEST(ScheduleChecker, ShardCopiesMustRunOffCompute) {
  Trace t;
  t.add(kUpload, "memcpy", 0, "pinned->device", 64);
  t.add(nullptr, "memcpy", 0, "device->pinned", 8);                     // not a shard's size: the loss read
  t.add(nullptr, "memcpy (staged source)", 0, "pageable->device", 64);  // not pinned
  ScheduleExpectations e;
  e.offload_copies = true;
  e.shard_bytes = {64};
  const ScheduleReport good = check_schedule(t.ops, e);
  EXPECT_TRUE(good.violations.empty());
  EXPECT_EQ(good.offload_copies, 1);
  t.add(nullptr, "memcpy", 0, "device->pinned", 64);
  const ScheduleReport bad = check_schedule(t.ops, e);
  ASSERT_EQ(bad.violations.size(), 1u);
  EXPECT_NE(bad.violations[0].find("64-byte device->pinned copy"), std::string::npos) << bad.violations[0];
}
