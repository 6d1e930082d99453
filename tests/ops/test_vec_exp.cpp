// vexp (src/ops/cpu/vec_exp.hpp), the fp32 exp of the CPU backend's softmax and SiLU: within 2 ulp of the
// correctly rounded exp over its whole finite range, and the documented edges.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "src/ops/cpu/vec_exp.hpp"

namespace shardtrain::ops::cpu {
namespace {

// |got - exp(x)| in units of the fp32 spacing at exp(x).
double ulps(float got, float x) {
  const double ref = std::exp(static_cast<double>(x));
  const float rf = static_cast<float>(ref);
  const double spacing = static_cast<double>(std::nextafter(rf, std::numeric_limits<float>::infinity())) - rf;
  return std::abs(static_cast<double>(got) - ref) / spacing;
}

TEST(VecExp, WithinTwoUlpOverTheFiniteRange) {
  double worst = 0;
  float worst_x = 0;
  int64_t checked = 0;
  // Every 61st fp32 bit pattern: about 35 million arguments, both signs, every exponent.
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 61) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (!(x >= -86.9f && x <= 88.7228317f)) continue;
    const double e = ulps(vexp(x), x);
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
    ++checked;
  }
  EXPECT_GT(checked, 30'000'000);
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  // Exact where the series' truncation has nothing to lose.
  EXPECT_EQ(vexp(0.0f), 1.0f);
  EXPECT_EQ(vexp(-0.0f), 1.0f);
  EXPECT_LE(ulps(vexp(1.0f), 1.0f), 1.0);
}

TEST(VecExp, Edges) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(vexp(-inf), 0.0f);  // masked softmax scores
  EXPECT_EQ(vexp(-87.0f), 0.0f);
  EXPECT_EQ(vexp(-1000.0f), 0.0f);
  EXPECT_GT(vexp(-86.9f), 0.0f);
  EXPECT_EQ(vexp(inf), inf);
  EXPECT_EQ(vexp(88.73f), inf);
  EXPECT_TRUE(std::isfinite(vexp(88.7228317f)));
  EXPECT_LE(ulps(vexp(88.7228317f), 88.7228317f), 2.0);
  EXPECT_TRUE(std::isnan(vexp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_compute(0.5), std::exp(0.5));  // f64 stays the library's exp
}

}  // namespace
}  // namespace shardtrain::ops::cpu
