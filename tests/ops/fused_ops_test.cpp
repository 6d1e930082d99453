// The CPU backend's fused ops against the composition of the ops they replace, bit for bit: rope_qkv_forward
// against splitting the packed q/k/v projection and rope on q and k, rope_qkv_backward against rope backward on
// dq and dk and packing, SwiGLU on (N, 2F) rows against the (2, N, F) halves it read before; the backward as
// the forward's transpose in f64; and the argument checks.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "op_test_util.hpp"
#include "typed_tensor.hpp"

namespace shardtrain::ops::test {
namespace {

struct QkvCase {
  int64_t heads, kv_heads, dh;
};
constexpr QkvCase kQkvCases[] = {{6, 2, 24}, {6, 2, 64}, {8, 8, 24}, {8, 8, 64}};

HostT positions(int64_t n) {
  HostT pos({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) pos.set(i, i < 20 ? i : (i - 20) * 3);  // a restart, then wider steps
  return pos;
}

std::string describe(const QkvCase& c, const std::string& freq, DType d) {
  return "H " + std::to_string(c.heads) + " Hkv " + std::to_string(c.kv_heads) + " Dh " + std::to_string(c.dh) + " " + freq +
         " " + dtype_name(d);
}

TEST(FusedOps, RopeQkvIsRopeOfEachPartBitForBit) {
  auto ops = cpu_ops(2);
  std::mt19937_64 rng(35);
  const int64_t n = 37;
  HostT pos = positions(n);
  for (const QkvCase& c : kQkvCases) {
    for (const auto& [freq_name, freq] : rope_cases()) {
      for (DType d : {DType::F32, DType::BF16, DType::F64}) {
        const std::string what = describe(c, freq_name, d);
        const int64_t width = (c.heads + 2 * c.kv_heads) * c.dh;
        // forward: the packed projection -> q, k rotated and v
        HostT packed = random_normal(rng, {n, width}, d);
        QkvParts want = split_qkv(packed, c.heads, c.kv_heads, c.dh);
        ops->rope(want.q.view(), pos.view(), freq, RopeDirection::Forward);
        ops->rope(want.k.view(), pos.view(), freq, RopeDirection::Forward);
        QkvParts got{HostT(want.q.shape, d), HostT(want.k.shape, d), HostT(want.v.shape, d)};
        ops->rope_qkv_forward(packed.view(), pos.view(), freq, got.q.view(), got.k.view(), got.v.view());
        EXPECT_TRUE(got.q.bytes == want.q.bytes) << what << ": q";
        EXPECT_TRUE(got.k.bytes == want.k.bytes) << what << ": k";
        EXPECT_TRUE(got.v.bytes == want.v.bytes) << what << ": v";
        // backward: dq, dk rotated back and dv -> the packed gradient
        QkvParts grads{random_normal(rng, want.q.shape, d), random_normal(rng, want.k.shape, d),
                       random_normal(rng, want.v.shape, d)};
        HostT dpacked({n, width}, d);
        ops->rope_qkv_backward(grads.q.view(), grads.k.view(), grads.v.view(), pos.view(), freq, dpacked.view());
        ops->rope(grads.q.view(), pos.view(), freq, RopeDirection::Backward);
        ops->rope(grads.k.view(), pos.view(), freq, RopeDirection::Backward);
        EXPECT_TRUE(dpacked.bytes == pack_qkv(grads).bytes) << what << ": dqkv";
      }
    }
  }
}

// <forward(x), y> = <x, backward(y)>: the backward is the forward's transpose (f64, a rotation and a copy).
TEST(FusedOps, RopeQkvBackwardIsTheTranspose) {
  auto ops = cpu_ops();
  std::mt19937_64 rng(36);
  const int64_t n = 11, heads = 6, kv = 2, dh = 24, width = (heads + 2 * kv) * dh;
  HostT pos = positions(n);
  const RopeFrequencies freq = rope_cases().back().second;
  HostT x = random_normal(rng, {n, width}, DType::F64);
  QkvParts y{random_normal(rng, {n, heads, dh}, DType::F64), random_normal(rng, {n, kv, dh}, DType::F64),
             random_normal(rng, {n, kv, dh}, DType::F64)};
  QkvParts fx{HostT(y.q.shape, DType::F64), HostT(y.k.shape, DType::F64), HostT(y.v.shape, DType::F64)};
  ops->rope_qkv_forward(x.view(), pos.view(), freq, fx.q.view(), fx.k.view(), fx.v.view());
  HostT by({n, width}, DType::F64);
  ops->rope_qkv_backward(y.q.view(), y.k.view(), y.v.view(), pos.view(), freq, by.view());
  const HostT fx_packed = pack_qkv(fx), y_packed = pack_qkv(y);
  double lhs = 0, rhs = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lhs += fx_packed.get(i) * y_packed.get(i);
    rhs += x.get(i) * by.get(i);
  }
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs));
  EXPECT_GT(std::abs(lhs), 1.0);
}

