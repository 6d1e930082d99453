// The device attention kernels against the CPU op (CpuOps::attention_forward / attention_backward) in the same
// dtype, on odd shapes, head dims from 4 to 128, plain causal, packed documents and padding; padding tokens
// carry NaN in q, k, v and dout, so any leak of a padded row into the arithmetic shows up.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.cuh"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;

namespace {

enum class MaskKind { Causal, Packed, Padded };

const char* mask_name(MaskKind m) {
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

// (B, S) segments. Packed: documents of varied lengths, ids not monotonic in row 1 (a reused id joins two runs,
// as the op's definition says). Padded: row 0 ends in padding and has a padding token inside a document;
// row 1 starts with padding (all of it when S = 1).
std::vector<int32_t> make_segments(MaskKind kind, int64_t b, int64_t s) {
  std::vector<int32_t> seg(static_cast<size_t>(b * s), 0);
  const int64_t lengths[] = {1, 7, 20, 3, 50, 2, 33};
  for (int64_t r = 0; r < b; ++r) {
    int64_t doc = 0, left = lengths[r % 7];
    for (int64_t t = 0; t < s; ++t) {
      if (left == 0) {
        ++doc;
        left = lengths[(r + doc) % 7];
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
std::vector<uint8_t> encode(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> out(x.size() * dtype_size(t));
  if (t == DType::F32) {
    std::memcpy(out.data(), x.data(), out.size());
  } else {
    auto* p = reinterpret_cast<bf16*>(out.data());
    for (size_t i = 0; i < x.size(); ++i) p[i] = bf16(x[i]);
  }
  return out;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, DType t) {
  std::vector<float> out(bytes.size() / dtype_size(t));
  if (t == DType::F32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    const auto* p = reinterpret_cast<const bf16*>(bytes.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  }
  return out;
}

std::vector<float> random_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// NaN in every (B, S, heads, Dh) row of a padding token.
void poison_padding(std::vector<float>& x, const std::vector<int32_t>& seg, int64_t heads, int64_t dh) {
  for (size_t t = 0; t < seg.size(); ++t)
    if (seg[t] < 0)
      for (int64_t e = 0; e < heads * dh; ++e) x[t * static_cast<size_t>(heads * dh) + static_cast<size_t>(e)] = NAN;
}

// Device copy of host bytes, and back.
struct DeviceCopy {
  DeviceBuffer buf;
  DeviceCopy(const void* src, size_t bytes, StreamRef s) : buf(bytes) { copy_async(buf.data(), src, bytes, s); }
  explicit DeviceCopy(size_t bytes) : buf(bytes) {}
  template <typename T> std::vector<T> fetch(StreamRef s) const {
    std::vector<T> out(buf.size() / sizeof(T));
    copy_async(out.data(), buf.data(), buf.size(), s);
    stream_synchronize(s);
    return out;
  }
};

// |gpu - cpu| <= tol * (1 + |cpu|) everywhere; -inf must match -inf; the worst element is printed.
void expect_close(const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu, double tol) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double worst = -1;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double g = gpu[i], c = cpu[i];
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
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " elements off; worst at " << worst_i
                     << ": gpu " << gpu[worst_i] << " cpu " << cpu[worst_i] << " (relative error " << worst
                     << ", tolerance " << tol << ")";
}

struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

ops::Shape dims4(int64_t a, int64_t b, int64_t c, int64_t d) { return ops::Shape{a, b, c, d}; }

void check_case(const Case& c, MaskKind kind, DType dtype) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << mask_name(kind) << " B=" << c.b << " S=" << c.s
                                  << " H=" << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh);
  std::mt19937_64 rng(static_cast<uint64_t>(c.s * 7919 + c.h * 131 + c.hkv * 17 + c.dh));
  const size_t nq = static_cast<size_t>(c.b * c.s * c.h * c.dh), nkv = static_cast<size_t>(c.b * c.s * c.hkv * c.dh);
  const size_t nlse = static_cast<size_t>(c.b * c.h * c.s);
  std::vector<float> q = random_values(nq, rng), k = random_values(nkv, rng), v = random_values(nkv, rng);
  std::vector<float> dout = random_values(nq, rng);
  std::vector<int32_t> seg = make_segments(kind, c.b, c.s);
  const bool masked = kind != MaskKind::Causal;
  if (kind == MaskKind::Padded) {
    poison_padding(q, seg, c.h, c.dh);
    poison_padding(k, seg, c.hkv, c.dh);
    poison_padding(v, seg, c.hkv, c.dh);
    poison_padding(dout, seg, c.h, c.dh);
  }
  const std::vector<uint8_t> q_b = encode(q, dtype), k_b = encode(k, dtype), v_b = encode(v, dtype);
  const std::vector<uint8_t> dout_b = encode(dout, dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));

  // CPU reference, in the same storage dtype.
  Results cpu;
  {
    auto cpu_ops = ops::make_cpu_ops(ops::CpuOpsOptions{2});
    const ops::AttentionShape shape{c.b, c.s, c.h, c.hkv, c.dh};
    std::vector<int32_t> seg_copy = seg;
    const ops::AttentionMask mask{masked ? ops::make_tensor(seg_copy.data(), DType::I32, ops::Shape{c.b, c.s})
                                         : ops::Tensor{}};
    std::vector<uint8_t> qc = q_b, kc = k_b, vc = v_b, dc = dout_b;
    std::vector<uint8_t> out_b(q_b.size()), dq_b(q_b.size()), dk_b(k_b.size()), dv_b(k_b.size());
    std::vector<float> lse(nlse);
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
    cpu = Results{decode(out_b, dtype), lse, decode(dq_b, dtype), decode(dk_b, dtype), decode(dv_b, dtype)};
  }

  // Device.
  Results gpu;
  {
    CudaStream stream;
    const StreamRef s = stream.ref();
    const kernels::AttentionDims d{c.b, c.s, c.h, c.hkv, c.dh};
    DeviceCopy q_dev(q_b.data(), q_b.size(), s), k_dev(k_b.data(), k_b.size(), s), v_dev(v_b.data(), v_b.size(), s);
    DeviceCopy dout_dev(dout_b.data(), dout_b.size(), s), seg_dev(seg.data(), seg.size() * sizeof(int32_t), s);
    DeviceCopy out_dev(q_b.size()), lse_dev(nlse * sizeof(float)), dq_dev(q_b.size()), dk_dev(k_b.size());
    DeviceCopy dv_dev(k_b.size()), work(kernels::attention_backward_workspace_bytes(d));
    const int32_t* segp = masked ? static_cast<const int32_t*>(seg_dev.buf.data()) : nullptr;
    kernels::attention_forward(dtype, d, q_dev.buf.data(), k_dev.buf.data(), v_dev.buf.data(), segp, scale,
                               out_dev.buf.data(), static_cast<float*>(lse_dev.buf.data()), s);
    kernels::attention_backward(dtype, d, q_dev.buf.data(), k_dev.buf.data(), v_dev.buf.data(), out_dev.buf.data(),
                                static_cast<const float*>(lse_dev.buf.data()), dout_dev.buf.data(), segp, scale,
                                dq_dev.buf.data(), dk_dev.buf.data(), dv_dev.buf.data(), work.buf.data(), s);
    gpu = Results{decode(out_dev.fetch<uint8_t>(s), dtype), lse_dev.fetch<float>(s),
                  decode(dq_dev.fetch<uint8_t>(s), dtype), decode(dk_dev.fetch<uint8_t>(s), dtype),
                  decode(dv_dev.fetch<uint8_t>(s), dtype)};
  }

  // No NaN anywhere; padding query rows are exactly zero with lse = -inf.
  for (const auto* t : {&gpu.out, &gpu.dq, &gpu.dk, &gpu.dv}) {
    size_t nonfinite = 0;
    for (float x : *t) nonfinite += !std::isfinite(x);
    EXPECT_EQ(nonfinite, 0u) << "non-finite values in a device result";
  }
  for (float x : gpu.lse) EXPECT_FALSE(std::isnan(x) || x == std::numeric_limits<float>::infinity()) << x;
  size_t padding_rows_nonzero = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = 0; i < c.s; ++i) {
      if (seg[static_cast<size_t>(b * c.s + i)] >= 0 || !masked) continue;
      for (int64_t h = 0; h < c.h; ++h) {
        padding_rows_nonzero += gpu.lse[static_cast<size_t>((b * c.h + h) * c.s + i)] != -INFINITY;
        for (int64_t e = 0; e < c.dh; ++e) {
          const size_t at = static_cast<size_t>(((b * c.s + i) * c.h + h) * c.dh + e);
          padding_rows_nonzero += gpu.out[at] != 0.f || gpu.dq[at] != 0.f;
        }
      }
    }
  EXPECT_EQ(padding_rows_nonzero, 0u) << "padding query rows must give out = 0, dq = 0, lse = -inf";

  const double tol = dtype == DType::F32 ? 2e-5 : 2e-2;
  expect_close("out", gpu.out, cpu.out, tol);
  expect_close("lse", gpu.lse, cpu.lse, dtype == DType::F32 ? 2e-5 : 1e-4);  // fp32 in both, from the same inputs
  expect_close("dq", gpu.dq, cpu.dq, tol);
  expect_close("dk", gpu.dk, cpu.dk, tol);
  expect_close("dv", gpu.dv, cpu.dv, tol);
}

void check_all(MaskKind kind, DType dtype) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: attention kernel test skipped";
  for (int64_t s : {1, 45, 130, 257})
    for (auto [h, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 4}})
      for (int64_t dh : {4, 6, 16, 24, 32, 64, 96, 128}) {
        check_case(Case{2, s, h, hkv, dh}, kind, dtype);
        if (testing::Test::HasFailure()) return;  // one failing shape is enough to read
      }
}

}  // namespace

