// The fp32 family: f32 and bf16 storage (fp32 arithmetic) against the f64 results of the same ops.
#include <algorithm>

#include "op_test_util.hpp"

namespace shardtrain::ops::test {
namespace {

// A copy of an f64 tensor in another storage dtype (bf16 rounds to nearest even).
struct Typed {
  std::vector<char> bytes;
  DType dtype;
  Shape shape;
  Typed(const HostTensor& t, DType d) : bytes(static_cast<size_t>(t.numel()) * dtype_size(d)), dtype(d), shape(t.shape) {
    for (int64_t i = 0; i < t.numel(); ++i) set(i, t.data[static_cast<size_t>(i)]);
  }
  Typed(Shape s, DType d) : bytes(static_cast<size_t>(s.numel()) * dtype_size(d)), dtype(d), shape(s) {}
  Tensor view() { return make_tensor(bytes.data(), dtype, shape); }
  void set(int64_t i, double v) {
    if (dtype == DType::F32) reinterpret_cast<float*>(bytes.data())[i] = static_cast<float>(v);
    else reinterpret_cast<bf16*>(bytes.data())[i] = bf16(static_cast<float>(v));
  }
  double get(int64_t i) const {
    if (dtype == DType::F32) return reinterpret_cast<const float*>(bytes.data())[i];
    return static_cast<float>(reinterpret_cast<const bf16*>(bytes.data())[i]);
  }
};

// Worst |a - b| / (|b| + floor) over all elements.
double worst_error(const Typed& a, const HostTensor& b, double floor = 1.0) {
  double worst = 0;
  for (int64_t i = 0; i < b.numel(); ++i)
    worst = std::max(
        worst, std::abs(a.get(i) - b.data[static_cast<size_t>(i)]) / (std::abs(b.data[static_cast<size_t>(i)]) + floor));
  return worst;
}

double tolerance(DType d) { return d == DType::F32 ? 1e-5 : 2e-2; }

TEST(Dtypes, MatmulF32AndBf16) {
  auto ops = cpu_ops(2);  // the parallel paths
  std::mt19937_64 rng(21);
  HostTensor a = random_tensor({9, 31}, rng), b = random_tensor({13, 31}, rng), c({9, 13});
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, a.view(), b.view(), 0.0, c.view());
  for (DType d : {DType::F32, DType::BF16}) {
    Typed ta(a, d), tb(b, d), tc(c.shape, d);
    ops->matmul(Transpose::No, Transpose::Yes, 1.0, ta.view(), tb.view(), 0.0, tc.view());
    EXPECT_LT(worst_error(tc, c), tolerance(d) * 4) << dtype_name(d);
  }
  // bf16 output is the round-to-nearest-even of the fp32 result on the same (bf16) inputs.
  Typed ta(a, DType::BF16), tb(b, DType::BF16), c32({9, 13}, DType::F32), c16({9, 13}, DType::BF16);
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, ta.view(), tb.view(), 0.0, c32.view());
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, ta.view(), tb.view(), 0.0, c16.view());
  for (int64_t i = 0; i < 9 * 13; ++i) EXPECT_EQ(c16.get(i), static_cast<float>(bf16(static_cast<float>(c32.get(i)))));
}

// The sum of squares (fp32 squares added in double) over f32 and bf16 storage: exact enough, the same bits at 1 and 3
// threads, Overwrite and Accumulate, and an empty input (zero).
TEST(Dtypes, SumSquaresSameBitsAtAnyThreadCount) {
  std::mt19937_64 rng(5);
  const HostTensor x = random_tensor({100003}, rng);
  for (DType d : {DType::F32, DType::BF16}) {
    Typed t(x, d);
    double want = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const auto v = static_cast<float>(t.get(i));
      want += static_cast<double>(v * v);  // squared in fp32, as the CUDA kernel does
    }
    double one = -1, three = -1, twice = 0;
    cpu_ops(1)->sum_squares(t.view(), make_tensor(&one, DType::F64, {1}), SumInto::Overwrite);
    auto ops = cpu_ops(3);
    ops->sum_squares(t.view(), make_tensor(&three, DType::F64, {1}), SumInto::Overwrite);
    EXPECT_NEAR(one, want, 1e-12 * want) << dtype_name(d);
    EXPECT_EQ(one, three) << dtype_name(d);
    ops->sum_squares(t.view(), make_tensor(&twice, DType::F64, {1}), SumInto::Accumulate);
    ops->sum_squares(t.view(), make_tensor(&twice, DType::F64, {1}), SumInto::Accumulate);
    EXPECT_EQ(twice, one + one) << dtype_name(d);
  }
  double empty = 7;
  cpu_ops(2)->sum_squares(make_tensor(&empty, DType::F32, {0}), make_tensor(&empty, DType::F64, {1}), SumInto::Overwrite);
  EXPECT_EQ(empty, 0.0);
  float f = 1;
  EXPECT_ANY_THROW(
      cpu_ops(1)->sum_squares(make_tensor(&f, DType::F32, {1}), make_tensor(&f, DType::F32, {1}), SumInto::Overwrite));
}

