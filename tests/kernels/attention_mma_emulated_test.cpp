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

template <int DMAX>
Results run_kernels(const Case& c, const Inputs& in) {
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
  emu::launch({tiles, int(c.hkv), int(c.b)}, mma::kThreads, mma::dkdv_smem_bytes<DMAX>(), [&] { mma::dkdv_body<DMAX>(a); });
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
        SCOPED_TRACE(testing::Message() << "emulated bf16 " << mask_name(kind) << " B=" << c.b << " S=" << c.s << " H="
                                        << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh << ", " << schedule_name(schedule));
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

// cp.async lands at the issue under Lockstep and at the wait under the other schedules (the two ends of what
// the GPU allows); a thread that exits with copies in flight is reported. Each thread copies 16 bytes of its
// own and reads them back before and after the wait.
TEST(SimtEmulator, CpAsyncLandsAtIssueOrAtTheWait) {
  struct Restore {
    ~Restore() { emu::set_schedule(emu::Schedule::Lockstep); }
  } restore;
  alignas(16) uint32_t src[32][4];
  for (uint32_t i = 0; i < 32; ++i)
    for (uint32_t j = 0; j < 4; ++j) src[i][j] = 100 * i + j;
  for (emu::Schedule s : {emu::Schedule::Lockstep, emu::Schedule::InOrder}) {
    emu::set_schedule(s);
    std::vector<uint32_t> before(32), after(32);
    std::vector<uint32_t> second_before(32), second_after(32);
    emu::launch({1, 1, 1}, 32, 2 * 32 * 16, [&] {
      const int t = simt::thread_x();
      auto* dst = reinterpret_cast<uint32_t*>(simt::dynamic_smem()) + 4 * t;
      simt::cp_async16(dst, src[t]);
      simt::cp_async_commit();
      before[size_t(t)] = dst[1];
      simt::cp_async16(dst + 4 * 32, src[31 - t]);  // a second group, in the other half
      simt::cp_async_commit();
      simt::cp_async_wait<1>();  // the first group only
      after[size_t(t)] = dst[1];
      second_before[size_t(t)] = dst[4 * 32 + 2];
      simt::cp_async_wait<0>();
      second_after[size_t(t)] = dst[4 * 32 + 2];
    });
    const bool at_issue = s == emu::Schedule::Lockstep;
    for (uint32_t t = 0; t < 32; ++t) {
      EXPECT_EQ(before[t], at_issue ? 100 * t + 1 : 0xffffffffu) << t;
      EXPECT_EQ(after[t], 100 * t + 1) << t;
      EXPECT_EQ(second_before[t], at_issue ? 100 * (31 - t) + 2 : 0xffffffffu) << t;
      EXPECT_EQ(second_after[t], 100 * (31 - t) + 2) << t;
    }
  }
  emu::set_schedule(emu::Schedule::InOrder);
  EXPECT_THROW(emu::launch({1, 1, 1}, 32, 512,
                           [&] {
                             simt::cp_async16(simt::dynamic_smem() + 16 * simt::thread_x(), src[0]);
                             simt::cp_async_commit();
                           }),
               std::runtime_error);
  alignas(16) uint32_t not_shared[4];
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the process has a second thread
  EXPECT_DEATH(emu::launch({1, 1, 1}, 32, 512, [&] { simt::cp_async16(not_shared, src[0]); }), "not in shared memory");
}

// ldmatrix: the layout of simt.cuh from row addresses in shared memory, and what the GPU would fault on.
TEST(SimtEmulator, LdmatrixLayoutAndChecks) {
  std::vector<uint32_t> plain(32 * 4), trans(32 * 4);
  emu::launch({1, 1, 1}, 32, 32 * 16, [&] {
    auto* m = reinterpret_cast<uint16_t*>(simt::dynamic_smem());  // (32, 8): element (r, c) = 256 r + c
    const int lane = simt::thread_x();
    for (int c = 0; c < 8; ++c) m[lane * 8 + c] = uint16_t(256 * lane + c);
    simt::sync();
    // Lane l addresses row l % 8 of matrix l / 8: row l of the stack.
    simt::ldmatrix_x4(&plain[size_t(4 * lane)], m + 8 * lane);
    simt::ldmatrix_x4_trans(&trans[size_t(4 * lane)], m + 8 * lane);
  });
  for (uint32_t lane = 0; lane < 32; ++lane) {
    const uint32_t g = lane / 4, t = lane % 4;
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t r = 8 * i;  // matrix i holds rows 8i .. 8i + 7
      EXPECT_EQ(plain[4 * lane + i], (256 * (r + g) + 2 * t) | ((256 * (r + g) + 2 * t + 1) << 16)) << lane;
      EXPECT_EQ(trans[4 * lane + i], (256 * (r + 2 * t) + g) | ((256 * (r + 2 * t + 1) + g) << 16)) << lane;
    }
  }
  std::vector<uint16_t> global(32 * 8);
  EXPECT_THROW(emu::launch({1, 1, 1}, 32, 0,
                           [&] {
                             uint32_t r[4];
                             simt::ldmatrix_x4(r, global.data() + 8 * simt::thread_x());
                           }),
               std::runtime_error);
  EXPECT_THROW(emu::launch({1, 1, 1}, 32, 1024,
                           [&] {
                             uint32_t r[4];
                             simt::ldmatrix_x4(r, reinterpret_cast<uint16_t*>(simt::dynamic_smem()) + 1);
                           }),
               std::runtime_error);
}
