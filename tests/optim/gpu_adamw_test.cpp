// AdamW and the gradient norm on device shards against the host path on identical shards: odd sizes,
// ranges at every residue mod 4 (the kernel's float4 head and tail), shards whose param and grad sit at a
// different 16-byte offset than the states (the kernel's scalar fallback), decayed and exempt ranges,
// padding never touched. Every test skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "tests/common/gpu_required.hpp"

namespace shardtrain::testing_optim {
namespace {

constexpr float kPad = 7.25f;

class GpuAdamW : public ::testing::Test {
 protected:
  void SetUp() override { ST_SKIP_WITHOUT_GPU("GPU AdamW test"); }
};

// Device copies of a host shard set. With `offset` 1 each shard's param and grad start one float past a
// cudaMalloc boundary, while the optimizer's states start on one: no chunk shares their alignment.
struct DeviceShards {
  std::vector<DeviceBuffer> param, grad;
  std::vector<fsdp::ShardView> views;
  int64_t offset = 0;
  DeviceShards(const HostShards& h, int64_t off) : offset(off) {
    for (size_t i = 0; i < h.views.size(); ++i) {
      const size_t bytes = (h.param[i].size() + static_cast<size_t>(offset)) * sizeof(float);
      param.emplace_back(bytes);
      grad.emplace_back(bytes);
      fsdp::ShardView v = h.views[i];
      v.param = static_cast<float*>(param[i].data()) + offset;
      v.grad = static_cast<float*>(grad[i].data()) + offset;
      v.device = DeviceKind::Cuda;
      views.push_back(std::move(v));
    }
    upload(h.param, true);
    upload(h.grad, false);
  }
  void upload(const std::vector<std::vector<float>>& host, bool params) {
    for (size_t i = 0; i < views.size(); ++i) {
      if (host[i].empty()) continue;
      ST_CHECK_CUDA(cudaMemcpy(params ? views[i].param : views[i].grad, host[i].data(), host[i].size() * sizeof(float),
                               cudaMemcpyHostToDevice));
    }
    // A copy from pageable memory may return before it lands, and non-blocking streams do not wait for it.
    ST_CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<float> download(size_t i, bool params) const {
    std::vector<float> out(static_cast<size_t>(views[i].numel));
    if (!out.empty()) {
      ST_CHECK_CUDA(cudaMemcpy(out.data(), params ? views[i].param : views[i].grad, out.size() * sizeof(float),
                               cudaMemcpyDeviceToHost));
    }
    return out;
  }
};

std::vector<float> state_of(const optim::AdamW& a, size_t i, optim::OptimState which) {
  std::vector<float> out(static_cast<size_t>(a.numel(i)));
  a.read_state(i, which, out);
  return out;
}

// Relative 1e-6 with an absolute floor of 1e-6 of the largest magnitude; exact equality for padding
// (the host side holds kPad in params, 0 in states there). Prints the worst element, and how many differ
// at all (the kernel avoids FMA contraction, so 0 is expected).
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  const ShardSpec& spec) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double maxabs = 0;
  for (float w : want) maxabs = std::max(maxabs, std::abs(static_cast<double>(w)));
  double worst = -1;
  size_t worst_k = 0, differing = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    if (!in_ranges(spec, static_cast<int64_t>(k))) {
      ASSERT_EQ(std::memcmp(&got[k], &want[k], sizeof(float)), 0)
          << what << ": padding element " << k << " is " << got[k] << ", was " << want[k];
      continue;
    }
    differing += std::memcmp(&got[k], &want[k], sizeof(float)) != 0;
    const double excess = std::abs(static_cast<double>(got[k]) - want[k]) - (1e-6 * std::abs(want[k]) + 1e-6 * maxabs);
    if (excess > worst) worst = excess, worst_k = k;
  }
  if (differing > 0)
    std::printf("  %s: %zu of %zu elements differ from the host in their last bits\n", what.c_str(), differing, want.size());
  if (!want.empty()) {
    EXPECT_LE(worst, 0.0) << what << " element " << worst_k << ": GPU " << got[worst_k] << ", CPU " << want[worst_k];
  }
}

optim::AdamWConfig exempt_config() {
  optim::AdamWConfig c;
  c.decay = optim::DecayScope::ExemptNormsAndEmbeddings;
  return c;
}

