// The device casts against the CPU's bf16 conversion, bit for bit, on odd sizes and special values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cast.cuh"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "tests/common/gpu_required.hpp"

using namespace shardtrain;

TEST(CastKernel, MatchesCpuBitForBit) {
  ST_SKIP_WITHOUT_GPU("cast kernel test");
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000003}}) {
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i)
      in[i] = std::ldexp(std::sin(static_cast<float>(i) * 0.37f), static_cast<int>(i % 60) - 30);
    if (n > 4) {
      in[1] = std::numeric_limits<float>::infinity();
      in[2] = std::bit_cast<float>(0x3f808000u);  // a tie: rounds to even
      in[3] = std::bit_cast<float>(0x3fffffffu);  // carries into the exponent
    }
    DeviceBuffer d_in(n * 4), d_mid(n * 2), d_out(n * 4);
    CudaStream s;
    copy_async(d_in.data(), in.data(), n * 4, s.ref());
    kernels::cast_f32_to_bf16(static_cast<float*>(d_in.data()), static_cast<uint16_t*>(d_mid.data()), n, s.ref());
    kernels::cast_bf16_to_f32(static_cast<uint16_t*>(d_mid.data()), static_cast<float*>(d_out.data()), n, s.ref());
    std::vector<uint16_t> mid(n);
    std::vector<float> out(n);
    copy_async(mid.data(), d_mid.data(), n * 2, s.ref());
    copy_async(out.data(), d_out.data(), n * 4, s.ref());
    s.synchronize();
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      bad += mid[i] != bf16(in[i]).bits;
      bad += std::bit_cast<uint32_t>(out[i]) != std::bit_cast<uint32_t>(float_from_bf16_bits(mid[i]));
    }
    EXPECT_EQ(bad, 0u) << "n=" << n;
  }
}
