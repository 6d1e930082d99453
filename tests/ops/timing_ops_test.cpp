// The timing ops on a timing device: ops on the compute stream and on a side stream keep their own clocks, the host
// pays each launch, a loss read back waits for the stream (not while losses are deferred), the CPU backend's ops are
// host work, and nothing runs without an installed device.
#include <gtest/gtest.h>

#include <vector>

#include "shardtrain/ops/timing_ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain::ops {
namespace {

// matmul 10 s, rmsnorm_forward 1 s, every other op 2 s.
class FixedCosts final : public OpCostModel {
 public:
  double seconds(const OpCall& call) const override {
    return call.name == "matmul" ? 10.0 : call.name == "rmsnorm_forward" ? 1.0 : 2.0;
  }
};

timing::HostCosts half_second_launches() {
  timing::HostCosts c;
  c.launch_s = 0.5;
  c.comm_launch_s = 0;
  c.sync_s = 0;
  return c;
}

struct Tensors {
  std::vector<float> buf = std::vector<float>(256);
  Tensor x = make_tensor(buf.data(), DType::F32, {8, 8});
  Tensor w = make_tensor(buf.data() + 64, DType::F32, {8});
  Tensor rstd = make_tensor(buf.data() + 72, DType::F32, {8});
  Tensor y = make_tensor(buf.data() + 128, DType::F32, {8, 8});
  std::vector<int32_t> ids = std::vector<int32_t>(8, 1);
  Tensor targets = make_tensor(ids.data(), DType::I32, {8});
};

TEST(TimingOps, ComputeAndSideStreamsKeepTheirOwnClocks) {
  const FixedCosts cost;
  timing::TimingDevice d(half_second_launches());
  timing::TimingScope scope(d);
  Tensors t;
  auto ops = make_timing_ops(DeviceKind::Cuda, cost);
  auto side = ops->make_side_ops();
  EXPECT_EQ(side->device(), DeviceKind::Cuda);
  CudaStream s;
  side->set_stream(s.ref());  // nothing queued yet: no wait
  EXPECT_EQ(side->stream().handle, s.ref().handle);
  EXPECT_EQ(ops->stream().handle, nullptr);

  ops->matmul(Transpose::No, Transpose::Yes, 1.0, t.x, t.y, 0.0, t.y);  // issued 0.5: 0.5 .. 10.5
  side->rmsnorm_forward(t.x, {}, t.w, 1e-5, {}, t.y, t.rstd);           // issued 1.0: 1.0 .. 2.0
  side->rmsnorm_forward(t.x, {}, t.w, 1e-5, {}, t.y, t.rstd);           // issued 1.5: 2.0 .. 3.0
  ops->copy(t.x, t.y);                                                  // issued 2.0: 10.5 .. 12.5
  EXPECT_DOUBLE_EQ(d.stream_now({}), 12.5);
  EXPECT_DOUBLE_EQ(d.stream_now(s.ref()), 3.0);
  EXPECT_DOUBLE_EQ(d.host_now(), 2.0);
  ASSERT_EQ(d.tasks().size(), 4u);
  EXPECT_EQ(d.tasks()[0].label, "matmul 8x8x8");
  EXPECT_EQ(d.tasks()[0].kind, timing::WorkKind::Compute);
  EXPECT_EQ(d.tasks()[0].stream, 0);
  EXPECT_EQ(d.tasks()[1].label, "rmsnorm_forward 8x8");
  EXPECT_NE(d.tasks()[1].stream, 0);
  EXPECT_DOUBLE_EQ(d.tasks()[2].start, 2.0);
  EXPECT_DOUBLE_EQ(d.tasks()[3].start, 10.5);

  // A loss read back: the host waits for the stream. Deferred: no wait, until take_loss.
  const LossSums l = ops->cross_entropy(t.x, t.targets, -100, 1.0, t.y);  // issued 2.5: 12.5 .. 14.5
  EXPECT_EQ(l.loss_sum, 0.0);
  EXPECT_EQ(l.tokens, 0);
  EXPECT_DOUBLE_EQ(d.host_now(), 14.5);
  ops->defer_loss(true);
  ops->linear_cross_entropy(t.x, t.y, t.targets, -100, 1.0, 0, t.x, t.y, 1.0);  // issued 15.0: 15.0 .. 17.0
  EXPECT_DOUBLE_EQ(d.host_now(), 15.0);
  const LossSums total = ops->take_loss();
  EXPECT_EQ(total.tokens, 0);
  EXPECT_DOUBLE_EQ(d.host_now(), 17.0);

  // Switching streams keeps call order: the side ops' work on the null stream comes after the compute stream's.
  side->set_stream({});
  side->fill(t.y, 0.0);  // issued 17.5, after the null stream's 17.0
  EXPECT_DOUBLE_EQ(d.stream_now({}), 19.5);
  ops->set_stream(s.ref());  // s waits for the null stream (19.5) before the next op
  ops->fill(t.y, 0.0);       // issued 18.0: 19.5 .. 21.5
  EXPECT_DOUBLE_EQ(d.stream_now(s.ref()), 21.5);
}

TEST(TimingOps, CpuOpsAreHostWork) {
  const FixedCosts cost;
  timing::TimingDevice d(half_second_launches());
  timing::TimingScope scope(d);
  Tensors t;
  auto ops = make_timing_ops(DeviceKind::Cpu, cost);
  EXPECT_EQ(ops->device(), DeviceKind::Cpu);
  EXPECT_EQ(ops->make_side_ops()->device(), DeviceKind::Cpu);
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, t.x, t.y, 0.0, t.y);
  ops->rmsnorm_forward(t.x, {}, t.w, 1e-5, {}, t.y, t.rstd);
  EXPECT_DOUBLE_EQ(d.host_now(), 11.0);  // no launches: the host runs them
  EXPECT_DOUBLE_EQ(d.stream_now({}), 0.0);
  ASSERT_EQ(d.tasks().size(), 2u);
  EXPECT_EQ(d.tasks()[1].stream, -1);                       // on the host,
  EXPECT_EQ(d.tasks()[1].kind, timing::WorkKind::Compute);  // as the CPU backend's compute
  EXPECT_DOUBLE_EQ(d.tasks()[1].start, 10.0);
  EXPECT_EQ(d.tasks()[1].label, "rmsnorm_forward 8x8");
}

TEST(TimingOps, WithoutATimingDeviceEveryCallThrows) {
  const FixedCosts cost;
  Tensors t;
  auto ops = make_timing_ops(DeviceKind::Cuda, cost);
  EXPECT_THROW(ops->copy(t.x, t.y), InternalError);
  EXPECT_THROW(ops->take_loss(), InternalError);
}

}  // namespace
}  // namespace shardtrain::ops
