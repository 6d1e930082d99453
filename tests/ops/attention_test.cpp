// Grouped-query attention: forward against a naive reference (K/V repeated per head, explicit mask matrix,
// full softmax), backward against finite differences, at odd shapes and with padding/document masks.
#include <limits>

#include "op_test_util.hpp"

namespace shardtrain::ops::test {
namespace {

struct Case {
  int64_t b, s, h, hkv, dh;
};

// out (B, S, H, Dh) from the definition; segment < 0 = padding.
HostTensor naive_attention(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                           const IntTensor* seg) {
  HostTensor out({c.b, c.s, c.h, c.dh});
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dh));
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.h; ++h) {
      const int64_t g = h / (c.h / c.hkv);
      for (int64_t i = 0; i < c.s; ++i) {
        std::vector<double> w(static_cast<size_t>(c.s), 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.s; ++j) {
          const bool allowed =
              j <= i &&
              (!seg || (seg->data[static_cast<size_t>(b * c.s + i)] >= 0 &&
                        seg->data[static_cast<size_t>(b * c.s + i)] == seg->data[static_cast<size_t>(b * c.s + j)]));
          if (!allowed) {
            w[static_cast<size_t>(j)] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double sc = 0;
          for (int64_t d = 0; d < c.dh; ++d)
            sc += q.data[static_cast<size_t>(((b * c.s + i) * c.h + h) * c.dh + d)] *
                  k.data[static_cast<size_t>(((b * c.s + j) * c.hkv + g) * c.dh + d)];
          w[static_cast<size_t>(j)] = sc * scale;
          m = std::max(m, sc * scale);
        }
        if (m == -std::numeric_limits<double>::infinity()) continue;  // fully masked: zeros
        double l = 0;
        for (double& x : w) {
          x = std::exp(x - m);
          l += x;
        }
        for (int64_t j = 0; j < c.s; ++j)
          for (int64_t d = 0; d < c.dh; ++d)
            out[((b * c.s + i) * c.h + h) * c.dh + d] +=
                w[static_cast<size_t>(j)] / l * v.data[static_cast<size_t>(((b * c.s + j) * c.hkv + g) * c.dh + d)];
      }
    }
  }
  return out;
}

void check_case(const Case& c, IntTensor* seg, int threads = 1) {
  SCOPED_TRACE(testing::Message() << "B=" << c.b << " S=" << c.s << " H=" << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh
                                  << (seg ? " masked" : "") << " threads=" << threads);
  auto ops = cpu_ops(threads);
  std::mt19937_64 rng(static_cast<uint64_t>(c.s * 1000 + c.h * 10 + c.hkv));
  HostTensor q = random_tensor({c.b, c.s, c.h, c.dh}, rng), k = random_tensor({c.b, c.s, c.hkv, c.dh}, rng);
  HostTensor v = random_tensor({c.b, c.s, c.hkv, c.dh}, rng), r = random_tensor({c.b, c.s, c.h, c.dh}, rng);
  HostTensor out({c.b, c.s, c.h, c.dh}), lse({c.b, c.h, c.s});
  const AttentionShape shape{c.b, c.s, c.h, c.hkv, c.dh};
  const AttentionMask mask{seg ? seg->view() : Tensor{}};
  auto loss = [&] {
    ops->attention_forward(shape, q.view(), k.view(), v.view(), mask, out.view(), lse.view());
    return dot(out, r);
  };
  loss();
  const HostTensor ref = naive_attention(c, q, k, v, seg);
  for (int64_t i = 0; i < out.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << i;
    ASSERT_NEAR(out[i], ref.data[static_cast<size_t>(i)], 1e-12) << i;
  }
  HostTensor dq(q.shape), dk(k.shape), dv(v.shape);
  ops->attention_backward(shape, q.view(), k.view(), v.view(), out.view(), lse.view(), r.view(), mask, dq.view(), dk.view(),
                          dv.view());
  expect_gradient("dq", q, dq, loss);
  expect_gradient("dk", k, dk, loss);
  expect_gradient("dv", v, dv, loss);
}