// Deferred losses on the CPU backend: the calls return zero sums, take_loss() the total in call order (the
// same doubles the separate calls return, added alike), then starts over.
TEST(Dtypes, DeferredLossTotalsInCallOrder) {
  auto ops = cpu_ops(2);
  std::mt19937_64 rng(5);
  const int64_t n = 11, d = 16, vocab = 37;
  HostTensor h = random_tensor({n, d}, rng), h2 = random_tensor({n, d}, rng), w = random_tensor({vocab, d}, rng, 0.3);
  IntTensor t({n});
  for (int64_t i = 0; i < n; ++i) t[i] = i % 4 == 3 ? -100 : static_cast<int32_t>((i * 7) % vocab);
  const LossSums a = ops->linear_cross_entropy(h.view(), w.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);
  const LossSums b = ops->linear_cross_entropy(h2.view(), w.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);
  ASSERT_GT(a.tokens, 0);
  ops->defer_loss(true);
  const LossSums za = ops->linear_cross_entropy(h.view(), w.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);
  const LossSums zb = ops->linear_cross_entropy(h2.view(), w.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);
  EXPECT_EQ(za.tokens, 0);
  EXPECT_EQ(zb.loss_sum, 0.0);
  const LossSums total = ops->take_loss();
  EXPECT_EQ(total.tokens, a.tokens + b.tokens);
  EXPECT_EQ(total.loss_sum, a.loss_sum + b.loss_sum);
  EXPECT_EQ(ops->take_loss().tokens, 0);
  ops->defer_loss(false);
  EXPECT_EQ(ops->linear_cross_entropy(h.view(), w.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0).loss_sum,
            a.loss_sum);
}

// A bf16 lm_head (bf16 h and W) stores its logits in bf16 and its dlogits in bf16, as PyTorch's does under
// bf16 mixed precision and as the CUDA backend's chunk buffer holds them: the fused loss equals the unfused
// chain through bf16 tensors (matmul rounding to bf16, cross_entropy in fp32 on those, bf16 dlogits, GEMMs).
TEST(Dtypes, LinearCrossEntropyBf16RoundsLogitsAndDlogits) {
  auto ops = cpu_ops(2);
  std::mt19937_64 rng(31);
  const int64_t n = 13, d = 24, vocab = 41;
  const double scale = 0.25;
  HostTensor h = random_tensor({n, d}, rng, 2.0), w = random_tensor({vocab, d}, rng, 2.0);
  IntTensor t({n});
  for (int64_t i = 0; i < n; ++i) t[i] = i == 5 ? -100 : static_cast<int32_t>((i * 13) % vocab);
  Typed th(h, DType::BF16), tw(w, DType::BF16);
  Typed logits({n, vocab}, DType::BF16), dlogits({n, vocab}, DType::BF16), dh_ref({n, d}, DType::BF16),
      dw_ref({vocab, d}, DType::F32);
  ops->matmul(Transpose::No, Transpose::Yes, 1.0, th.view(), tw.view(), 0.0, logits.view());
  const LossSums ref = ops->cross_entropy(logits.view(), t.view(), -100, scale, dlogits.view());
  ops->matmul(Transpose::No, Transpose::No, 1.0, dlogits.view(), tw.view(), 0.0, dh_ref.view());
  ops->matmul(Transpose::Yes, Transpose::No, 1.0, dlogits.view(), th.view(), 0.0, dw_ref.view());
  // fp32 logits of the same (bf16-valued) inputs give another loss: the rounding is really there.
  Typed b32(th.view().shape, DType::F32), wb32(tw.view().shape, DType::F32);
  for (int64_t i = 0; i < n * d; ++i) b32.set(i, th.get(i));
  for (int64_t i = 0; i < vocab * d; ++i) wb32.set(i, tw.get(i));
  const LossSums f32 = ops->linear_cross_entropy(b32.view(), wb32.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);
  EXPECT_GT(std::abs(f32.loss_sum - ref.loss_sum), 1e-5 * std::abs(ref.loss_sum));
  for (int64_t chunk : {0, 4}) {
    SCOPED_TRACE(chunk);
    Typed dh({n, d}, DType::BF16), dw({vocab, d}, DType::F32);
    const LossSums s =
        ops->linear_cross_entropy(th.view(), tw.view(), t.view(), -100, scale, chunk, dh.view(), dw.view(), 1.0);
    EXPECT_EQ(s.tokens, ref.tokens);
    EXPECT_NEAR(s.loss_sum, ref.loss_sum, 1e-6 * std::abs(ref.loss_sum));
    // Both rounded once from fp32 sums of the same products: equal, or one bf16 step apart where a GEMM's
    // blocking summed them in another order.
    for (int64_t i = 0; i < n * d; ++i) EXPECT_NEAR(dh.get(i), dh_ref.get(i), std::abs(dh_ref.get(i)) * 0x1p-8) << i;
    for (int64_t i = 0; i < vocab * d; ++i) EXPECT_NEAR(dw.get(i), dw_ref.get(i), 1e-6 * (std::abs(dw_ref.get(i)) + 1e-3));
  }
}