// The same gate and up values in rows (N, 2F) and in halves (2, N, F): the same output and gradients, to the bit,
// out of place and in place.
TEST(FusedOps, SwigluRowsAndHalvesAgreeBitForBit) {
  auto ops = cpu_ops(2);
  std::mt19937_64 rng(37);
  for (int64_t f : {33, 4100}) {  // 4100: more than one of the backend's 4096-element blocks per row
    const int64_t n = 5;
    for (DType d : {DType::F32, DType::BF16, DType::F64}) {
      const std::string what = std::string(dtype_name(d)) + " F " + std::to_string(f);
      HostT gate = random_normal(rng, {n, f}, d, 2.0), up = random_normal(rng, {n, f}, d),
            dout = random_normal(rng, {n, f}, d);
      HostT rows = gate_up_tensor(gate, up, true), halves = gate_up_tensor(gate, up, false);
      HostT out_rows({n, f}, d), out_halves({n, f}, d);
      ops->swiglu_forward(rows.view(), GateUpLayout::Rows, out_rows.view());
      ops->swiglu_forward(halves.view(), GateUpLayout::Halves, out_halves.view());
      EXPECT_TRUE(out_rows.bytes == out_halves.bytes) << what;
      EXPECT_NE(out_rows.get(f + 1), 0.0) << what;
      HostT d_rows(rows.shape, d), d_halves(halves.shape, d);
      ops->swiglu_backward(dout.view(), rows.view(), GateUpLayout::Rows, d_rows.view());
      ops->swiglu_backward(dout.view(), halves.view(), GateUpLayout::Halves, d_halves.view());
      HostT dgate({n, f}, d), dup({n, f}, d);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < f; ++c) {
          EXPECT_EQ(d_rows.get(r * 2 * f + c), d_halves.get(r * f + c)) << what << " dgate " << r << "," << c;
          EXPECT_EQ(d_rows.get(r * 2 * f + f + c), d_halves.get(n * f + r * f + c)) << what << " dup " << r << "," << c;
        }
      }
      ops->swiglu_backward(dout.view(), rows.view(), GateUpLayout::Rows, rows.view());
      EXPECT_TRUE(rows.bytes == d_rows.bytes) << what << " in place";
    }
  }
}

template <typename F>
void expect_internal_error(const std::string& needle, F&& f) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(FusedOps, ArgumentChecks) {
  auto ops = cpu_ops();
  const RopeFrequencies freq{};
  HostT pos = positions(4);
  HostT packed({4, 5 * 8}, DType::F32), q({4, 3, 8}, DType::F32), k({4, 1, 8}, DType::F32), v({4, 1, 8}, DType::F32);
  ops->rope_qkv_forward(packed.view(), pos.view(), freq, q.view(), k.view(), v.view());  // fine
  HostT wide({4, 6 * 8}, DType::F32);
  expect_internal_error("rope_qkv_forward: qkv is (4, 48), expected (4, 40)",
                        [&] { ops->rope_qkv_forward(wide.view(), pos.view(), freq, q.view(), k.view(), v.view()); });
  const Tensor q_inside = make_tensor(packed.ptr(), DType::F32, {4, 3, 8});
  expect_internal_error("rope_qkv_forward: q overlaps qkv",
                        [&] { ops->rope_qkv_forward(packed.view(), pos.view(), freq, q_inside, k.view(), v.view()); });
  HostT kv_buf({4, 2, 8}, DType::F32);
  const Tensor k_in = make_tensor(kv_buf.ptr(), DType::F32, {4, 1, 8});
  const Tensor v_over_k = make_tensor(kv_buf.as_ptr<float>() + 8, DType::F32, {4, 1, 8});
  expect_internal_error("rope_qkv_forward: q, k and v overlap",
                        [&] { ops->rope_qkv_forward(packed.view(), pos.view(), freq, q.view(), k_in, v_over_k); });
  HostT v_bf16({4, 1, 8}, DType::BF16);
  expect_internal_error("rope_qkv_backward: dv is bf16, expected dqkv's dtype f32",
                        [&] { ops->rope_qkv_backward(q.view(), k.view(), v_bf16.view(), pos.view(), freq, packed.view()); });
  HostT k_odd({4, 1, 6}, DType::F32);
  expect_internal_error("rope_qkv_forward: k is (4, 1, 6), expected (4, kv_heads, 8)",
                        [&] { ops->rope_qkv_forward(packed.view(), pos.view(), freq, q.view(), k_odd.view(), v.view()); });

  HostT gu({3, 10}, DType::F32), out({3, 5}, DType::F32), gu_flat({30}, DType::F32), out_wrong({3, 4}, DType::F32);
  ops->swiglu_forward(gu_flat.view(), GateUpLayout::Halves, out.view());  // halves: any shape of 2 N F elements
  expect_internal_error("swiglu_forward: gate_up (30) in rows of gate and up: expected (3, 10)",
                        [&] { ops->swiglu_forward(gu_flat.view(), GateUpLayout::Rows, out.view()); });
  expect_internal_error("swiglu_forward: gate_up (3, 10) has 30 elements, expected 24",
                        [&] { ops->swiglu_forward(gu.view(), GateUpLayout::Rows, out_wrong.view()); });
  HostT gu_big({31}, DType::F32);
  const Tensor inner = make_tensor(gu_big.ptr(), DType::F32, {3, 10});
  const Tensor inner_shifted = make_tensor(gu_big.as_ptr<float>() + 1, DType::F32, {3, 10});
  expect_internal_error("swiglu_backward: dgate_up overlaps gate_up without being it",
                        [&] { ops->swiglu_backward(out.view(), inner, GateUpLayout::Rows, inner_shifted); });
}

}  // namespace
}  // namespace shardtrain::ops::test
