// Every op's backward against central finite differences in double precision, at odd shapes.
#include <cmath>
#include <limits>
#include <numbers>

#include "op_test_util.hpp"

namespace shardtrain::ops::test {
namespace {

TEST(OpGradients, LinearWeightAndInput) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(1);
  const int64_t n = 7, in = 5, out = 3;
  HostTensor x = random_tensor({n, in}, rng), w = random_tensor({out, in}, rng), r = random_tensor({n, out}, rng);
  HostTensor y({n, out});
  auto loss = [&] {
    ops->matmul(Transpose::No, Transpose::Yes, 1.0, x.view(), w.view(), 0.0, y.view());
    return dot(y, r);
  };
  HostTensor dx({n, in}), dw({out, in});
  ops->fill(dw.view(), 0.5);  // accumulation: the analytic gradient adds to what was there
  ops->matmul(Transpose::Yes, Transpose::No, 1.0, r.view(), x.view(), 1.0, dw.view());
  ops->matmul(Transpose::No, Transpose::No, 1.0, r.view(), w.view(), 0.0, dx.view());
  for (double& v : dw.data) v -= 0.5;
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dw", w, dw, loss);
}

TEST(OpGradients, MatmulTransposesMatchReference) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(2);
  const int64_t m = 3, k = 4, n = 5;
  for (Transpose ta : {Transpose::No, Transpose::Yes}) {
    for (Transpose tb : {Transpose::No, Transpose::Yes}) {
      HostTensor a = random_tensor(ta == Transpose::No ? Shape{m, k} : Shape{k, m}, rng);
      HostTensor b = random_tensor(tb == Transpose::No ? Shape{k, n} : Shape{n, k}, rng);
      HostTensor c = random_tensor({m, n}, rng), c0 = c;
      ops->matmul(ta, tb, 2.0, a.view(), b.view(), 0.5, c.view());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += (ta == Transpose::No ? a[i * k + p] : a[p * m + i]) * (tb == Transpose::No ? b[p * n + j] : b[j * k + p]);
          EXPECT_NEAR(c[i * n + j], 2.0 * s + 0.5 * c0[i * n + j], 1e-12);
        }
      }
    }
  }
}

TEST(OpGradients, Embedding) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(3);
  const int64_t vocab = 11, d = 6, n = 9;
  HostTensor table = random_tensor({vocab, d}, rng), r = random_tensor({n, d}, rng), out({n, d});
  IntTensor ids({n});
  const int32_t pick[] = {3, 0, 10, 3, 7, 3, 1, 10, 5};
  for (int64_t i = 0; i < n; ++i) ids[i] = pick[i];
  auto loss = [&] {
    ops->embedding_forward(ids.view(), table.view(), out.view());
    return dot(out, r);
  };
  HostTensor dtable({vocab, d});
  ops->embedding_backward(ids.view(), r.view(), dtable.view());
  expect_gradient("dtable", table, dtable, loss, 1000);
  ids[4] = static_cast<int32_t>(vocab);
  EXPECT_THROW(ops->embedding_forward(ids.view(), table.view(), out.view()), DataError);
}

void check_rmsnorm(int64_t n, int64_t d, bool residual) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(static_cast<uint64_t>(n * 100 + d));
  HostTensor x = random_tensor({n, d}, rng), res = random_tensor({n, d}, rng), w = random_tensor({d}, rng);
  HostTensor ry = random_tensor({n, d}, rng), rh = random_tensor({n, d}, rng);
  HostTensor h({n, d}), y({n, d}), rstd({n});
  const double eps = 1e-5;
  auto loss = [&] {
    ops->rmsnorm_forward(x.view(), residual ? res.view() : Tensor{}, w.view(), eps, residual ? h.view() : Tensor{}, y.view(),
                         rstd.view());
    return dot(y, ry) + (residual ? dot(h, rh) : 0.0);
  };
  loss();
  // y = h / rms(h) * w
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double hv = x[i * d + j] + (residual ? res[i * d + j] : 0.0);
      ss += hv * hv;
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    EXPECT_NEAR(rstd[i], inv, 1e-12);
    EXPECT_NEAR(y[i * d], (x[i * d] + (residual ? res[i * d] : 0.0)) * inv * w[0], 1e-12);
  }
  HostTensor dh({n, d}), dw({d});
  ops->rmsnorm_backward(ry.view(), residual ? h.view() : x.view(), w.view(), rstd.view(), residual ? rh.view() : Tensor{},
                        dh.view(), dw.view());
  expect_gradient("dx", x, dh, loss);
  if (residual) expect_gradient("dresidual", res, dh, loss);
  expect_gradient("dweight", w, dw, loss);
}

