// The timed ops around the CPU backend: results bit for bit the backend's own, every call timed under the key
// DescribingOps gives it (side ops into the same times), nothing described while disabled, per-call seconds as the
// median over periods of each period's mean, losses deferred through, and CUDA ops refused.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/timed_ops.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {
namespace {

// Every call's key, in order (and a device of one's choosing, to stand for CUDA ops).
class Keys final : public DescribingOps {
 public:
  explicit Keys(DeviceKind device = DeviceKind::Cpu) : device_(device) {}
  std::vector<std::string> keys;
  DeviceKind device() const override { return device_; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
  std::unique_ptr<Ops> make_side_ops() const override { return std::make_unique<Keys>(device_); }

 protected:
  void on_call(OpCall call) override { keys.push_back(call.key); }

 private:
  DeviceKind device_;
};

struct Data {
  std::vector<float> a, b, c, w;
  std::vector<float> rstd = std::vector<float>(24), y = std::vector<float>(24 * 16);
  std::vector<int32_t> targets = std::vector<int32_t>(24);
  Data() : a(24 * 16), b(32 * 16), c(24 * 32), w(16) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37 % 101) - 50) / 50.0f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 53 % 97) - 48) / 60.0f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + 0.01f * static_cast<float>(i);
    for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int32_t>(i * 7 % 32);
  }
};

// A few ops on `ops`: two GEMMs of one key, one accumulating, an RMSNorm, a copy, a deferred loss; c and y hold the
// results.
LossSums run_ops(Ops& ops, Data& d) {
  const Tensor a = make_tensor(d.a.data(), DType::F32, {24, 16}), b = make_tensor(d.b.data(), DType::F32, {32, 16});
  const Tensor c = make_tensor(d.c.data(), DType::F32, {24, 32}), w = make_tensor(d.w.data(), DType::F32, {16});
  const Tensor y = make_tensor(d.y.data(), DType::F32, {24, 16}), rstd = make_tensor(d.rstd.data(), DType::F32, {24});
  ops.defer_loss(true);
  ops.matmul(Transpose::No, Transpose::Yes, 1.0, a, b, 0.0, c);
  ops.matmul(Transpose::No, Transpose::Yes, 0.5, a, b, 0.0, c);
  ops.matmul(Transpose::No, Transpose::Yes, 1.0, a, b, 1.0, c);
  ops.rmsnorm_forward(a, {}, w, 1e-5, {}, y, rstd);
  ops.copy(y, a);
  ops.cross_entropy(c, make_tensor(d.targets.data(), DType::I32, {24}), -100, 1.0, {});
  return ops.take_loss();
}