TEST(Attention, OddShapesMatchReferenceAndFiniteDifferences) {
  const Case cases[] = {
      {1, 1, 2, 1, 8},   // seq 1
      {2, 7, 3, 1, 8},   // one KV head (multi-query)
      {1, 7, 6, 3, 8},   // 3 KV heads for 6 query heads
      {1, 33, 3, 3, 8},  // KV heads == heads
      {1, 7, 2, 2, 64},  // head_dim 64
      {2, 33, 4, 1, 64},
  };
  for (const Case& c : cases) check_case(c, nullptr);
}

TEST(Attention, PaddingAndDocumentMasks) {
  const Case c{2, 7, 4, 2, 8};
  IntTensor seg({2, 7});
  const int32_t rows[2][7] = {{0, 0, 0, 1, 1, 2, 2}, {4, 4, 4, 4, 4, -1, -1}};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 7; ++s) seg[b * 7 + s] = rows[b][s];
  check_case(c, &seg);
}

// The CPU backend works in blocks of 64 query rows against the keys from the block's earliest document start:
// sequences of several blocks, documents that cross block boundaries, a segment id that comes back later in
// the row (still one "document" to the mask), padding in the middle and at the end, and a block of padding only.
TEST(Attention, SeveralQueryBlocksWithDocumentsAcrossThem) {
  const Case c{2, 150, 4, 2, 8};
  IntTensor seg({2, 150});
  for (int64_t s = 0; s < 150; ++s) {
    seg[s] = s < 60 ? 0 : (s < 100 ? 1 : (s < 110 ? -1 : (s < 130 ? 0 : 2)));  // id 0 returns at 110
    seg[150 + s] = s < 3 ? 5 : (s < 64 ? 6 : -1);                              // rows 64..149: padding only
  }
  check_case(c, &seg);
  check_case(Case{1, 129, 3, 1, 16}, nullptr);  // one row past two full blocks
  check_case(Case{1, 64, 2, 2, 8}, nullptr);    // exactly one block
}

// What padding positions hold is never read: NaN there changes no bit of any output or gradient (the
// blocks' GEMMs multiply masked entries by zero, and 0 * NaN would be NaN).
TEST(Attention, PaddingContentIsNeverRead) {
  const AttentionShape shape{2, 90, 4, 2, 8};
  IntTensor seg({2, 90});
  for (int64_t s = 0; s < 90; ++s) {
    seg[s] = s < 40 ? 0 : (s < 50 ? -1 : 1);  // padding inside the row
    seg[90 + s] = s < 70 ? 3 : -1;            // and at its end
  }
  std::mt19937_64 rng(9);
  HostTensor q = random_tensor({2, 90, 4, 8}, rng), k = random_tensor({2, 90, 2, 8}, rng);
  HostTensor v = random_tensor({2, 90, 2, 8}, rng), dout = random_tensor({2, 90, 4, 8}, rng);
  auto run = [&](bool poison) {
    HostTensor pq = q, pk = k, pv = v, pd = dout;
    if (poison) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      for (int64_t t = 0; t < 180; ++t) {
        if (seg[t] >= 0) continue;
        for (int64_t e = 0; e < 4 * 8; ++e) pq[t * 32 + e] = pd[t * 32 + e] = nan;
        for (int64_t e = 0; e < 2 * 8; ++e) pk[t * 16 + e] = pv[t * 16 + e] = nan;
      }
    }
    auto ops = cpu_ops(2);
    const AttentionMask mask{seg.view()};
    HostTensor out(q.shape), lse({2, 4, 90}), dq(q.shape), dk(k.shape), dv(v.shape);
    ops->attention_forward(shape, pq.view(), pk.view(), pv.view(), mask, out.view(), lse.view());
    ops->attention_backward(shape, pq.view(), pk.view(), pv.view(), out.view(), lse.view(), pd.view(), mask, dq.view(),
                            dk.view(), dv.view());
    return std::vector<std::vector<double>>{out.data, lse.data, dq.data, dk.data, dv.data};
  };
  const auto clean = run(false), poisoned = run(true);
  for (size_t t = 0; t < clean.size(); ++t) EXPECT_EQ(clean[t], poisoned[t]) << "tensor " << t;
}