TEST(Dtypes, RmsnormSwigluAttentionLoss) {
  auto ops = cpu_ops(2);  // the parallel paths
  std::mt19937_64 rng(22);
  const int64_t n = 14, d = 32, vocab = 50;
  HostTensor x = random_tensor({n, d}, rng), r = random_tensor({n, d}, rng), w = random_tensor({d}, rng);
  HostTensor h({n, d}), y({n, d}), rstd({n});
  ops->rmsnorm_forward(x.view(), r.view(), w.view(), 1e-5, h.view(), y.view(), rstd.view());
  HostTensor xr({2, n, d});  // gate x, up r: SwiGLU's halves layout
  std::copy(x.data.begin(), x.data.end(), xr.data.begin());
  std::copy(r.data.begin(), r.data.end(), xr.data.begin() + n * d);
  HostTensor sw({n, d});
  ops->swiglu_forward(xr.view(), GateUpLayout::Halves, sw.view());
  const AttentionShape shape{2, 7, 4, 2, 8};
  HostTensor q = random_tensor({2, 7, 4, 8}, rng), k = random_tensor({2, 7, 2, 8}, rng),
             v = random_tensor({2, 7, 2, 8}, rng);
  HostTensor ao({2, 7, 4, 8}), lse({2, 4, 7});
  ops->attention_forward(shape, q.view(), k.view(), v.view(), AttentionMask{}, ao.view(), lse.view());
  HostTensor emb = random_tensor({vocab, d}, rng, 0.2);
  IntTensor t({n});
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 11) % vocab);
  const LossSums ref = ops->linear_cross_entropy(x.view(), emb.view(), t.view(), -100, 0, 0, Tensor{}, Tensor{}, 1.0);

  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Typed tx(x, dt), tr(r, dt), th({n, d}, dt), ty({n, d}, dt);
    std::vector<float> trstd(static_cast<size_t>(n));
    Typed tw(w, dt);
    ops->rmsnorm_forward(tx.view(), tr.view(), tw.view(), 1e-5, th.view(), ty.view(),
                         make_tensor(trstd.data(), DType::F32, {n}));
    EXPECT_LT(worst_error(ty, y), tolerance(dt) * 3);
    Typed tsw({n, d}, dt);
    Typed txr(xr, dt);
    ops->swiglu_forward(txr.view(), GateUpLayout::Halves, tsw.view());
    EXPECT_LT(worst_error(tsw, sw), tolerance(dt));
    Typed tq(q, dt), tk(k, dt), tv(v, dt), tao(ao.shape, dt);
    std::vector<float> tlse(2 * 4 * 7);
    ops->attention_forward(shape, tq.view(), tk.view(), tv.view(), AttentionMask{}, tao.view(),
                           make_tensor(tlse.data(), DType::F32, {2, 4, 7}));
    EXPECT_LT(worst_error(tao, ao), tolerance(dt) * 3);
    Typed temb(emb, dt);
    const LossSums s = ops->linear_cross_entropy(tx.view(), temb.view(), t.view(), -100, 0, 5, Tensor{}, Tensor{}, 1.0);
    EXPECT_NEAR(s.loss_sum, ref.loss_sum, std::abs(ref.loss_sum) * tolerance(dt));
  }
}

}  // namespace
}  // namespace shardtrain::ops::test