TEST(OpGradients, RmsnormWithResidual) {
  check_rmsnorm(1, 8, true);
  check_rmsnorm(7, 33, true);
}
TEST(OpGradients, RmsnormPlain) { check_rmsnorm(5, 64, false); }

TEST(OpGradients, RopeBackwardIsTransposeAndRotateHalf) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(5);
  for (int64_t dh : {8, 64}) {
    const int64_t n = 7, heads = 3;
    HostTensor x = random_tensor({n, heads, dh}, rng), r = random_tensor({n, heads, dh}, rng), y({n, heads, dh});
    IntTensor pos({n});
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(3 * i + 1);
    auto loss = [&] {
      y.data = x.data;
      ops->rope(y.view(), pos.view(), RopeFrequencies{.theta = 10000.0}, RopeDirection::Forward);
      return dot(y, r);
    };
    loss();
    // rotate-half: y = x * cos + cat(-x2, x1) * sin, angle = pos * theta^(-2i/dh)
    const int64_t half = dh / 2;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < dh; ++i) {
        const int64_t f = i % half;
        const double ang = pos[t] * std::pow(10000.0, -2.0 * static_cast<double>(f) / static_cast<double>(dh));
        const double* row = &x.data[static_cast<size_t>((t * heads + 1) * dh)];
        const double rot = i < half ? -row[i + half] : row[i - half];
        EXPECT_NEAR(y[(t * heads + 1) * dh + i], row[i] * std::cos(ang) + rot * std::sin(ang), 1e-12);
      }
    }
    HostTensor dx = r;
    ops->rope(dx.view(), pos.view(), RopeFrequencies{.theta = 10000.0}, RopeDirection::Backward);
    expect_gradient("drope", x, dx, loss);
  }
}

TEST(OpGradients, RopeScoresDependOnRelativePosition) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(6);
  const int64_t dh = 16;
  HostTensor q = random_tensor({1, 1, dh}, rng), k = random_tensor({1, 1, dh}, rng);
  auto score = [&](int32_t pq, int32_t pk) {
    HostTensor a = q, b = k;
    IntTensor p1({1}, pq), p2({1}, pk);
    ops->rope(a.view(), p1.view(), RopeFrequencies{.theta = 10000.0}, RopeDirection::Forward);
    ops->rope(b.view(), p2.view(), RopeFrequencies{.theta = 10000.0}, RopeDirection::Forward);
    return dot(a, b);
  };
  EXPECT_NEAR(score(5, 2), score(13, 10), 1e-10);
  EXPECT_NEAR(score(0, 0), dot(q, k), 1e-12);
}