TEST(AttentionKernel, F32Causal) { check_all(MaskKind::Causal, DType::F32); }
TEST(AttentionKernel, F32PackedDocuments) { check_all(MaskKind::Packed, DType::F32); }
TEST(AttentionKernel, F32Padding) { check_all(MaskKind::Padded, DType::F32); }
TEST(AttentionKernel, BF16Causal) { check_all(MaskKind::Causal, DType::BF16); }
TEST(AttentionKernel, BF16PackedDocuments) { check_all(MaskKind::Packed, DType::BF16); }
TEST(AttentionKernel, BF16Padding) { check_all(MaskKind::Padded, DType::BF16); }

// No atomics: two backward passes give the same bits.
TEST(AttentionKernel, BackwardIsDeterministic) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: attention kernel test skipped";
  const kernels::AttentionDims d{2, 300, 8, 2, 64};
  const size_t nq = static_cast<size_t>(d.batch * d.seq * d.heads * d.head_dim);
  const size_t nkv = static_cast<size_t>(d.batch * d.seq * d.kv_heads * d.head_dim);
  std::mt19937_64 rng(5);
  const std::vector<uint8_t> q = encode(random_values(nq, rng), DType::BF16);
  const std::vector<uint8_t> k = encode(random_values(nkv, rng), DType::BF16);
  const std::vector<uint8_t> v = encode(random_values(nkv, rng), DType::BF16);
  const std::vector<uint8_t> g = encode(random_values(nq, rng), DType::BF16);
  CudaStream stream;
  const StreamRef s = stream.ref();
  DeviceCopy q_dev(q.data(), q.size(), s), k_dev(k.data(), k.size(), s), v_dev(v.data(), v.size(), s);
  DeviceCopy g_dev(g.data(), g.size(), s), out_dev(q.size());
  DeviceCopy lse_dev(static_cast<size_t>(d.batch * d.heads * d.seq) * sizeof(float));
  DeviceCopy work(kernels::attention_backward_workspace_bytes(d)), dq(q.size()), dk(k.size()), dv(k.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_dim));
  kernels::attention_forward(DType::BF16, d, q_dev.buf.data(), k_dev.buf.data(), v_dev.buf.data(), nullptr, scale,
                             out_dev.buf.data(), static_cast<float*>(lse_dev.buf.data()), s);
  std::vector<uint8_t> first[3];
  for (int run = 0; run < 2; ++run) {
    kernels::attention_backward(DType::BF16, d, q_dev.buf.data(), k_dev.buf.data(), v_dev.buf.data(),
                                out_dev.buf.data(), static_cast<const float*>(lse_dev.buf.data()), g_dev.buf.data(),
                                nullptr, scale, dq.buf.data(), dk.buf.data(), dv.buf.data(), work.buf.data(), s);
    const std::vector<uint8_t> now[3] = {dq.fetch<uint8_t>(s), dk.fetch<uint8_t>(s), dv.fetch<uint8_t>(s)};
    for (int t = 0; t < 3; ++t) {
      if (run == 0) first[t] = now[t];
      else EXPECT_TRUE(first[t] == now[t]) << "gradient " << t << " differs between two identical runs";
    }
  }
}

// Shape checks happen on the host before any launch, so this runs without a device too.
TEST(AttentionKernel, RejectsUnsupportedShapes) {
  const kernels::AttentionDims too_wide{1, 4, 2, 1, 136}, bad_group{1, 4, 3, 2, 64};
  EXPECT_THROW(kernels::attention_forward(DType::F32, too_wide, nullptr, nullptr, nullptr, nullptr, 1.f, nullptr,
                                          nullptr, StreamRef{}),
               InternalError);
  EXPECT_THROW(kernels::attention_forward(DType::F32, bad_group, nullptr, nullptr, nullptr, nullptr, 1.f, nullptr,
                                          nullptr, StreamRef{}),
               InternalError);
  EXPECT_THROW(kernels::attention_backward(DType::F64, kernels::AttentionDims{1, 4, 2, 1, 64}, nullptr, nullptr,
                                           nullptr, nullptr, nullptr, nullptr, nullptr, 1.f, nullptr, nullptr, nullptr,
                                           reinterpret_cast<void*>(64), StreamRef{}),
               InternalError);
}
