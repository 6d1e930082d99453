// The tensor-core attention kernels' own source (kernels/attention_mma_body.cuh) run under the SIMT emulator
// on the CPU, against the CPU op on the cases of the device test (attention_cases.hpp): odd sequence lengths,
// head dims 4 to 128, grouped and plain heads, causal, packed documents, padding with NaN in padded tokens.
// The same bodies run on the GPU through attention_mma.cu; attention_kernel_test checks them there.
#define SHARDTRAIN_SIMT_EMULATOR 1

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/attention_mma_body.cuh"
#include "tests/kernels/attention_cases.hpp"
#include "tests/emulator/simt_emulator.hpp"

using namespace shardtrain;
using namespace shardtrain::attention_cases;
namespace mma = shardtrain::kernels::attention_mma;
namespace emu = shardtrain::simt_emulator;

namespace {

constexpr uint16_t kNanBits = 0x7fc0;  // results start as NaN: an element no kernel wrote shows up

std::vector<uint16_t> as_bits(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<float> bits_to_float(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = float_from_bf16_bits(bits[i]);
  return out;
}

template <int DMAX> Results run_kernels(const Case& c, const Inputs& in) {
  const std::vector<uint16_t> q = as_bits(in.q), k = as_bits(in.k), v = as_bits(in.v), dout = as_bits(in.dout);
  std::vector<uint16_t> out(in.nq, kNanBits), dq(in.nq, kNanBits), dk(in.nkv, kNanBits), dv(in.nkv, kNanBits);
  std::vector<float> lse(in.nlse, NAN), dvec(in.nlse, NAN);
  mma::Args a{};
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.dout = dout.data();
  a.seg = in.masked ? in.seg.data() : nullptr;
  a.dvec = dvec.data();
  a.lse = lse.data();
  a.lse_out = lse.data();
  a.out = out.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.seq = int(c.s);
  a.heads = int(c.h);
  a.kv_heads = int(c.hkv);
  a.head_dim = int(c.dh);
  a.group = int(c.h / c.hkv);
  a.scale = in.scale;
  a.vec16 = c.dh % 8 == 0;  // std::vector storage is 16-byte aligned

  const int tiles = int((c.s + mma::kRows - 1) / mma::kRows);
  emu::launch({tiles, int(c.h), int(c.b)}, mma::kThreads, mma::forward_smem_bytes<DMAX>(),
              [&] { mma::forward_body<DMAX>(a); });
  // dvec as attention_bwd.cu's dot kernel: rowsum(dout * out) in fp32, zero for rows that saw nothing.
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t i = 0; i < c.s; ++i)
      for (int64_t h = 0; h < c.h; ++h) {
        const size_t row = static_cast<size_t>(((b * c.s + i) * c.h + h) * c.dh);
        float acc = 0.f;
        for (int64_t e = 0; e < c.dh; ++e)
          acc += float_from_bf16_bits(dout[row + size_t(e)]) * float_from_bf16_bits(out[row + size_t(e)]);
        const size_t at = static_cast<size_t>((b * c.h + h) * c.s + i);
        const bool dead = lse[at] == -INFINITY || (in.masked && in.seg[static_cast<size_t>(b * c.s + i)] < 0);
        dvec[at] = dead ? 0.f : acc;
      }
  emu::launch({tiles, int(c.hkv), int(c.b)}, mma::kThreads, mma::dkdv_smem_bytes<DMAX>(),
              [&] { mma::dkdv_body<DMAX>(a); });
  emu::launch({tiles, int(c.h), int(c.b)}, mma::kThreads, mma::dq_smem_bytes<DMAX>(), [&] { mma::dq_body<DMAX>(a); });
  return Results{bits_to_float(out), lse, bits_to_float(dq), bits_to_float(dk), bits_to_float(dv)};
}

Results emulate(const Case& c, const Inputs& in) {
  Results r;
  mma::with_dmax(c.dh, [&]<int DMAX>() { r = run_kernels<DMAX>(c, in); });
  return r;
}

const char* schedule_name(emu::Schedule s) {
  switch (s) {
    case emu::Schedule::Lockstep: return "lockstep";
    case emu::Schedule::InOrder: return "warps in order";
    case emu::Schedule::Reversed: return "warps reversed";
  }
  return "?";
}

void check_all(MaskKind kind) {
  // Sequence lengths below, at and across the 64-row tiles; head dims padded (4, 24) and exact (64, 128); the
  // emulator's three warp schedules in turn.
  struct Restore {
    ~Restore() { emu::set_schedule(emu::Schedule::Lockstep); }
  } restore;
  int n = 0;
  for (int64_t s : {1, 45, 130})
    for (auto [h, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 4}})
      for (int64_t dh : {4, 24, 64, 128}) {
        const Case c{2, s, h, hkv, dh};
        const emu::Schedule schedule = static_cast<emu::Schedule>(n++ % 3);
        emu::set_schedule(schedule);
        SCOPED_TRACE(testing::Message() << "emulated bf16 " << mask_name(kind) << " B=" << c.b << " S=" << c.s
                                        << " H=" << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh << ", "
                                        << schedule_name(schedule));
        const Inputs in = make_inputs(c, kind, DType::BF16);
        check_results(c, in, DType::BF16, emulate(c, in), cpu_reference(c, in, DType::BF16));
        if (testing::Test::HasFailure()) return;  // one failing shape is enough to read
      }
}

}  // namespace