// The frequencies every backend rotates by (ops/rope.hpp): the plain ones as transformers forms them in fp32
// (bit for bit what the kernels computed before the table), linear scaling, and Llama 3.1's three bands
// (wavelength below original / high_freq_factor: kept; above original / low_freq_factor: divided by the factor;
// between: blended, strictly between the two and equal to the formula evaluated in double to fp32 rounding).
TEST(RopeFrequencies, PlainLinearAndLlama3Bands) {
  const int64_t dh = 64;
  const RopeFrequencies plain{.theta = 500000.0};
  const std::vector<float> base = rope_inv_freq<float>(plain, dh);
  for (int64_t i = 0; i < dh / 2; ++i)
    EXPECT_EQ(base[static_cast<size_t>(i)], 1.0f / std::pow(500000.0f, static_cast<float>(2 * i) / static_cast<float>(dh)))
        << i;
  const std::vector<float> linear =
      rope_inv_freq<float>({.theta = 500000.0, .scaling = RopeScaling::Linear, .factor = 4.0}, dh);
  for (int64_t i = 0; i < dh / 2; ++i) EXPECT_EQ(linear[static_cast<size_t>(i)], base[static_cast<size_t>(i)] / 4.0f) << i;

  const RopeFrequencies llama3{.theta = 500000.0,
                               .scaling = RopeScaling::Llama3,
                               .factor = 8.0,
                               .low_freq_factor = 1.0,
                               .high_freq_factor = 4.0,
                               .original_max_position = 64.0};
  const std::vector<float> scaled = rope_inv_freq<float>(llama3, dh);
  const std::vector<double> scaled64 = rope_inv_freq<double>(llama3, dh);
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < dh / 2; ++i) {
    const auto k = static_cast<size_t>(i);
    const double wavelen = 2 * std::numbers::pi / base[k];
    if (wavelen < 64.0 / 4.0) {
      EXPECT_EQ(scaled[k], base[k]) << i;
      ++kept;
    } else if (wavelen > 64.0 / 1.0) {
      EXPECT_EQ(scaled[k], base[k] / 8.0f) << i;
      ++divided;
    } else {
      const double s = (64.0 / wavelen - 1.0) / (4.0 - 1.0);
      const double want = (1 - s) * base[k] / 8.0 + s * base[k];
      EXPECT_GT(scaled[k], base[k] / 8.0f) << i;
      EXPECT_LT(scaled[k], base[k]) << i;
      EXPECT_NEAR(scaled[k], want, 4e-7 * want) << i;
      ++blended;
    }
    EXPECT_NEAR(scaled64[k], scaled[k], 1e-6 * scaled[k]) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(parse_rope_scaling("llama3"), RopeScaling::Llama3);
  EXPECT_THROW(parse_rope_scaling("yarn"), ConfigError);
}

// Both layouts of gate and up: (N, 2F) rows of [gate | up] and (2, N, F) halves; the gradient lands in the same layout.
TEST(OpGradients, Swiglu) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(7);
  const int64_t n = 3, f = 33;
  for (GateUpLayout layout : {GateUpLayout::Rows, GateUpLayout::Halves}) {
    const bool rows = layout == GateUpLayout::Rows;
    SCOPED_TRACE(rows ? "rows" : "halves");
    HostTensor gu = random_tensor(rows ? Shape{n, 2 * f} : Shape{2, n, f}, rng, 2.0), r = random_tensor({n, f}, rng);
    HostTensor out({n, f});
    auto loss = [&] {
      ops->swiglu_forward(gu.view(), layout, out.view());
      return dot(out, r);
    };
    loss();
    // element (1, 4): gate at row 1 column 4, up F (rows) or N F (halves) further
    const int64_t gate_at = rows ? 2 * f + 4 : f + 4, up_at = gate_at + (rows ? f : n * f);
    EXPECT_NEAR(out[f + 4], gu[gate_at] / (1 + std::exp(-gu[gate_at])) * gu[up_at], 1e-12);
    HostTensor dgu(gu.shape);
    ops->swiglu_backward(r.view(), gu.view(), layout, dgu.view());
    expect_gradient("dgate_up", gu, dgu, loss, 200);
    HostTensor in_place = gu;  // the model writes the gradients over gate_up
    ops->swiglu_backward(r.view(), in_place.view(), layout, in_place.view());
    EXPECT_EQ(in_place.data, dgu.data);
  }
}