// Blocks and tasks are split over threads, never a sum: the same bits at any thread count.
TEST(Attention, SameBitsAtAnyThreadCount) {
  const AttentionShape shape{3, 100, 4, 2, 16};
  std::mt19937_64 rng(5);
  HostTensor q = random_tensor({3, 100, 4, 16}, rng), k = random_tensor({3, 100, 2, 16}, rng);
  HostTensor v = random_tensor({3, 100, 2, 16}, rng), dout = random_tensor({3, 100, 4, 16}, rng);
  std::vector<std::vector<double>> results[2];
  for (int threads : {1, 2}) {
    auto ops = cpu_ops(threads);
    HostTensor out(q.shape), lse({3, 4, 100}), dq(q.shape), dk(k.shape), dv(v.shape);
    ops->attention_forward(shape, q.view(), k.view(), v.view(), AttentionMask{}, out.view(), lse.view());
    ops->attention_backward(shape, q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), AttentionMask{},
                            dq.view(), dk.view(), dv.view());
    results[threads - 1] = {out.data, lse.data, dq.data, dk.data, dv.data};
  }
  for (size_t t = 0; t < results[0].size(); ++t) EXPECT_EQ(results[0][t], results[1][t]) << "tensor " << t;
}

TEST(Attention, FullyMaskedRowsAreZeroNotNan) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(11);
  const AttentionShape shape{1, 5, 2, 1, 8};
  HostTensor q = random_tensor({1, 5, 2, 8}, rng), k = random_tensor({1, 5, 1, 8}, rng),
             v = random_tensor({1, 5, 1, 8}, rng);
  HostTensor out({1, 5, 2, 8}), lse({1, 2, 5});
  IntTensor seg({1, 5}, -1);  // every position is padding
  ops->attention_forward(shape, q.view(), k.view(), v.view(), AttentionMask{seg.view()}, out.view(), lse.view());
  for (double x : out.data) EXPECT_EQ(x, 0.0);
  HostTensor dq(q.shape), dk(k.shape), dv(v.shape);
  ops->attention_backward(shape, q.view(), k.view(), v.view(), out.view(), lse.view(), q.view(), AttentionMask{seg.view()},
                          dq.view(), dk.view(), dv.view());
  for (const HostTensor* t : {&dq, &dk, &dv})
    for (double x : t->data) EXPECT_EQ(x, 0.0);
}

TEST(Attention, SegmentsAndPositionsFromBatch) {
  auto ops = cpu_ops();
  IntTensor ids({2, 5}), docs({2, 5}), seg({2, 5}), pos({2, 5});
  const int32_t id_rows[10] = {5, 6, 7, 8, 9, 5, 6, 0, 0, 0};
  const int32_t doc_rows[10] = {0, 0, 1, 1, 1, 3, 3, 3, 3, 3};
  for (int i = 0; i < 10; ++i) {
    ids[i] = id_rows[i];
    docs[i] = doc_rows[i];
  }
  ops->attention_segments(ids.view(), 0, docs.view(), seg.view(), pos.view());
  EXPECT_EQ(pos.data, (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 2, 3, 4}));
  EXPECT_EQ(seg.data, (std::vector<int32_t>{0, 0, 1, 1, 1, 3, 3, -1, -1, -1}));
  ops->attention_segments(ids.view(), -1, Tensor{}, seg.view(), pos.view());
  EXPECT_EQ(pos.data, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(seg.data, std::vector<int32_t>(10, 0));
}

}  // namespace
}  // namespace shardtrain::ops::test
