// How a GPU test behaves without a device: it skips, saying why (the CUDA runtime's own reason), unless
// SHARDTRAIN_REQUIRE_GPU=1, which scripts/gpu/run.sh sets on a machine whose nvidia-smi lists a GPU: there
// a test that cannot reach the device fails, so a GPU session can never pass by skipping everything.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain::test_env {

inline bool gpu_required() {
  const char* v = std::getenv("SHARDTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace shardtrain::test_env

// In a TEST body or a fixture's SetUp: returns from it (skipped, or failed under SHARDTRAIN_REQUIRE_GPU=1)
// when no CUDA device is visible. `what` names what is skipped ("GPU ops test").
#define ST_SKIP_WITHOUT_GPU(what)                                                                                         \
  do {                                                                                                                    \
    if (::shardtrain::cuda_device_count() == 0) {                                                                         \
      if (::shardtrain::test_env::gpu_required()) {                                                                       \
        FAIL() << "SHARDTRAIN_REQUIRE_GPU=1, but no CUDA device is visible: " << ::shardtrain::cuda_unavailable_reason(); \
      }                                                                                                                   \
      GTEST_SKIP() << "no CUDA device (" << ::shardtrain::cuda_unavailable_reason() << "): " << (what) << " skipped";     \
    }                                                                                                                     \
  } while (0)
