// The real libcudnn (dlopened, as the CUDA backend loads it) against the SDPA graph descriptions, without a GPU:
//   - every tensor and operation descriptor of the forward and backward graphs is created and finalized (no handle
//     needed), for head dims 64 and 128, H/Hkv 12/3 and 32/8, causal and packed documents, the deterministic
//     backward too: wrong attribute types, counts or inconsistent dims fail here, before any GPU time;
//   - with cuDNN 9.11 or later, whole plans (operation graph, heuristics, engine config, execution plan) are
//     built for a described H100 (cuDNN's deviceless planning from JSON device properties), which shows that an
//     engine takes each graph, and what it is: whether it is noted nondeterministic, its workspace.
// cuDNN's attention engines are runtime-compiled: finalizing a plan compiles the kernel (NVRTC) and loads it through
// the driver library, deviceless too. Where no driver is installed (this CI), the toolkit's stub libcuda (same
// soname) is loaded first: the engines then pass every support check and compile, and only the load fails
// (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER: the stub's cuLibraryLoadData), which the test accepts there.
// Skips, saying so, where libcudnn is absent.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/ops/cuda/cudnn_attention.hpp"
#include "src/ops/cuda/cudnn_library.hpp"
#include "src/ops/cuda/cudnn_sdpa_graph.hpp"

namespace shardtrain::ops::cuda {
namespace {

// An H100 SXM's properties in the JSON form cuDNN's device-property descriptor reads (the form XLA and
// cudnn-frontend serialize): 132 SMs, compute capability 9.0, 227 KiB of opt-in shared memory per block.
const char* kH100Json = R"({"deviceVer": 900, "multiProcessorCount": 132, "warpSize": 32,
  "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024,
  "maxRegistersPerSM": 65536, "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048,
  "regsPerBlock": 65536, "totalGlobalMem": 85520809984, "smClockRateKHz": 1980000, "l2CacheSize": 52428800,
  "maxBlockSize": [1024, 1024, 64], "memClockRateKHz": 2619000, "maxGridSize": [2147483647, 65535, 65535],
  "supportCoopLaunch": 1, "pciDeviceId": 0, "isTccDriver": 0, "cudaDeviceId": 0, "driverVer": 13000,
  "deviceName": "NVIDIA H100 80GB HBM3"})";

enum class Driver { Real, Stub, None };

// The driver library, or the toolkit's stub standing in for it (loaded once; kept for the process).
Driver driver() {
  static const Driver d = [] {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) return Driver::Real;
    std::vector<std::string> stubs;
    if (const char* home = std::getenv("CUDA_HOME")) stubs.push_back(std::string(home) + "/lib64/stubs/libcuda.so");
    stubs.push_back("/usr/local/cuda/lib64/stubs/libcuda.so");
    stubs.push_back("/usr/local/cuda/lib/stubs/libcuda.so");
    for (const std::string& path : stubs)
      if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) return Driver::Stub;
    return Driver::None;
  }();
  return d;
}

// Whether the call's plan was built, or (with the stub driver) at least one engine got as far as loading its
// compiled kernel. Prints the engines tried.
bool planned(CudnnAttention& attention, const SdpaCall& c) {
  const std::string why = attention.unsupported_reason(c, DType::BF16);
  const std::vector<PlanAttempt>& attempts = attention.plan_attempts(c);
  const SdpaPlanInfo* info = attention.plan_info(c);
  if (info != nullptr) {
    std::printf("  %-56s planned: %s, workspace %zu B (cuDNN %lld B), %.0f ms\n", describe_call(c).c_str(),
                info->engine.c_str(), info->workspace_bytes, static_cast<long long>(info->cudnn_workspace_bytes),
                info->build_ms);
    return true;
  }
  const bool compiled = driver() == Driver::Stub && std::any_of(attempts.begin(), attempts.end(), [](const PlanAttempt& a) {
                          return a.status == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
                        });
  std::printf("  %-56s %s\n", describe_call(c).c_str(),
              compiled ? "compiled, the stub driver cannot load it:" : why.c_str());
  for (const PlanAttempt& a : attempts) std::printf("      %s\n", a.describe().c_str());
  return compiled;
}

std::vector<SdpaCall> cases(int64_t seq) {
  std::vector<SdpaCall> out;
  for (int64_t dh : {64, 128})
    for (auto [h, hk] : {std::pair<int64_t, int64_t>{12, 3}, {32, 8}})
      for (SdpaMasking m : {SdpaMasking::Causal, SdpaMasking::Documents})
        for (int variant = 0; variant < 3; ++variant) {
          SdpaCall c;
          c.batch = 2;
          c.seq = seq;
          c.heads = h;
          c.kv_heads = hk;
          c.head_dim = dh;
          c.masking = m;
          c.max_sequences = m == SdpaMasking::Documents ? 6 : 0;
          c.direction = variant == 0 ? SdpaDirection::Forward : SdpaDirection::Backward;
          c.deterministic = variant == 2;
          out.push_back(c);
        }
  return out;
}

class CudnnDescriptors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    lib_ = CudnnLibrary::load(&why);
    if (!lib_) GTEST_SKIP() << "cuDNN not found (" << why << "): cuDNN descriptor test skipped";
    std::printf("cuDNN %s (%s)\n", lib_->version_text().c_str(), lib_->soname().c_str());
  }
  std::unique_ptr<CudnnLibrary> lib_;
};

