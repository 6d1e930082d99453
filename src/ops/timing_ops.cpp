// TimingOps (timing_ops.hpp): each call described (op_calls.hpp), costed, and queued on the timing device.
#include "shardtrain/ops/timing_ops.hpp"

#include <fmt/format.h>

#include <string>

#include "shardtrain/ops/op_calls.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain::ops {
namespace {

timing::TimingDevice& installed(const char* what) {
  timing::TimingDevice* d = timing::current();
  if (!d) throw InternalError(fmt::format("timing ops: {} with no timing device installed (timing::TimingScope)", what));
  return *d;
}

class TimingOps final : public DescribingOps {
 public:
  TimingOps(DeviceKind device, const OpCostModel& cost) : device_(device), cost_(cost) {}

  DeviceKind device() const override { return device_; }
  // As CudaOps: work queued on the previous stream comes first (the new stream waits for it on the device).
  void set_stream(StreamRef next) override {
    if (device_ != DeviceKind::Cuda || next.handle == stream_.handle) return;
    timing::TimingDevice& d = installed("set_stream");
    void* event = d.create_event();
    d.record_event(event, stream_);
    d.wait_event(event, next);
    d.destroy_event(event);
    stream_ = next;
  }
  StreamRef stream() const override { return stream_; }
  std::unique_ptr<Ops> make_side_ops() const override { return std::make_unique<TimingOps>(device_, cost_); }

  void defer_loss(bool on) override { defer_loss_ = on; }
  LossSums take_loss() override {
    timing::TimingDevice& d = installed("take_loss");
    if (device_ == DeviceKind::Cuda) d.synchronize_stream(stream_);
    return {};
  }

 protected:
  void on_call(OpCall call) override {
    timing::TimingDevice& d = installed(call.name.c_str());
    const double seconds = cost_.seconds(call);
    const std::string label = call.name + " " + call.shape;
    if (device_ == DeviceKind::Cpu) {
      d.host_work(seconds, label, timing::WorkKind::Compute);
      return;
    }
    d.enqueue(stream_, timing::WorkKind::Compute, seconds, d.costs().launch_s, label);
    const bool loss = call.name == "cross_entropy" || call.name == "linear_cross_entropy";
    if (loss && !defer_loss_) d.synchronize_stream(stream_);  // CudaOps reads the sums back
  }

 private:
  DeviceKind device_;
  const OpCostModel& cost_;
  StreamRef stream_;
  bool defer_loss_ = false;
};

}  // namespace

std::unique_ptr<Ops> make_timing_ops(DeviceKind device, const OpCostModel& cost) {
  return std::make_unique<TimingOps>(device, cost);
}

}  // namespace shardtrain::ops
