// The cases, inputs, CPU reference and checks shared by the attention kernel tests: the device kernels
// (attention_kernel_test, needs a GPU) and the tensor-core kernel bodies under the SIMT emulator
// (attention_mma_emulated_test, runs anywhere). Odd shapes, plain causal, packed documents and padding;
// padding tokens carry NaN in q, k, v and dout, so any leak of a padded row into the arithmetic shows up.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::attention_cases {

enum class MaskKind { Causal, Packed, Padded };

inline const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::Causal: return "causal";
    case MaskKind::Packed: return "packed";
    case MaskKind::Padded: return "padded";
  }
  return "?";
}

struct Case {
  int64_t b, s, h, hkv, dh;
};

// (B, S) segments. Packed: documents of varied lengths; in row 1 ids are not monotonic (a reused id joins two
// runs, as the op's definition says) and the first two documents fill 64-token tiles (tokens 0-63 and 64-127),
// so the tensor-core kernels meet key and query tiles all in one document, the rows of other documents
// beside them. Padded: row 0 ends in padding and has a padding token inside a document; row 1 starts with
// padding (all of it when S = 1).
inline std::vector<int32_t> make_segments(MaskKind kind, int64_t b, int64_t s) {
  std::vector<int32_t> seg(static_cast<size_t>(b * s), 0);
  const int64_t short_docs[] = {1, 7, 20, 3, 50, 2, 33};
  const int64_t tile_docs[] = {64, 64, 1, 7, 20, 3, 50, 2, 33};
  for (int64_t r = 0; r < b; ++r) {
    const bool tiles = r % 2 == 1;
    const auto length = [&](int64_t i) { return tiles ? tile_docs[i % 9] : short_docs[(r + i) % 7]; };
    int64_t doc = 0, left = length(0);
    for (int64_t t = 0; t < s; ++t) {
      if (left == 0) {
        ++doc;
        left = length(doc);
      }
      --left;
      int32_t v = 0;
      if (kind == MaskKind::Packed) v = static_cast<int32_t>(r == 0 ? doc : (doc * 5) % 3);
      if (kind == MaskKind::Padded) {
        v = static_cast<int32_t>(t / 20);
        if (r == 0 && (t >= s - s / 4 || (s > 2 && t == s / 2))) v = -1;
        if (r == 1 && t < 10) v = -1;
      }
      seg[static_cast<size_t>(r * s + t)] = v;
    }
  }
  return seg;
}

// Host storage of a float tensor in f32 or bf16.
inline std::vector<uint8_t> encode(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * dtype_size(t));
  if (t == DType::F32) {
    std::memcpy(out.data(), x.data(), out.size());
  } else {
    auto* p = reinterpret_cast<bf16*>(out.data());
    for (size_t i = 0; i < x.size(); ++i) p[i] = bf16(x[i]);
  }
  return out;
}

inline std::vector<float> decode(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> out(bytes.size() / dtype_size(t));
  if (t == DType::F32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    const auto* p = reinterpret_cast<const bf16*>(bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  }
  return out;
}

inline std::vector<float> random_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// NaN in every (B, S, heads, Dh) row of a padding token.
inline void poison_padding(std::vector<float>& x, const std::vector<int32_t>& seg, int64_t heads, int64_t dh) {
  for (size_t t = 0; t < seg.size(); ++t)
    if (seg[t] < 0)
      for (int64_t e = 0; e < heads * dh; ++e) x[t * static_cast<size_t>(heads * dh) + static_cast<size_t>(e)] = NAN;
}

// |got - cpu| <= tol * (1 + |cpu|) everywhere; -inf must match -inf; the worst element is printed.
inline void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& cpu, double tol) {
  ASSERT_EQ(got.size(), cpu.size()) << what;
  double worst = -1;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], c = cpu[i];
    double err;
    if (std::isinf(c) || std::isinf(g)) err = g == c ? 0 : std::numeric_limits<double>::infinity();
    else if (std::isnan(g) || std::isnan(c)) err = std::numeric_limits<double>::infinity();
    else err = std::abs(g - c) / (1 + std::abs(c));
    bad += err > tol;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; worst at " << worst_i << ": got "
                     << got[worst_i] << " cpu " << cpu[worst_i] << " (relative error " << worst << ", tolerance " << tol
                     << ")";
}

struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

inline ops::Shape dims4(int64_t a, int64_t b, int64_t c, int64_t d) { return ops::Shape{a, b, c, d}; }

// One case's inputs, in float and in the storage dtype.
struct Inputs {
  std::vector<int32_t> seg;
  bool masked = false;
  std::vector<uint8_t> q, k, v, dout;
  float scale = 1.f;
  size_t nq = 0, nkv = 0, nlse = 0;
};

inline Inputs make_inputs(const Case& c, MaskKind kind, DType dtype) {
  std::mt19937_64 rng(static_cast<uint64_t>(c.s * 7919 + c.h * 131 + c.hkv * 17 + c.dh));
  Inputs in;
  in.nq = static_cast<size_t>(c.b * c.s * c.h * c.dh);
  in.nkv = static_cast<size_t>(c.b * c.s * c.hkv * c.dh);
  in.nlse = static_cast<size_t>(c.b * c.h * c.s);
  std::vector<float> q = random_values(in.nq, rng), k = random_values(in.nkv, rng), v = random_values(in.nkv, rng);
  std::vector<float> dout = random_values(in.nq, rng);
  in.seg = make_segments(kind, c.b, c.s);
  in.masked = kind != MaskKind::Causal;
  if (kind == MaskKind::Padded) {
    poison_padding(q, in.seg, c.h, c.dh);
    poison_padding(k, in.seg, c.hkv, c.dh);
    poison_padding(v, in.seg, c.hkv, c.dh);
    poison_padding(dout, in.seg, c.h, c.dh);
  }
  in.q = encode(q, dtype);
  in.k = encode(k, dtype);
  in.v = encode(v, dtype);
  in.dout = encode(dout, dtype);
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
  return in;
}

// CpuOps::attention_forward / attention_backward in the same storage dtype.
inline Results cpu_reference(const Case& c, const Inputs& in, DType dtype) {
  auto cpu_ops = ops::make_cpu_ops(ops::CpuOpsOptions{2});
  const ops::AttentionShape shape{c.b, c.s, c.h, c.hkv, c.dh};
  std::vector<int32_t> seg_copy = in.seg;
  const ops::AttentionMask mask{in.masked ? ops::make_tensor(seg_copy.data(), DType::I32, ops::Shape{c.b, c.s})
                                          : ops::Tensor{}};
  std::vector<uint8_t> qc = in.q, kc = in.k, vc = in.v, dc = in.dout;
  std::vector<uint8_t> out_b(in.q.size()), dq_b(in.q.size()), dk_b(in.k.size()), dv_b(in.k.size());
  std::vector<float> lse(in.nlse);
  auto qt = ops::make_tensor(qc.data(), dtype, dims4(c.b, c.s, c.h, c.dh));
  auto kt = ops::make_tensor(kc.data(), dtype, dims4(c.b, c.s, c.hkv, c.dh));
  auto vt = ops::make_tensor(vc.data(), dtype, dims4(c.b, c.s, c.hkv, c.dh));
  auto dt = ops::make_tensor(dc.data(), dtype, dims4(c.b, c.s, c.h, c.dh));
  auto ot = ops::make_tensor(out_b.data(), dtype, dims4(c.b, c.s, c.h, c.dh));
  auto lt = ops::make_tensor(lse.data(), DType::F32, ops::Shape{c.b, c.h, c.s});
  auto dqt = ops::make_tensor(dq_b.data(), dtype, dims4(c.b, c.s, c.h, c.dh));
  auto dkt = ops::make_tensor(dk_b.data(), dtype, dims4(c.b, c.s, c.hkv, c.dh));
  auto dvt = ops::make_tensor(dv_b.data(), dtype, dims4(c.b, c.s, c.hkv, c.dh));
  cpu_ops->attention_forward(shape, qt, kt, vt, mask, ot, lt);
  cpu_ops->attention_backward(shape, qt, kt, vt, ot, lt, dt, mask, dqt, dkt, dvt);
  return Results{decode(out_b, dtype), lse, decode(dq_b, dtype), decode(dk_b, dtype), decode(dv_b, dtype)};
}