TEST_F(GpuAdamW, MatchesTheHostUpdateOverFiveSteps) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  for (int64_t offset : {0, 1}) {
    SCOPED_TRACE(offset == 0 ? "aligned shard buffers (float4 path)" : "shard buffers off by one float (scalar path)");
    HostShards host = make_host_shards(spec, specs, 17, kPad);
    DeviceShards dev(host, offset);
    optim::AdamW on_host(host.views, spec, exempt_config(), nullptr);
    MemoryLedger ledger;
    optim::AdamW on_device(dev.views, spec, exempt_config(), &ledger);
    ASSERT_EQ(on_device.device(), DeviceKind::Cuda);
    int64_t state_bytes = 0;
    for (const ShardSpec& s : specs) state_bytes += 2 * s.numel * 4;
    EXPECT_EQ(ledger.current(MemoryCategory::OptimizerStates), state_bytes);
    // A stream of its own for the aligned run, the legacy default stream for the other.
    CudaStream own;
    const StreamRef stream = offset == 0 ? own.ref() : StreamRef{};
    for (int step = 0; step < 5; ++step) {
      fill_grads(host.grad, specs, step);
      dev.upload(host.grad, false);  // synchronous, and the previous step has finished (below)
      const double lr = 1e-2 / (step + 1), scale = step == 2 ? 0.25 : 1.0;
      on_host.step(host.views, lr, scale);
      on_device.step(dev.views, lr, scale, stream);
      stream_synchronize(stream);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string shard = "shard " + std::to_string(i);
      expect_close(shard + " param", dev.download(i, true), host.param[i], specs[i]);
      for (optim::OptimState which : {optim::OptimState::ExpAvg, optim::OptimState::ExpAvgSq}) {
        expect_close(shard + (which == optim::OptimState::ExpAvg ? " exp_avg" : " exp_avg_sq"),
                     state_of(on_device, i, which), state_of(on_host, i, which), specs[i]);
      }
      // Gradients are read only.
      if (!host.grad[i].empty()) {
        EXPECT_EQ(std::memcmp(dev.download(i, false).data(), host.grad[i].data(), host.grad[i].size() * sizeof(float)), 0);
      }
    }
  }
}

// The update in two launches (AdamW::step_split, the engine's gather-ahead between them): the bits of one launch.
TEST_F(GpuAdamW, StepSplitGivesStepsBits) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards host = make_host_shards(spec, specs, 23, kPad);
  DeviceShards a(host, 0), b(host, 0);
  optim::AdamW whole(a.views, spec, exempt_config(), nullptr), split(b.views, spec, exempt_config(), nullptr);
  for (int step = 0; step < 3; ++step) {
    fill_grads(host.grad, specs, step);
    a.upload(host.grad, false);
    b.upload(host.grad, false);
    int calls = 0;
    whole.step(a.views, 1e-2, 1.0);
    split.step_split(b.views, 1e-2, 1.0, {}, {5, 1}, [&] { ++calls; });
    ST_CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT_EQ(calls, 1);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<float> pa = a.download(i, true), pb = b.download(i, true);
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0) << "shard " << i;
  }
}

TEST_F(GpuAdamW, StatesRoundTripThroughTheHost) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards host = make_host_shards(spec, specs, 23, kPad);
  DeviceShards dev(host, 0);
  optim::AdamW adamw(dev.views, spec, exempt_config(), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<float> zeros(static_cast<size_t>(specs[i].numel), 0.0f);
    EXPECT_EQ(state_of(adamw, i, optim::OptimState::ExpAvgSq), zeros) << "states start at zero";
    std::vector<float> values(zeros.size());
    for (size_t k = 0; k < values.size(); ++k) values[k] = 0.5f + static_cast<float>(k % 97) + static_cast<float>(i);
    adamw.write_state(i, optim::OptimState::ExpAvg, values);
    EXPECT_EQ(state_of(adamw, i, optim::OptimState::ExpAvg), values);
    EXPECT_EQ(state_of(adamw, i, optim::OptimState::ExpAvgSq), zeros) << "the other state is untouched";
  }
  std::vector<float> wrong(static_cast<size_t>(specs[0].numel + 1));
  EXPECT_THROW(adamw.read_state(0, optim::OptimState::ExpAvg, wrong), InternalError);
}