TEST(AttentionMmaEmulated, BF16Causal) { check_all(MaskKind::Causal); }
TEST(AttentionMmaEmulated, BF16PackedDocuments) { check_all(MaskKind::Packed); }
TEST(AttentionMmaEmulated, BF16Padding) { check_all(MaskKind::Padded); }

// The emulator itself: the probe's fragment loaders and mma give the exact product of small integers; shuffles
// and sync_or return what CUDA's would; a barrier only some threads reach is reported, not hung on.
TEST(SimtEmulator, MmaProbeIsTheMatrixProduct) {
  const MmaProbeCase p = make_mma_probe_case();
  std::vector<float> d(3 * p.want.size(), NAN);
  emu::launch({1, 1, 1}, 32, mma::kProbeSmemBytes,
              [&] { mma::mma_probe_body(p.a.data(), p.b.data(), p.bt.data(), d.data()); });
  EXPECT_EQ(emu::last_stats().mmas, 6);
  EXPECT_EQ(emu::last_stats().ldmatrices, 3);
  for (size_t w = 0; w < 3; ++w)
    for (size_t i = 0; i < p.want.size(); ++i)
      EXPECT_EQ(d[w * 256 + i], p.want[i]) << MmaProbeCase::ways[w] << ": d[" << i / 16 << "][" << i % 16 << "]";
}

TEST(SimtEmulator, ShufflesAndBarriers) {
  std::vector<float> got(64);
  std::vector<int> any(64);
  emu::launch({1, 1, 1}, 64, 0, [&] {
    const int tid = simt::thread_x();
    got[size_t(tid)] = simt::shfl_xor(float(tid), 5);
    any[size_t(tid)] = simt::sync_or(tid == 37) ? 1 : 0;
  });
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(got[size_t(t)], float((t & ~31) | ((t % 32) ^ 5))) << t;
    EXPECT_EQ(any[size_t(t)], 1) << t;
  }
  EXPECT_EQ(emu::last_stats().barriers, 1);
  EXPECT_EQ(emu::last_stats().warp_collectives, 2);
}

TEST(SimtEmulator, ReportsDivergentBarrier) {
  EXPECT_THROW(emu::launch({2, 1, 1}, 64, 0,
                           [&] {
                             if (simt::thread_x() < 40) simt::sync();
                           }),
               std::runtime_error);
  EXPECT_THROW(emu::launch({1, 1, 1}, 32, 0,
                           [&] {
                             if (simt::thread_x() % 2) simt::shfl_xor(1.f, 1);
                           }),
               std::runtime_error);
}