TEST(OpGradients, CrossEntropyWithIgnoreIndex) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(8);
  const int64_t n = 7, vocab = 13;
  HostTensor z = random_tensor({n, vocab}, rng, 3.0);
  IntTensor t({n});
  const int32_t pick[] = {0, 12, -100, 5, 5, -100, 7};
  for (int64_t i = 0; i < n; ++i) t[i] = pick[i];
  const double scale = 0.37;
  auto loss = [&] { return scale * ops->cross_entropy(z.view(), t.view(), -100, 0.0, Tensor{}).loss_sum; };
  HostTensor dz({n, vocab});
  const LossSums sums = ops->cross_entropy(z.view(), t.view(), -100, scale, dz.view());
  EXPECT_EQ(sums.tokens, 5);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0) continue;
    double l = 0;
    for (int64_t j = 0; j < vocab; ++j) l += std::exp(z[i * vocab + j]);
    ref += std::log(l) - z[i * vocab + t[i]];
  }
  EXPECT_NEAR(sums.loss_sum, ref, 1e-11);
  for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(dz[2 * vocab + j], 0.0);
  expect_gradient("dlogits", z, dz, loss, 200);
  t[1] = 13;
  EXPECT_THROW(ops->cross_entropy(z.view(), t.view(), -100, 1.0, Tensor{}), DataError);
}

TEST(OpGradients, LinearCrossEntropyMatchesUnfusedAndFiniteDifferences) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(9);
  const int64_t n = 11, d = 6, vocab = 17;
  HostTensor h = random_tensor({n, d}, rng), w = random_tensor({vocab, d}, rng);
  IntTensor t({n});
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -1 : static_cast<int32_t>((i * 7) % vocab);
  const double scale = 1.0 / 10;
  // Unfused reference: logits, cross_entropy, then the two GEMMs.
  HostTensor logits({n, vocab}), dlogits({n, vocab}), dh_ref({n, d}), dw_ref({vocab, d});
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, h.view(), w.view(), 0.0, logits.view());
  const LossSums ref = ops->cross_entropy(logits.view(), t.view(), -1, scale, dlogits.view());
  ops->matmul(Transpose::No, Transpose::No, 1.0, dlogits.view(), w.view(), 0.0, dh_ref.view());
  ops->matmul(Transpose::Yes, Transpose::No, 1.0, dlogits.view(), h.view(), 0.0, dw_ref.view());
  for (int64_t chunk : {1, 3, 11, 64}) {
    HostTensor dh({n, d}), dw({vocab, d});
    const LossSums s = ops->linear_cross_entropy(h.view(), w.view(), t.view(), -1, scale, chunk, dh.view(), dw.view(), 1.0);
    EXPECT_EQ(s.tokens, 10);
    EXPECT_NEAR(s.loss_sum, ref.loss_sum, 1e-11) << "chunk " << chunk;
    for (int64_t i = 0; i < n * d; ++i) EXPECT_NEAR(dh[i], dh_ref[i], 1e-12) << "chunk " << chunk;
    for (int64_t i = 0; i < vocab * d; ++i) EXPECT_NEAR(dw[i], dw_ref[i], 1e-12) << "chunk " << chunk;
    // dweight_beta 0: dW overwritten whatever it held (NaN here), the same bits as added onto zeros
    HostTensor dh0({n, d}), dw0({vocab, d});
    for (int64_t i = 0; i < vocab * d; ++i) dw0[i] = std::nan("");
    ops->linear_cross_entropy(h.view(), w.view(), t.view(), -1, scale, chunk, dh0.view(), dw0.view(), 0.0);
    for (int64_t i = 0; i < vocab * d; ++i) ASSERT_EQ(dw0[i], dw[i]) << "chunk " << chunk << ", element " << i;
  }
  HostTensor dh1({n, d}), dw1({vocab, d});
  EXPECT_THROW(ops->linear_cross_entropy(h.view(), w.view(), t.view(), -1, scale, 4, dh1.view(), dw1.view(), 0.5),
               InternalError);
  auto loss = [&] {
    return scale * ops->linear_cross_entropy(h.view(), w.view(), t.view(), -1, 0, 4, Tensor{}, Tensor{}, 1.0).loss_sum;
  };
  HostTensor dh({n, d}), dw({vocab, d});
  ops->linear_cross_entropy(h.view(), w.view(), t.view(), -1, scale, 4, dh.view(), dw.view(), 1.0);
  expect_gradient("dh", h, dh, loss, 100);
  expect_gradient("dweight", w, dw, loss, 200);
}

}  // namespace
}  // namespace shardtrain::ops::test
