// vexp (src/ops/cpu/vec_exp.hpp), the fp32 exp of the CPU backend's softmax and SiLU: within 2 ulp of the
// correctly rounded exp over its whole finite range, and the documented edges. And the fp32 row loops of
// rows.hpp as the program runs them (the instruction-set clone this CPU selects) against f64.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "src/ops/cpu/rows.hpp"
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

// Masked softmax rows (attention), the cross-entropy row and SwiGLU at lengths around the vector widths, with
// masked keys, against the same formulas in f64.
TEST(RowLoops, Fp32AgainstF64) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-20.0, 20.0);
  for (int64_t n : {1, 7, 16, 33, 200, 4099}) {
    SCOPED_TRACE(n);
    std::vector<float> row(static_cast<size_t>(n)), z(static_cast<size_t>(n));
    std::vector<int32_t> seg(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) {
      row[static_cast<size_t>(c)] = static_cast<float>(u(rng));
      z[static_cast<size_t>(c)] = static_cast<float>(u(rng));
      seg[static_cast<size_t>(c)] = c % 3 == 1 ? 9 : 4;  // every third key in another document
    }
    const int64_t cend = n - n / 4;  // the rest is past the causal limit
    const std::vector<float> scores = row;
    const float lse = rows::softmax(row.data(), n, cend, seg.data(), 4);
    double m = -1e300, l = 0;
    for (int64_t c = 0; c < cend; ++c)
      if (seg[static_cast<size_t>(c)] == 4) m = std::max(m, static_cast<double>(scores[static_cast<size_t>(c)]));
    for (int64_t c = 0; c < cend; ++c)
      if (seg[static_cast<size_t>(c)] == 4) l += std::exp(scores[static_cast<size_t>(c)] - m);
    EXPECT_NEAR(lse, m + std::log(l), 2e-6 * std::abs(m + std::log(l)) + 1e-6);
    for (int64_t c = 0; c < n; ++c) {
      const double ref =
          c < cend && seg[static_cast<size_t>(c)] == 4 ? std::exp(scores[static_cast<size_t>(c)] - m) / l : 0.0;
      ASSERT_NEAR(row[static_cast<size_t>(c)], ref, 4e-6 * ref) << c;
    }
    // The backward row recomputes the same probabilities from lse: ds = p (dp - d).
    std::vector<float> p = scores, ds(static_cast<size_t>(n), 2.0f);
    rows::probs_and_ds(p.data(), ds.data(), n, cend, seg.data(), 4, lse, 0.5f);
    for (int64_t c = 0; c < n; ++c) {
      ASSERT_NEAR(p[static_cast<size_t>(c)], row[static_cast<size_t>(c)], 8e-6 * row[static_cast<size_t>(c)]) << c;
      ASSERT_NEAR(ds[static_cast<size_t>(c)], 1.5 * row[static_cast<size_t>(c)], 1.2e-5 * row[static_cast<size_t>(c)]) << c;
    }
    // Cross-entropy: -log softmax(z)[t] and scale * (softmax(z) - onehot(t)).
    const int32_t t = static_cast<int32_t>(n / 2);
    double zm = -1e300, zl = 0;
    for (float x : z) zm = std::max(zm, static_cast<double>(x));
    for (float x : z) zl += std::exp(x - zm);
    const std::vector<float> logits = z;
    const float loss = rows::cross_entropy(z.data(), n, t, 0.25f, true);
    EXPECT_NEAR(loss, zm + std::log(zl) - logits[static_cast<size_t>(t)], 1e-5 * std::abs(zm + std::log(zl)) + 1e-6);
    for (int64_t c = 0; c < n; ++c) {
      const double ref = 0.25 * (std::exp(logits[static_cast<size_t>(c)] - zm) / zl - (c == t ? 1.0 : 0.0));
      ASSERT_NEAR(z[static_cast<size_t>(c)], ref, 4e-6 * std::abs(ref) + 1e-9) << c;
    }
    // SwiGLU forward and backward (in place over gate and up, as the model calls it).
    std::vector<float> g = scores, up = logits, out(static_cast<size_t>(n)), dout(static_cast<size_t>(n), 0.75f);
    rows::swiglu_forward(g.data(), up.data(), out.data(), n);
    rows::swiglu_backward(dout.data(), g.data(), up.data(), g.data(), up.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      const double x = scores[static_cast<size_t>(c)], y = logits[static_cast<size_t>(c)], s = 1 / (1 + std::exp(-x));
      ASSERT_NEAR(out[static_cast<size_t>(c)], x * s * y, 2e-6 * std::abs(x * s * y) + 1e-30) << c;
      ASSERT_NEAR(up[static_cast<size_t>(c)], 0.75 * x * s, 2e-6 * std::abs(x * s) + 1e-30) << c;
      const double dg = 0.75 * y * (s + x * s * (1 - s));
      ASSERT_NEAR(g[static_cast<size_t>(c)], dg, 4e-6 * std::abs(dg) + 1e-7) << c;
    }
  }
}

}  // namespace
}  // namespace shardtrain::ops::cpu