// The same global norm from device shards as from host shards, over one rank and over three replicas,
// with the all-reduce on the host (MPI) or in device memory (NCCL-like), with and without kept scratch.
class DeviceReplicaComm : public ReplicaComm {
 public:
  explicit DeviceReplicaComm(int size) : ReplicaComm(size, MemorySpace::Device) {}

 protected:
  void do_all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef stream) override {
    std::vector<double> h(count);
    auto s = static_cast<cudaStream_t>(stream.handle);
    ST_CHECK_CUDA(cudaMemcpyAsync(h.data(), send, count * sizeof(double), cudaMemcpyDeviceToHost, s));
    ST_CHECK_CUDA(cudaStreamSynchronize(s));
    ReplicaComm::do_all_reduce(h.data(), h.data(), count, dtype, op, stream);
    ST_CHECK_CUDA(cudaMemcpyAsync(recv, h.data(), count * sizeof(double), cudaMemcpyHostToDevice, s));
    ST_CHECK_CUDA(cudaStreamSynchronize(s));
  }
};

TEST_F(GpuAdamW, GradNormMatchesTheHost) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards host = make_host_shards(spec, specs, 29, 0.0f);
  DeviceShards dev(host, 1);
  const double want_sq = optim::grad_sq_sum_local(host.views);
  ASSERT_GT(want_sq, 0);
  CudaStream stream;
  optim::GradNorm scratch;
  EXPECT_NEAR(optim::grad_sq_sum_local(dev.views), want_sq, 1e-6 * want_sq);
  EXPECT_NEAR(optim::grad_sq_sum_local(dev.views, stream.ref(), &scratch), want_sq, 1e-6 * want_sq);
  ReplicaComm host_one(1, MemorySpace::Host), host_three(3, MemorySpace::Host);
  DeviceReplicaComm device_three(3);
  const double want = std::sqrt(want_sq), want3 = std::sqrt(3 * want_sq);
  EXPECT_NEAR(optim::grad_norm_global(dev.views, host_one, stream.ref(), &scratch), want, 1e-6 * want);
  EXPECT_NEAR(optim::grad_norm_global(dev.views, host_three, stream.ref(), &scratch), want3, 1e-6 * want3);
  EXPECT_NEAR(optim::grad_norm_global(dev.views, device_three, stream.ref()), want3, 1e-6 * want3);
  EXPECT_EQ(host_three.traffic().calls(CollectiveKind::AllReduce), 1u);
  EXPECT_EQ(device_three.traffic().calls(CollectiveKind::AllReduce), 1u);
  // The same bits every call (a fixed reduction order), kept scratch or not.
  EXPECT_EQ(optim::grad_sq_sum_local(dev.views, stream.ref(), &scratch), optim::grad_sq_sum_local(dev.views));
  // The two halves the training step uses, with the caller's own stream synchronization between them (the
  // loss read): the result is the same, and a second read needs a second start.
  scratch.start(dev.views, &device_three, stream.ref());
  stream.synchronize();
  EXPECT_NEAR(scratch.norm(), want3, 1e-6 * want3);
  EXPECT_THROW(scratch.norm(), InternalError);
  scratch.start(dev.views, &host_three, stream.ref());
  EXPECT_NEAR(scratch.sum_of_squares(), 3 * want_sq, 1e-6 * want_sq);

  optim::poison_first_gradient(dev.views);
  std::vector<float> g0 = dev.download(0, false);
  EXPECT_TRUE(std::isnan(g0[0]));
  EXPECT_EQ(std::memcmp(g0.data() + 1, host.grad[0].data() + 1, (g0.size() - 1) * sizeof(float)), 0);
  EXPECT_TRUE(std::isnan(optim::grad_norm_global(dev.views, device_three, stream.ref(), &scratch)));
}

TEST_F(GpuAdamW, RefusesMixedShards) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards host = make_host_shards(spec, specs, 31, kPad);
  DeviceShards dev(host, 0);
  std::vector<fsdp::ShardView> mixed = dev.views;
  mixed[1] = host.views[1];
  EXPECT_THROW(optim::AdamW(mixed, spec, exempt_config(), nullptr), InternalError);
  EXPECT_THROW(optim::grad_sq_sum_local(mixed), InternalError);
}

}  // namespace
}  // namespace shardtrain::testing_optim
