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
          const bool allowed = j <= i && (!seg || (seg->data[static_cast<size_t>(b * c.s + i)] >= 0 &&
                                                   seg->data[static_cast<size_t>(b * c.s + i)] ==
                                                       seg->data[static_cast<size_t>(b * c.s + j)]));
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

void check_case(const Case& c, IntTensor* seg) {
  SCOPED_TRACE(testing::Message() << "B=" << c.b << " S=" << c.s << " H=" << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh
                                  << (seg ? " masked" : ""));
  auto ops = cpu_ops();
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
  ops->attention_backward(shape, q.view(), k.view(), v.view(), out.view(), lse.view(), r.view(), mask, dq.view(),
                          dk.view(), dv.view());
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

TEST(Attention, FullyMaskedRowsAreZeroNotNan) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(11);
  const AttentionShape shape{1, 5, 2, 1, 8};
  HostTensor q = random_tensor({1, 5, 2, 8}, rng), k = random_tensor({1, 5, 1, 8}, rng), v = random_tensor({1, 5, 1, 8}, rng);
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