TEST_F(CudnnDescriptors, EveryTensorAndOperationFinalizesWithoutADevice) {
  const SdpaTarget target{lib_->version(), 90};
  for (const SdpaCall& c : cases(512)) {
    SCOPED_TRACE(describe_call(c));
    const SdpaGraph g = describe_sdpa(c, target);
    try {
      RealizedGraph r = realize_operations(*lib_, g);
      EXPECT_EQ(r.tensors.size(), g.tensors.size());
      EXPECT_EQ(r.operations.size(), g.ops.size());
      for (const BackendDescriptor& d : r.tensors) EXPECT_NE(d.get(), nullptr);
      for (const BackendDescriptor& d : r.operations) EXPECT_NE(d.get(), nullptr);
    } catch (const CudnnBuildError& e) {
      ADD_FAILURE() << e.what();
    }
  }
}

// A wrong attribute is reported with the descriptor, the attribute and cuDNN's own words.
TEST_F(CudnnDescriptors, RefusalsNameTheDescriptorAndCudnnsReason) {
  SdpaCall c;
  c.batch = 2;
  c.seq = 64;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 64;
  SdpaGraph g = describe_sdpa(c, SdpaTarget{lib_->version(), 90});
  SdpaGraph bad_dims = g;
  bad_dims.tensors.front().dims[0] = -1;
  try {
    realize_operations(*lib_, bad_dims);
    ADD_FAILURE() << "a tensor with a negative dim was accepted";
  } catch (const CudnnBuildError& e) {
    const std::string what = e.what();
    std::printf("  %s\n", what.c_str());
    EXPECT_NE(what.find("tensor Q"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDNN_STATUS_"), std::string::npos) << what;
  }
  SdpaGraph bad_matmul = g;  // q's head dim no longer k's: the first matmul cannot finalize
  bad_matmul.tensors.front().dims[3] = 32;
  try {
    realize_operations(*lib_, bad_matmul);
    ADD_FAILURE() << "a matmul of mismatched operands was accepted";
  } catch (const CudnnBuildError& e) {
    const std::string what = e.what();
    std::printf("  %s\n", what.c_str());
    EXPECT_NE(what.find("matmul bmm1"), std::string::npos) << what;
  }
}

TEST_F(CudnnDescriptors, PlansForADescribedH100) {
  if (lib_->version() < 91100)
    GTEST_SKIP() << "cuDNN " << lib_->version_text() << " has no deviceless planning (9.11 and later)";
  if (driver() == Driver::None) GTEST_SKIP() << "no driver library nor the toolkit's stub: plans cannot compile";
  std::printf("driver library: %s\n", driver() == Driver::Real ? "libcuda.so.1" : "the toolkit's stub");
  CudnnAttention attention(CudnnAttentionOptions{size_t{64} << 30, kH100Json, 90});
  for (const SdpaCall& c : cases(512)) {
    SCOPED_TRACE(describe_call(c));
    EXPECT_TRUE(planned(attention, c)) << attention.unsupported_reason(c, DType::BF16);
    // The deterministic backward never runs, nor compiles, an engine noted nondeterministic.
    if (c.direction == SdpaDirection::Backward && c.deterministic) {
      for (const PlanAttempt& a : attention.plan_attempts(c)) EXPECT_TRUE(a.skipped || !a.nondeterministic);
    }
  }
  // Reasons that need no engine, from the same object.
  const SdpaCall f32 = cases(512).front();
  EXPECT_EQ(attention.unsupported_reason(f32, DType::F32),
            "f32 (cuDNN's flash attention takes bf16/fp16; shardtrain uses bf16)");
  SdpaCall odd = f32;
  odd.head_dim = 60;
  EXPECT_EQ(attention.unsupported_reason(odd, DType::BF16), "head dim 60 (multiple of 8 up to 256 needed)");
}

// The odd lengths of the GPU test (45 and 130, and cuDNN <= 9.15's padding workaround there) plan too.
TEST_F(CudnnDescriptors, OddLengthsPlanForADescribedH100) {
  if (lib_->version() < 91100)
    GTEST_SKIP() << "cuDNN " << lib_->version_text() << " has no deviceless planning (9.11 and later)";
  if (driver() == Driver::None) GTEST_SKIP() << "no driver library nor the toolkit's stub: plans cannot compile";
  CudnnAttention attention(CudnnAttentionOptions{size_t{64} << 30, kH100Json, 90});
  for (int64_t s : {45, 130})
    for (SdpaMasking m : {SdpaMasking::Causal, SdpaMasking::Documents})
      for (int variant = 0; variant < 3; ++variant) {
        SdpaCall c;
        c.batch = 2;
        c.seq = s;
        c.heads = 6;
        c.kv_heads = 2;
        c.head_dim = 64;
        c.masking = m;
        c.max_sequences = m == SdpaMasking::Documents ? 12 : 0;
        c.direction = variant == 0 ? SdpaDirection::Forward : SdpaDirection::Backward;
        c.deterministic = variant == 2;
        SCOPED_TRACE(describe_call(c));
        EXPECT_TRUE(planned(attention, c)) << attention.unsupported_reason(c, DType::BF16);
      }
}

}  // namespace
}  // namespace shardtrain::ops::cuda