// No NaN anywhere; padding query rows exactly zero with lse = -inf; every result within the dtype's tolerance
// of the CPU's.
inline void check_results(const Case& c, const Inputs& in, DType dtype, const Results& got, const Results& cpu) {
  for (const auto* t : {&got.out, &got.dq, &got.dk, &got.dv}) {
    size_t nonfinite = 0;
    for (float x : *t) nonfinite += !std::isfinite(x);
    EXPECT_EQ(nonfinite, 0u) << "non-finite values in a result";
  }
  for (float x : got.lse) EXPECT_FALSE(std::isnan(x) || x == std::numeric_limits<float>::infinity()) << x;
  size_t padding_rows_nonzero = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = 0; i < c.s; ++i) {
      if (in.seg[static_cast<size_t>(b * c.s + i)] >= 0 || !in.masked) continue;
      for (int64_t h = 0; h < c.h; ++h) {
        padding_rows_nonzero += got.lse[static_cast<size_t>((b * c.h + h) * c.s + i)] != -INFINITY;
        for (int64_t e = 0; e < c.dh; ++e) {
          const size_t at = static_cast<size_t>(((b * c.s + i) * c.h + h) * c.dh + e);
          padding_rows_nonzero += got.out[at] != 0.f || got.dq[at] != 0.f;
        }
      }
    }
  EXPECT_EQ(padding_rows_nonzero, 0u) << "padding query rows must give out = 0, dq = 0, lse = -inf";

  const double tol = dtype == DType::F32 ? 2e-5 : 2e-2;
  expect_close("out", got.out, cpu.out, tol);
  expect_close("lse", got.lse, cpu.lse, dtype == DType::F32 ? 2e-5 : 1e-4);  // fp32 in both, from the same inputs
  expect_close("dq", got.dq, cpu.dq, tol);
  expect_close("dk", got.dk, cpu.dk, tol);
  expect_close("dv", got.dv, cpu.dv, tol);
}

// The operands of the fragment-layout probe (kernels/attention_mma_body.cuh, mma_probe_body): a, b and bt = b^T
// (16 x 16 each) as bf16 bits, small integers so the product d = a b (16 x 16, row-major) is exact in fp32 in
// any summation order; a wrong fragment or ldmatrix layout permutes or mixes its entries. The probe writes d
// three times (plain loads, ldmatrix, ldmatrix.trans): `want` is the product, `ways` its names.
struct MmaProbeCase {
  std::vector<uint16_t> a, b, bt;
  std::vector<float> want;  // (16, 16)
  static constexpr const char* ways[3] = {"documented mma layout", "ldmatrix", "ldmatrix.trans"};
};

inline MmaProbeCase make_mma_probe_case() {
  MmaProbeCase p{std::vector<uint16_t>(16 * 16), std::vector<uint16_t>(16 * 16), std::vector<uint16_t>(16 * 16),
                 std::vector<float>(16 * 16, 0.f)};
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) p.a[static_cast<size_t>(i * 16 + k)] = bf16(float((i * 3 + k * 5) % 11 - 5)).bits;
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) {
      const uint16_t v = bf16(float((n * 7 + k * 2) % 9 - 4 + n / 8)).bits;  // the two n-tiles differ
      p.b[static_cast<size_t>(k * 16 + n)] = v;
      p.bt[static_cast<size_t>(n * 16 + k)] = v;
    }
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 16; ++k)
        p.want[static_cast<size_t>(i * 16 + n)] += float_from_bf16_bits(p.a[static_cast<size_t>(i * 16 + k)]) *
                                                   float_from_bf16_bits(p.b[static_cast<size_t>(k * 16 + n)]);
  return p;
}

}  // namespace shardtrain::attention_cases