TEST(TimedOps, ResultsAreTheBackendsAndEveryCallIsTimedUnderItsKey) {
  Data direct, timed_data;
  auto cpu = make_cpu_ops(CpuOpsOptions{1});
  const LossSums want = run_ops(*cpu, direct);

  OpTimes times;
  times.set_enabled(true);
  auto timed = make_timed_ops(make_cpu_ops(CpuOpsOptions{1}), times);
  EXPECT_EQ(timed->device(), DeviceKind::Cpu);
  const LossSums got = run_ops(*timed, timed_data);
  EXPECT_EQ(got.loss_sum, want.loss_sum);  // the deferred loss passes through
  EXPECT_EQ(got.tokens, 24);
  EXPECT_EQ(std::memcmp(direct.c.data(), timed_data.c.data(), direct.c.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(direct.y.data(), timed_data.y.data(), direct.y.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(direct.a.data(), timed_data.a.data(), direct.a.size() * sizeof(float)), 0);
  EXPECT_EQ(times.summary().size(), 0u);  // nothing until a period ends
  times.end_period();

  Data keyed;
  Keys keys;
  run_ops(keys, keyed);
  std::map<std::string, int64_t> want_calls;
  for (const std::string& k : keys.keys) ++want_calls[k];
  ASSERT_EQ(want_calls.size(), 5u);  // the plain GEMM twice, the accumulating one, rmsnorm, copy, cross_entropy
  std::map<std::string, int64_t> got_calls;
  for (const OpTimes::Summary& s : times.summary()) {
    got_calls[s.call.key] = s.calls;
    EXPECT_GT(s.seconds, 0) << s.call.key;
    EXPECT_GT(s.seconds_mean, 0) << s.call.key;
    EXPECT_DOUBLE_EQ(s.calls_per_period, static_cast<double>(s.calls)) << s.call.key;  // one period
    if (s.call.name == "matmul") {
      EXPECT_DOUBLE_EQ(s.call.flops, 2.0 * 24 * 32 * 16) << s.call.key;
    }
  }
  EXPECT_EQ(got_calls, want_calls);
  EXPECT_EQ(got_calls.at("matmul NT m 24 n 32 k 16 f32 f32 f32"), 2);
  EXPECT_EQ(got_calls.at("matmul NT m 24 n 32 k 16 f32 f32 f32 +="), 1);
}

TEST(TimedOps, DisabledTimesNothingAndSideOpsShareTheTimes) {
  OpTimes times;
  auto timed = make_timed_ops(make_cpu_ops(CpuOpsOptions{1}), times);
  std::vector<float> x(64, 1.0f), y(64, 0.0f);
  const Tensor tx = make_tensor(x.data(), DType::F32, {64}), ty = make_tensor(y.data(), DType::F32, {64});
  timed->add(tx, ty);  // disabled: computed, not timed
  EXPECT_EQ(y[5], 1.0f);
  auto side = timed->make_side_ops();
  EXPECT_EQ(side->device(), DeviceKind::Cpu);
  times.set_enabled(true);
  side->add(tx, ty);
  timed->add(tx, ty);
  side->fill(ty, 0.5);
  times.end_period();
  EXPECT_EQ(y[5], 0.5f);
  const std::vector<OpTimes::Summary> s = times.summary();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].call.key, "add f32[64] f32[64]");
  EXPECT_EQ(s[0].calls, 2);
  EXPECT_EQ(s[1].call.key, "fill f32[64]");
  EXPECT_EQ(s[1].calls, 1);
  EXPECT_EQ(times.periods(), 1);
}

// Per call: the median over periods of each period's mean (robust to a period the machine slowed), and the plain
// mean beside it; calls per period over every period, those that did not call the key too.
TEST(TimedOps, SecondsAreTheMedianOverPeriodsOfEachPeriodsMean) {
  OpTimes times;
  OpCall call;
  call.name = "copy", call.key = "copy f32[8] f32[8]", call.bytes = 64;
  times.add(call, 1.0), times.add(call, 3.0);  // mean 2
  times.end_period();
  times.add(call, 50.0);  // a disturbed period
  times.end_period();
  times.add(call, 1.0);
  times.end_period();
  times.end_period();    // no call
  times.add(call, 7.0);  // open: not counted
  ASSERT_EQ(times.summary().size(), 1u);
  const OpTimes::Summary s = times.summary()[0];
  EXPECT_EQ(s.calls, 4);
  EXPECT_DOUBLE_EQ(s.calls_per_period, 1.0);
  EXPECT_DOUBLE_EQ(s.seconds, 2.0);  // median of 2, 50, 1
  EXPECT_DOUBLE_EQ(s.seconds_mean, 55.0 / 4);
  EXPECT_EQ(s.call.bytes, 64);
  EXPECT_EQ(times.periods(), 4);
}

TEST(TimedOps, CudaOpsAreRefused) {
  OpTimes times;
  EXPECT_THROW(make_timed_ops(std::make_unique<Keys>(DeviceKind::Cuda), times), InternalError);
  EXPECT_THROW(make_timed_ops(nullptr, times), InternalError);
  EXPECT_NO_THROW(make_timed_ops(std::make_unique<Keys>(DeviceKind::Cpu), times));
}

}  // namespace
}  // namespace shardtrain::ops
