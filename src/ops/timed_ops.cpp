// TimedOps (timed_ops.hpp): each call described by DescribingOps (its key), then forwarded and timed with a monotonic
// clock; the description is made before the clock starts, so it is not part of the op's time.
#include "shardtrain/ops/timed_ops.hpp"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <type_traits>
#include <utility>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::ops {

void OpTimes::add(OpCall call, double seconds, double cpu_seconds) {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = keys_.find(call.key);
  if (it == keys_.end()) {
    std::string key = call.key;
    it = keys_.emplace(std::move(key), Key{std::move(call), {}, {}}).first;
  }
  ++it->second.open.calls;
  it->second.open.seconds += seconds;
  it->second.open.cpu_seconds += cpu_seconds;
}

void OpTimes::end_period() {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, k] : keys_) {
    if (k.open.calls > 0) k.periods.push_back(k.open);
    k.open = {};
  }
  ++periods_;
}

int64_t OpTimes::periods() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return periods_;
}

std::vector<OpTimes::Summary> OpTimes::summary() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Summary> out;
  for (const auto& [key, k] : keys_) {
    if (k.periods.empty()) continue;
    Summary s{k.call};
    std::vector<double> per_call, cpu_per_call;
    double seconds = 0;
    for (const Period& p : k.periods) {
      s.calls += p.calls;
      seconds += p.seconds;
      per_call.push_back(p.seconds / static_cast<double>(p.calls));
      cpu_per_call.push_back(p.cpu_seconds / static_cast<double>(p.calls));
    }
    s.cpu_seconds = median(std::move(cpu_per_call));
    s.calls_per_period = static_cast<double>(s.calls) / static_cast<double>(periods_);
    s.seconds = median(std::move(per_call));
    s.seconds_mean = seconds / static_cast<double>(s.calls);
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The description of the last call made through it.
class LastCall final : public DescribingOps {
 public:
  OpCall last;
  DeviceKind device() const override { return DeviceKind::Cpu; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
  std::unique_ptr<Ops> make_side_ops() const override {
    throw InternalError("timed ops: the describer of calls has no side ops");
  }

 protected:
  void on_call(OpCall call) override { last = std::move(call); }
};

class TimedOps final : public Ops {
 public:
  TimedOps(std::unique_ptr<Ops> inner, OpTimes& times) : inner_(std::move(inner)), times_(times) {}

  DeviceKind device() const override { return inner_->device(); }
  void set_stream(StreamRef stream) override { inner_->set_stream(stream); }
  StreamRef stream() const override { return inner_->stream(); }
  std::unique_ptr<Ops> make_side_ops() const override { return make_timed_ops(inner_->make_side_ops(), times_); }

#define SHARDTRAIN_OP(R, name, params, args)                                       \
  R name params override {                                                         \
    if (!times_.enabled()) return inner_->name(SHARDTRAIN_OP_UNPAREN args);        \
    describer_.name(SHARDTRAIN_OP_UNPAREN args);                                   \
    return timed([&]() -> R { return inner_->name(SHARDTRAIN_OP_UNPAREN args); }); \
  }
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

  void defer_loss(bool on) override { inner_->defer_loss(on); }
  LossSums take_loss() override { return inner_->take_loss(); }

 private:
  // f's result, its wall time added to the times under the last call described (an op that throws adds nothing).
  template <typename F>
  auto timed(F&& f) -> decltype(f()) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_seconds();
    auto record = [&] {
      times_.add(std::move(describer_.last), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 thread_cpu_seconds() - cpu_start);
    };
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      record();
    } else {
      auto result = f();
      record();
      return result;
    }
  }

  std::unique_ptr<Ops> inner_;
  OpTimes& times_;
  LastCall describer_;
};

}  // namespace

std::unique_ptr<Ops> make_timed_ops(std::unique_ptr<Ops> inner, OpTimes& times) {
  if (!inner) throw InternalError("timed ops: no ops to time");
  if (inner->device() == DeviceKind::Cuda)
    throw InternalError(
        "timed ops: CUDA ops queue kernels and return; their wall time is not the kernels' (only the CPU backend's "
        "ops are timed in the step)");
  return std::make_unique<TimedOps>(std::move(inner), times);
}

}  // namespace shardtrain::ops
