// Every CUDA kernel of kernels/ run on the CPU under the SIMT emulator, through its own launcher (grid sizes,
// dtype dispatch, workspaces, dynamic shared memory attributes), against the CPU backend's op on the same
// values: the cases of the GPU op test (gpu_ops_test.cpp), at sizes the emulator runs in seconds. Inputs and
// outputs are host memory; every launch runs to completion, one fiber per GPU thread, with barriers and warp
// shuffles as rendezvous, so indexing, masking, reductions and barrier structure are the kernels' own. What
// this cannot show (speed, memory ordering between real threads, the hardware's fragment layouts) the GPU
// tests check on a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "tests/kernels/attention_cases.hpp"
#include "tests/emulator/simt_emulator.hpp"
#include "tests/ops/typed_tensor.hpp"
#include "tests/optim/common.hpp"
// Last: the launchers compiled for the emulator, in namespace shardtrain::kernels_emulated.
#include "tests/kernels/emulated_prelude.hpp"
#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/attention_segments.cuh"
#include "kernels/cast.cuh"
#include "kernels/cross_entropy.cuh"
#include "kernels/data_error.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/embedding.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/rope_qkv.cuh"
#include "kernels/simt.cuh"
#include "kernels/sum_squares.cuh"
#include "kernels/swiglu.cuh"

namespace shardtrain::ops {
namespace {

namespace k = ::shardtrain::kernels;  // kernels_emulated (emulated_prelude.hpp)
using test::expect_bitwise_equal;
using test::expect_close;
using test::HostT;
using test::loss_targets;
using test::make_batch;
using test::rope_cases;
using test::Tol;
using test::tol_for;

std::string name(DType d) { return dtype_name(d); }

// The data-error record a kernel writes, as the CUDA backend reads it.
struct ErrorRecord {
  k::DataErrorRecord rec;
  ErrorRecord() { k::data_error_reset(&rec, {}); }
  bool set() const { return rec.code != 0; }
};

// Each test under the emulator's three warp schedules: warps in lockstep, and one warp running ahead of the
// others (first or last) until it must wait, which turns a missing barrier into wrong results.
class EmulatedKernels : public ::testing::TestWithParam<simt_emulator::Schedule> {
 protected:
  void SetUp() override {
    cpu_ = make_cpu_ops(CpuOpsOptions{1});
    simt_emulator::set_schedule(GetParam());
  }
  void TearDown() override {
    k::set_attention_kernel(k::AttentionKernel::Auto);
    simt_emulator::set_schedule(simt_emulator::Schedule::Lockstep);
  }

  HostT random(Shape s, DType d, double scale = 1.0) { return test::random_normal(rng_, s, d, scale); }
  HostT random_ints(Shape s, int32_t lo, int32_t hi) { return test::random_ints(rng_, s, lo, hi); }

  std::unique_ptr<Ops> cpu_;
  std::mt19937_64 rng_{20261122};
};

// ------------------------------------------------------------------------------------------- casts, elementwise

TEST_P(EmulatedKernels, CastsRoundToNearestEvenBitForBit) {
  std::vector<float> in = {0.f,
                           -0.f,
                           1.f,
                           1.00390625f,
                           1.01171875f,
                           -3.3e38f,
                           1e-40f,
                           -1e-45f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 100.f);
  for (int i = 0; i < 3000; ++i) in.push_back(dist(rng));
  std::vector<uint16_t> out(in.size(), 0xdead);
  k::cast_f32_to_bf16(in.data(), out.data(), in.size(), {});
  size_t mismatches = 0;
  for (size_t i = 0; i < in.size(); ++i) mismatches += out[i] != bf16(in[i]).bits;
  EXPECT_EQ(mismatches, 0u);
  std::vector<float> back(in.size(), -1.f);
  k::cast_bf16_to_f32(out.data(), back.data(), out.size(), {});
  mismatches = 0;
  for (size_t i = 0; i < in.size(); ++i) mismatches += back[i] != static_cast<float>(bf16::from_bits(out[i]));
  EXPECT_EQ(mismatches, 0u);
}

TEST_P(EmulatedKernels, FillCopyAddScaleMatchExactly) {
  const Shape s{37, 72};
  for (DType d : {DType::F32, DType::BF16}) {
    HostT want(s, d), got = random(s, d);
    cpu_->fill(want.view(), 0.3);
    k::elementwise_fill(d, got.ptr(), got.numel(), 0.3f, {});
    expect_close("fill " + name(d), got, want, Tol{0, 0});
    HostT x = random(s, d), scaled = x;
    k::elementwise_scale(d, scaled.ptr(), scaled.numel(), -0.75f, {});
    HostT expected(s, d);
    for (int64_t i = 0; i < x.numel(); ++i) expected.set(i, static_cast<float>(x.get(i)) * -0.75f);
    expect_close("scale " + name(d), scaled, expected, Tol{0, 0});
  }
  for (DType from : {DType::F32, DType::BF16}) {
    for (DType to : {DType::F32, DType::BF16}) {
      HostT x = random(s, from), y = random(s, to), want(s, to), got(s, to);
      HostT y_got = y;
      cpu_->copy(x.view(), want.view());
      k::elementwise_copy(from, x.ptr(), to, got.ptr(), x.numel(), {});
      expect_close("copy " + name(from) + " -> " + name(to), got, want, Tol{0, 0});
      cpu_->add(x.view(), y.view());
      k::elementwise_add(from, x.ptr(), to, y_got.ptr(), x.numel(), {});
      expect_close("add " + name(from) + " into " + name(to), y_got, y, Tol{0, 0});
    }
  }
}

// Elements [off, off + n) of t: a pointer for a kernel, a copy for a comparison.
void* elem(HostT& t, int64_t off) { return t.as_ptr<char>() + off * static_cast<int64_t>(dtype_size(t.dtype)); }
HostT slice(const HostT& t, int64_t off, int64_t n) {
  HostT r(Shape{n}, t.dtype);
  std::memcpy(r.ptr(), static_cast<const char*>(t.ptr()) + off * static_cast<int64_t>(dtype_size(t.dtype)),
              static_cast<size_t>(n) * dtype_size(t.dtype));
  return r;
}

// The element-wise kernels move 16 bytes per access where every pointer is 16-byte aligned, and go one element
// at a time otherwise and for the tail: both paths against the CPU op, at sizes with a tail and at element
// offsets that break the alignment (the emulator stops the process at a misaligned 16-byte access, as the GPU
// faults). The count of 16-byte accesses shows which path ran.
TEST_P(EmulatedKernels, ElementwiseVectorAndScalarPaths) {
  const auto wide = [] { return simt_emulator::last_stats().accesses16; };
  for (DType d : {DType::F32, DType::BF16}) {
    const int64_t per16 = 16 / static_cast<int64_t>(dtype_size(d));
    for (int64_t n : {1, 7, 9, 1003}) {
      for (int64_t off : {0, 1, 3}) {
        const std::string at = name(d) + " n=" + std::to_string(n) + " offset=" + std::to_string(off);
        const int64_t vectors = off == 0 ? n / per16 : 0;
        HostT gate = random({n + off}, d), up = random({n + off}, d), dout = random({n + off}, d);
        ASSERT_EQ(reinterpret_cast<uintptr_t>(gate.ptr()) % 16, 0u);
        HostT out({n + off}, d), dg({n + off}, d), du({n + off}, d);
        HostT g = slice(gate, off, n), u = slice(up, off, n), o = slice(dout, off, n);
        HostT want_out({n}, d), want_dgu({2, n}, d);
        HostT gu({2, n}, d);  // the CPU op takes gate and up as (2, N, F) halves: here one row of n
        std::memcpy(gu.ptr(), g.ptr(), g.bytes.size());
        std::memcpy(gu.as_ptr<char>() + g.bytes.size(), u.ptr(), u.bytes.size());
        cpu_->swiglu_forward(gu.view(), GateUpLayout::Halves, want_out.view());
        cpu_->swiglu_backward(o.view(), gu.view(), GateUpLayout::Halves, want_dgu.view());
        const HostT want_dg = slice(want_dgu, 0, n), want_du = slice(want_dgu, n, n);
        k::swiglu_forward(d, elem(gate, off), elem(up, off), n, elem(out, off), 1, n, {});
        EXPECT_EQ(wide(), 3 * vectors) << at;
        expect_close("swiglu out " + at, slice(out, off, n), want_out, tol_for(d));
        k::swiglu_backward(d, elem(dout, off), elem(gate, off), elem(up, off), n, elem(dg, off), elem(du, off), 1, n, {});
        EXPECT_EQ(wide(), 5 * vectors) << at;
        expect_close("swiglu dgate " + at, slice(dg, off, n), want_dg, tol_for(d));
        expect_close("swiglu dup " + at, slice(du, off, n), want_du, tol_for(d));
        HostT gate_in_place = gate, up_in_place = up;  // the model writes the gradients over gate and up
        k::swiglu_backward(d, elem(dout, off), elem(gate_in_place, off), elem(up_in_place, off), n, elem(gate_in_place, off),
                           elem(up_in_place, off), 1, n, {});
        expect_close("swiglu dgate in place " + at, slice(gate_in_place, off, n), want_dg, tol_for(d));
        expect_close("swiglu dup in place " + at, slice(up_in_place, off, n), want_du, tol_for(d));

        HostT filled({n + off}, d), want_fill({n}, d);
        cpu_->fill(want_fill.view(), -1.25);
        k::elementwise_fill(d, elem(filled, off), n, -1.25f, {});
        EXPECT_EQ(wide(), vectors) << at;
        expect_close("fill " + at, slice(filled, off, n), want_fill, Tol{0, 0});
        HostT scaled = gate, want_scaled({n}, d);
        for (int64_t i = 0; i < n; ++i) want_scaled.set(i, static_cast<float>(g.get(i)) * 0.375f);
        k::elementwise_scale(d, elem(scaled, off), n, 0.375f, {});
        EXPECT_EQ(wide(), 2 * vectors) << at;
        expect_close("scale " + at, slice(scaled, off, n), want_scaled, Tol{0, 0});
        for (DType to : {DType::F32, DType::BF16}) {
          const std::string pair = at + " into " + name(to);
          HostT y = random({n + off}, to), copied({n + off}, to);
          HostT want_copy({n}, to), want_sum = slice(y, off, n);
          cpu_->copy(g.view(), want_copy.view());
          cpu_->add(g.view(), want_sum.view());
          if (to != d) {  // the same dtype is a cudaMemcpyAsync
            k::elementwise_copy(d, elem(gate, off), to, elem(copied, off), n, {});
            EXPECT_EQ(wide() > 0, off == 0 && n >= 4) << "copy " << pair;
            expect_close("copy " + pair, slice(copied, off, n), want_copy, Tol{0, 0});
          }
          k::elementwise_add(d, elem(gate, off), to, elem(y, off), n, {});
          EXPECT_EQ(wide() > 0, off == 0 && n >= (d == to ? per16 : 4)) << "add " << pair;
          expect_close("add " + pair, slice(y, off, n), want_sum, Tol{0, 0});
        }
      }
    }
  }
}

// Both layouts of gate and up at the GPU op test's shape: (2, N, F) halves (one row of N F to the kernel) and
// (N, 2F) rows.
TEST_P(EmulatedKernels, SwigluForwardBackward) {
  const int64_t n = 37, f = 136;
  for (DType d : {DType::F32, DType::BF16}) {
    for (bool rows : {false, true}) {
      const std::string what = name(d) + (rows ? " rows" : " halves");
      HostT gate = random({n, f}, d, 2.0), up = random({n, f}, d), dout = random({n, f}, d);
      HostT gu = test::gate_up_tensor(gate, up, rows);
      const GateUpLayout layout = rows ? GateUpLayout::Rows : GateUpLayout::Halves;
      HostT out({n, f}, d), dgu(gu.shape, d), k_out({n, f}, d), k_dgu(gu.shape, d);
      cpu_->swiglu_forward(gu.view(), layout, out.view());
      cpu_->swiglu_backward(dout.view(), gu.view(), layout, dgu.view());
      const int64_t k_rows = rows ? n : 1, cols = rows ? f : n * f, stride = rows ? 2 * f : n * f;
      const int64_t up_at = rows ? f : n * f;
      k::swiglu_forward(d, gu.ptr(), elem(gu, up_at), stride, k_out.ptr(), k_rows, cols, {});
      expect_close("swiglu out " + what, k_out, out, tol_for(d));
      k::swiglu_backward(d, dout.ptr(), gu.ptr(), elem(gu, up_at), stride, k_dgu.ptr(), elem(k_dgu, up_at), k_rows, cols,
                         {});
      expect_close("swiglu dgate_up " + what, k_dgu, dgu, tol_for(d));
    }
  }
}

TEST_P(EmulatedKernels, SumSquaresInDoubleOverManyBlocksAndDeterministic) {
  std::vector<char> workspace(k::sum_squares_workspace_bytes());
  for (DType d : {DType::F32, DType::BF16}) {
    HostT x = random({20011}, d, 3.0);  // 79 blocks of 256 and a partial one
    double want = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = static_cast<float>(x.get(i));
      want += static_cast<double>(v * v);
    }
    double out = -1, again = -2;
    k::sum_squares(d, x.ptr(), x.numel(), &out, k::ReduceInto::Overwrite, workspace.data(), workspace.size(), {});
    EXPECT_NEAR(out, want, 1e-12 * want) << name(d);
    k::sum_squares(d, x.ptr(), x.numel(), &again, k::ReduceInto::Overwrite, workspace.data(), workspace.size(), {});
    EXPECT_EQ(again, out) << name(d);
    k::sum_squares(d, x.ptr(), x.numel(), &again, k::ReduceInto::Accumulate, workspace.data(), workspace.size(), {});
    EXPECT_NEAR(again, 2 * want, 2e-12 * want) << name(d);
  }
}

// ---------------------------------------------------------------------------------------------------- embedding

TEST_P(EmulatedKernels, EmbeddingForwardAndDataError) {
  const int64_t n = 37, vocab = 1003, d = 72;
  HostT ids = random_ints({n}, 0, static_cast<int32_t>(vocab));
  ids.set(5, vocab - 1);
  ids.set(6, 0);
  for (int64_t dim : {d, int64_t{70}}) {  // 72: 16-byte accesses; 70: one element at a time
    for (DType td : {DType::F32, DType::BF16}) {
      for (DType od : {DType::F32, DType::BF16}) {
        HostT table = random({vocab, dim}, td), want({n, dim}, od), got = random({n, dim}, od);
        cpu_->embedding_forward(ids.view(), table.view(), want.view());
        ErrorRecord err;
        k::embedding_forward(ids.as_ptr<int32_t>(), n, td, table.ptr(), vocab, dim, od, got.ptr(), &err.rec, {});
        EXPECT_EQ(simt_emulator::last_stats().accesses16 > 0, dim == d);
        expect_close("embedding " + name(td) + " -> " + name(od), got, want, Tol{0, 0});
        EXPECT_FALSE(err.set());
      }
    }
  }
  // An id outside the vocabulary: its row is zeros and the first bad id is recorded (index, value, bound).
  HostT bad = ids;
  bad.set(11, vocab);
  bad.set(20, -4);
  HostT table = random({vocab, d}, DType::F32), out = random({n, d}, DType::F32);
  ErrorRecord err;
  k::embedding_forward(bad.as_ptr<int32_t>(), n, DType::F32, table.ptr(), vocab, d, DType::F32, out.ptr(), &err.rec, {});
  ASSERT_TRUE(err.set());
  EXPECT_EQ(err.rec.code, static_cast<int32_t>(k::DataErrorCode::TokenId));
  EXPECT_TRUE((err.rec.index == 11 && err.rec.value == vocab) || (err.rec.index == 20 && err.rec.value == -4));
  EXPECT_EQ(err.rec.bound, vocab);
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(out.get(11 * d + j), 0.0);
}

// Runs of about 20 rows (loaded 8 ahead, then a tail), several crossing the 64-position segments of the sorted
// ids, and one of about 110 rows over three segments (a piece in the middle one is all of it); d = 72: 16-byte
// accesses, 70: one element at a time.
TEST_P(EmulatedKernels, EmbeddingBackwardAccumulatesDeterministically) {
  const int64_t n = 300, vocab = 1003;
  HostT ids = random_ints({n}, 0, 12);  // many repeats
  for (int64_t i = 40; i < 260; i += 2) ids.set(i, 7);
  for (int64_t i = 0; i < n; i += 7) ids.set(i, 500 + i);
  std::vector<char> workspace(k::embedding_backward_workspace_bytes(n, vocab, 72));
  const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}};
  for (int64_t d : {72, 70}) {
    for (const auto& p : pairs) {
      const std::string what = "embedding_backward d=" + std::to_string(d) + " " + name(p[0]) + " into " + name(p[1]);
      HostT dout = random({n, d}, p[0]), table0 = random({vocab, d}, p[1]);
      HostT want = table0, got = table0, again = table0;
      cpu_->embedding_backward(ids.view(), dout.view(), want.view());
      k::embedding_backward(ids.as_ptr<int32_t>(), n, p[0], dout.ptr(), d, p[1], got.ptr(), vocab, workspace.data(),
                            workspace.size(), nullptr, {});
      // f32 tables: the CPU's exact order within a segment, pieces of a run added in order across them; bf16
      // ones are rounded once instead of per token.
      expect_close(what, got, want, p[1] == DType::F32 ? Tol{1e-6, 1e-7} : Tol{2e-2, 2e-2});
      k::embedding_backward(ids.as_ptr<int32_t>(), n, p[0], dout.ptr(), d, p[1], again.ptr(), vocab, workspace.data(),
                            workspace.size(), nullptr, {});
      expect_bitwise_equal(what, again, got);
    }
  }
  const int64_t d = 72;
  HostT bad = ids;
  bad.set(3, -1);
  HostT dout = random({n, d}, DType::F32), table = random({vocab, d}, DType::F32);
  ErrorRecord err;
  k::embedding_backward(bad.as_ptr<int32_t>(), n, DType::F32, dout.ptr(), d, DType::F32, table.ptr(), vocab,
                        workspace.data(), workspace.size(), &err.rec, {});
  ASSERT_TRUE(err.set());
  EXPECT_EQ(err.rec.index, 3);
  EXPECT_EQ(err.rec.value, -1);
}

// ------------------------------------------------------------------------------------------------ RMSNorm, RoPE

// d = 72 and 520: 16-byte accesses (bf16 and fp32); 70: one element at a time.
TEST_P(EmulatedKernels, RmsnormForwardWithAndWithoutResidual) {
  for (int64_t d : {72, 520, 70}) {
    const int64_t rows = 37;
    const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};
    for (const auto& p : pairs) {
      for (bool residual : {false, true}) {
        const std::string what =
            "rmsnorm d=" + std::to_string(d) + " " + name(p[0]) + " w " + name(p[1]) + (residual ? " +residual" : "");
        HostT x = random({rows, d}, p[0]), r = random({rows, d}, p[0]), w = random({d}, p[1]);
        HostT h({rows, d}, p[0]), y({rows, d}, p[0]), rstd({rows}, DType::F32);
        HostT kh({rows, d}, p[0]), ky({rows, d}, p[0]), krstd({rows}, DType::F32);
        cpu_->rmsnorm_forward(x.view(), residual ? r.view() : Tensor{}, w.view(), 1e-5, residual ? h.view() : Tensor{},
                              y.view(), rstd.view());
        k::rmsnorm_forward(p[0], x.ptr(), residual ? r.ptr() : nullptr, p[1], w.ptr(), 1e-5f, rows, d,
                           residual ? kh.ptr() : nullptr, ky.ptr(), krstd.as_ptr<float>(), {});
        EXPECT_EQ(simt_emulator::last_stats().accesses16 > 0, d % 4 == 0) << what;
        expect_close(what + " y", ky, y, tol_for(p[0]));
        expect_close(what + " rstd", krstd, rstd, tol_for(DType::F32));
        if (residual) expect_close(what + " h", kh, h, Tol{0, 0});
      }
    }
  }
}

TEST_P(EmulatedKernels, RmsnormBackwardAccumulatesWeightGradDeterministically) {
  // 200: several 64-row parts; 1600: 8 warps a block at most (dim <= 1536: 8, then fewer); 12290: past the
  // shared memory of the fused kernel, the dh kernel and a second pass for dweight.
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{37, 72}, {200, 72}, {37, 70}, {130, 1600}, {5, 12290}}) {
    std::vector<char> workspace(k::rmsnorm_backward_workspace_bytes(rows, d));
    const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}};
    for (const auto& p : pairs) {
      for (bool extra : {false, true}) {
        const std::string what = "rmsnorm_backward rows=" + std::to_string(rows) + " " + name(p[0]) + " dw " + name(p[1]) +
                                 (extra ? " +dh_extra" : "");
        HostT h = random({rows, d}, p[0]), w = random({d}, p[0]), dy = random({rows, d}, p[0]);
        HostT e = random({rows, d}, p[0]), y({rows, d}, p[0]), rstd({rows}, DType::F32), dh({rows, d}, p[0]);
        cpu_->rmsnorm_forward(h.view(), Tensor{}, w.view(), 1e-5, Tensor{}, y.view(), rstd.view());
        HostT dw0 = random({d}, p[1]);
        HostT dw = dw0, kdw = dw0, kdw2 = dw0, kdh({rows, d}, p[0]);
        cpu_->rmsnorm_backward(dy.view(), h.view(), w.view(), rstd.view(), extra ? e.view() : Tensor{}, dh.view(),
                               dw.view());
        auto run = [&](HostT& dweight) {
          k::rmsnorm_backward(p[0], dy.ptr(), h.ptr(), p[0], w.ptr(), rstd.as_ptr<float>(), extra ? e.ptr() : nullptr,
                              kdh.ptr(), rows, d, p[1], dweight.ptr(), workspace.data(), workspace.size(), {});
        };
        run(kdw);
        expect_close(what + " dh", kdh, dh, tol_for(p[0]));
        expect_close(what + " dweight", kdw, dw, p[1] == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(p[1]));
        run(kdw2);
        expect_bitwise_equal(what + " dweight", kdw2, kdw);
      }
    }
  }
}

// SwiGLU on the (N, 2F) rows of the fused gate/up GEMM: 16-byte accesses when each row of gate and up starts
// aligned (F a whole number of vectors, the arrays aligned), one element at a time otherwise; the gradients in the
// same rows, in place as the model writes them.
TEST_P(EmulatedKernels, SwigluRowsVectorAndScalarPaths) {
  const auto wide = [] { return simt_emulator::last_stats().accesses16; };
  const int64_t n = 7;
  for (DType d : {DType::F32, DType::BF16}) {
    const int64_t per16 = 16 / static_cast<int64_t>(dtype_size(d));
    for (int64_t f : {16, 12, 13}) {
      for (int64_t off : {0, 1}) {
        const std::string at = name(d) + " F=" + std::to_string(f) + " offset=" + std::to_string(off);
        const bool vec = off == 0 && f % per16 == 0;
        const int64_t vectors = vec ? n * f / per16 : 0;
        HostT gate = random({n, f}, d, 2.0), up = random({n, f}, d), dout_rows = random({n, f}, d);
        HostT rows = test::gate_up_tensor(gate, up, true);
        HostT want_out({n, f}, d), want_d(rows.shape, d);
        cpu_->swiglu_forward(rows.view(), GateUpLayout::Rows, want_out.view());
        cpu_->swiglu_backward(dout_rows.view(), rows.view(), GateUpLayout::Rows, want_d.view());
        // the kernel's arrays `off` elements into their buffers
        HostT gu_buf({n * 2 * f + off}, d), out_buf({n * f + off}, d), dout_buf({n * f + off}, d);
        const size_t e = dtype_size(d);
        std::memcpy(static_cast<char*>(elem(gu_buf, off)), rows.ptr(), rows.bytes.size());
        std::memcpy(static_cast<char*>(elem(dout_buf, off)), dout_rows.ptr(), dout_rows.bytes.size());
        void* g0 = elem(gu_buf, off);
        void* u0 = static_cast<char*>(g0) + f * static_cast<int64_t>(e);
        k::swiglu_forward(d, g0, u0, 2 * f, elem(out_buf, off), n, f, {});
        EXPECT_EQ(wide(), 3 * vectors) << at;
        expect_close("swiglu rows out " + at, slice(out_buf, off, n * f), want_out, tol_for(d));
        k::swiglu_backward(d, elem(dout_buf, off), g0, u0, 2 * f, g0, u0, n, f, {});
        EXPECT_EQ(wide(), 5 * vectors) << at;
        expect_close("swiglu rows dgate_up in place " + at, slice(gu_buf, off, 2 * n * f), want_d, tol_for(d));
      }
    }
  }
}

// rope_qkv against the CPU op (itself rope's to the bit, tests/ops/fused_ops_test.cpp), both directions: 16-byte
// accesses where half a head is a whole number of vectors and every array is aligned, one pair at a time where
// not (Dh 24 in bf16: 12 pairs; arrays an element off their alignment).
TEST_P(EmulatedKernels, RopeQkvForwardBackward) {
  const auto wide = [] { return simt_emulator::last_stats().accesses16; };
  const int64_t n = 37;
  HostT pos({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) pos.set(i, i < 20 ? i : (i - 20) * 3);
  struct Heads {
    int64_t q, kv;
  };
  for (Heads h : {Heads{6, 2}, Heads{8, 8}}) {
    for (int64_t dh : {24, 64}) {
      for (const auto& [freq_name, freq] : rope_cases()) {
        for (DType d : {DType::F32, DType::BF16}) {
          for (int64_t off : {0, 1}) {
            const std::string what = "rope_qkv H " + std::to_string(h.q) + " Hkv " + std::to_string(h.kv) +
                                     " dh=" + std::to_string(dh) + " " + freq_name + " " + name(d) + " offset " +
                                     std::to_string(off);
            const int64_t width = (h.q + 2 * h.kv) * dh, per16 = 16 / static_cast<int64_t>(dtype_size(d));
            const bool vec = off == 0 && (dh / 2) % per16 == 0;
            const int64_t accesses = vec ? n * (dh / 2 / per16) * 4 * (h.q + 2 * h.kv) : 0;
            const std::vector<float> inv_freq = rope_inv_freq<float>(freq, dh);
            const Tol tol = d == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(d);
            // forward
            HostT packed = random({n, width}, d);
            HostT q({n, h.q, dh}, d), kk({n, h.kv, dh}, d), v({n, h.kv, dh}, d);
            cpu_->rope_qkv_forward(packed.view(), pos.view(), freq, q.view(), kk.view(), v.view());
            HostT packed_buf({n * width + off}, d), q_buf({q.numel() + off}, d), k_buf({kk.numel() + off}, d),
                v_buf({v.numel() + off}, d);
            std::memcpy(elem(packed_buf, off), packed.ptr(), packed.bytes.size());
            k::rope_qkv(d, elem(packed_buf, off), elem(q_buf, off), elem(k_buf, off), elem(v_buf, off),
                        pos.as_ptr<int32_t>(), n, h.q, h.kv, dh, inv_freq.data(), k::RopeDirection::Forward, {});
            EXPECT_EQ(wide(), accesses) << what;
            expect_close(what + " q", slice(q_buf, off, q.numel()), q, tol);
            expect_close(what + " k", slice(k_buf, off, kk.numel()), kk, tol);
            expect_close(what + " v", slice(v_buf, off, v.numel()), v, Tol{0, 0});
            // backward
            HostT dq = random(q.shape, d), dk = random(kk.shape, d), dv = random(v.shape, d), dpacked({n, width}, d);
            cpu_->rope_qkv_backward(dq.view(), dk.view(), dv.view(), pos.view(), freq, dpacked.view());
            std::memcpy(elem(q_buf, off), dq.ptr(), dq.bytes.size());
            std::memcpy(elem(k_buf, off), dk.ptr(), dk.bytes.size());
            std::memcpy(elem(v_buf, off), dv.ptr(), dv.bytes.size());
            k::rope_qkv(d, elem(packed_buf, off), elem(q_buf, off), elem(k_buf, off), elem(v_buf, off),
                        pos.as_ptr<int32_t>(), n, h.q, h.kv, dh, inv_freq.data(), k::RopeDirection::Backward, {});
            EXPECT_EQ(wide(), accesses) << what << " backward";
            expect_close(what + " dqkv", slice(packed_buf, off, n * width), dpacked, tol);
          }
        }
      }
    }
  }
}

TEST_P(EmulatedKernels, RopeForwardBackward) {
  const int64_t n = 37, heads = 6;
  HostT pos({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) pos.set(i, i < 20 ? i : (i - 20) * 3);  // a restart, then wider steps
  for (int64_t dh : {24, 64}) {
    for (const auto& [freq_name, freq] : rope_cases()) {
      for (DType d : {DType::F32, DType::BF16}) {
        for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Backward}) {
          const std::string what = "rope dh=" + std::to_string(dh) + " " + freq_name + " " + name(d) +
                                   (dir == RopeDirection::Forward ? " forward" : " backward");
          HostT x = random({n, heads, dh}, d);
          HostT kx = x;
          cpu_->rope(x.view(), pos.view(), freq, dir);
          k::rope(d, kx.ptr(), pos.as_ptr<int32_t>(), n, heads, dh, rope_inv_freq<float>(freq, dh).data(),
                  dir == RopeDirection::Forward ? k::RopeDirection::Forward : k::RopeDirection::Backward, {});
          expect_close(what, kx, x, d == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(d));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------- attention

TEST_P(EmulatedKernels, AttentionSegmentsMatchExactly) {
  for (int64_t s : {45, 700}) {  // 700: several 256-token tiles per row, the carry between them
    HostT ids, docs;
    make_batch(rng_, 2, s, ids, docs);
    for (int32_t pad : {7, -1}) {
      for (bool with_docs : {false, true}) {
        const std::string what =
            "segments S=" + std::to_string(s) + " pad=" + std::to_string(pad) + (with_docs ? " docs" : "");
        HostT seg({2, s}, DType::I32), pos({2, s}, DType::I32), kseg({2, s}, DType::I32), kpos({2, s}, DType::I32);
        cpu_->attention_segments(ids.view(), pad, with_docs ? docs.view() : Tensor{}, seg.view(), pos.view());
        ErrorRecord err;
        k::attention_segments(ids.as_ptr<int32_t>(), pad, with_docs ? docs.as_ptr<int32_t>() : nullptr, 2, s,
                              kseg.as_ptr<int32_t>(), kpos.as_ptr<int32_t>(), &err.rec, {});
        expect_close(what + " segments", kseg, seg, Tol{0, 0});
        expect_close(what + " positions", kpos, pos, Tol{0, 0});
        EXPECT_FALSE(err.set()) << what;
      }
    }
  }
  HostT ids, docs;
  make_batch(rng_, 2, 45, ids, docs);
  docs.set(50, -2);
  HostT seg({2, 45}, DType::I32), pos({2, 45}, DType::I32);
  ErrorRecord err;
  k::attention_segments(ids.as_ptr<int32_t>(), 7, docs.as_ptr<int32_t>(), 2, 45, seg.as_ptr<int32_t>(),
                        pos.as_ptr<int32_t>(), &err.rec, {});
  ASSERT_TRUE(err.set());
  EXPECT_EQ(err.rec.code, static_cast<int32_t>(k::DataErrorCode::DocumentId));
  EXPECT_EQ(err.rec.index, 50);
}

// The device test's attention cases (attention_cases.hpp) through kernels::attention_forward/backward: f32 on
// the FMA kernels at every padded head dim (16, 32, 64, 96, 128), bf16 on the FMA kernels and, by default, on
// the tensor-core ones (the launchers' dispatch included).
void check_attention(const attention_cases::Case& c, attention_cases::MaskKind kind, DType dtype) {
  using namespace attention_cases;
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << mask_name(kind) << " B=" << c.b << " S=" << c.s
                                  << " H=" << c.h << " Hkv=" << c.hkv << " Dh=" << c.dh << " kernel "
                                  << (k::attention_uses_mma(dtype) ? "mma" : "fma"));
  const Inputs in = make_inputs(c, kind, dtype);
  const Results cpu = cpu_reference(c, in, dtype);
  const k::AttentionDims d{c.b, c.s, c.h, c.hkv, c.dh};
  const size_t elem = dtype_size(dtype);
  // Results start as NaN (0xFF bytes): an element no kernel wrote shows up.
  std::vector<uint8_t> out(in.nq * elem, 0xff), dq(in.nq * elem, 0xff), dk(in.nkv * elem, 0xff), dv(in.nkv * elem, 0xff);
  std::vector<float> lse(in.nlse, NAN);
  std::vector<char> work(k::attention_backward_workspace_bytes(d));
  const int32_t* seg = in.masked ? in.seg.data() : nullptr;
  k::attention_forward(dtype, d, in.q.data(), in.k.data(), in.v.data(), seg, in.scale, out.data(), lse.data(), {});
  k::attention_backward(dtype, d, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), in.dout.data(), seg,
                        in.scale, dq.data(), dk.data(), dv.data(), work.data(), {});
  check_results(c, in, dtype, Results{decode(out, dtype), lse, decode(dq, dtype), decode(dk, dtype), decode(dv, dtype)},
                cpu);
}

TEST_P(EmulatedKernels, AttentionF32EveryHeadDim) {
  using namespace attention_cases;
  for (MaskKind kind : {MaskKind::Causal, MaskKind::Packed, MaskKind::Padded})
    for (int64_t dh : {4, 24, 64, 96, 128}) {
      check_attention(Case{2, 45, 6, 2, dh}, kind, DType::F32);
      if (HasFailure()) return;
    }
  check_attention(Case{2, 130, 4, 4, 64}, MaskKind::Padded, DType::F32);  // several query and key tiles
  check_attention(Case{1, 1, 4, 4, 24}, MaskKind::Causal, DType::F32);
  check_attention(Case{2, 45, 6, 2, 6}, MaskKind::Padded, DType::F32);  // dout . out one element at a time
}

TEST_P(EmulatedKernels, AttentionBF16FmaAndTensorCoreKernels) {
  using namespace attention_cases;
  for (k::AttentionKernel choice : {k::AttentionKernel::Fma, k::AttentionKernel::Auto}) {
    k::set_attention_kernel(choice);
    for (MaskKind kind : {MaskKind::Causal, MaskKind::Packed, MaskKind::Padded}) {
      check_attention(Case{2, 70, 6, 2, 64}, kind, DType::BF16);
      if (HasFailure()) return;
    }
  }
}

// ------------------------------------------------------------------------------------------------------- losses

// vocab 1003: one element per access; 1024: 16-byte accesses.
TEST_P(EmulatedKernels, CrossEntropyLossGradientSumAndDataError) {
  const int64_t n = 37;
  const int32_t ignore = -100;
  for (int64_t vocab : {1003, 1024}) {
    HostT t = loss_targets(rng_, n, vocab, ignore);
    for (DType d : {DType::F32, DType::BF16}) {
      for (DType gd : {d, DType::BF16}) {
        const std::string what = "cross_entropy vocab " + std::to_string(vocab) + " " + name(d) + " dlogits " + name(gd);
        HostT logits = random({n, vocab}, d, 3.0), dl({n, vocab}, d), kdl = random({n, vocab}, gd);
        const LossSums want = cpu_->cross_entropy(logits.view(), t.view(), ignore, 0.37, dl.view());
        std::vector<float> row_loss(static_cast<size_t>(n), NAN);
        ErrorRecord err;
        k::cross_entropy_rows(d, logits.ptr(), n, vocab, t.as_ptr<int32_t>(), ignore, 0.37f, gd, kdl.ptr(), row_loss.data(),
                              0, &err.rec, {});
        EXPECT_EQ(simt_emulator::last_stats().accesses16 > 0, vocab % 8 == 0) << what;
        k::LossSumsDevice sums, total;
        total.loss_sum = 1.5;
        total.tokens = 4;
        k::cross_entropy_sum(row_loss.data(), t.as_ptr<int32_t>(), n, ignore, &sums, &total, {});
        EXPECT_FALSE(err.set()) << what;
        EXPECT_EQ(sums.tokens, want.tokens) << what;
        EXPECT_NEAR(sums.loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum)) << what;
        EXPECT_EQ(total.tokens, want.tokens + 4) << what;  // the running total accumulates
        EXPECT_DOUBLE_EQ(total.loss_sum, 1.5 + sums.loss_sum) << what;
        expect_close(what + " dlogits", kdl, dl.as(gd), tol_for(gd));
      }
    }
    // In place (the CUDA backend's f32 chunks): dlogits over the logits they came from.
    HostT logits = random({n, vocab}, DType::F32, 3.0), dl({n, vocab}, DType::F32);
    cpu_->cross_entropy(logits.view(), t.view(), ignore, 1.0, dl.view());
    std::vector<float> row_loss(static_cast<size_t>(n));
    k::cross_entropy_rows(DType::F32, logits.ptr(), n, vocab, t.as_ptr<int32_t>(), ignore, 1.0f, DType::F32, logits.ptr(),
                          row_loss.data(), 0, nullptr, {});
    expect_close("cross_entropy in place vocab " + std::to_string(vocab), logits, dl, tol_for(DType::F32));
    // Masked logits (-inf, never a row's target): scattered, and every value of whole 16-byte accesses (64..95),
    // including a row's first accesses, where the running max is still -inf.
    HostT masked = random({n, vocab}, DType::F32, 3.0), mdl({n, vocab}, DType::F32), kmdl({n, vocab}, DType::F32);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < vocab; ++j)
        if ((j % 7 == 3 || (j >= 64 && j < 96) || (r % 5 == 0 && j < 200)) && j != static_cast<int64_t>(t.get(r)))
          masked.set(r * vocab + j, -INFINITY);
    const LossSums mwant = cpu_->cross_entropy(masked.view(), t.view(), ignore, 1.0, mdl.view());
    std::vector<float> mrow(static_cast<size_t>(n));
    k::cross_entropy_rows(DType::F32, masked.ptr(), n, vocab, t.as_ptr<int32_t>(), ignore, 1.0f, DType::F32, kmdl.ptr(),
                          mrow.data(), 0, nullptr, {});
    double msum = 0.0;
    for (int64_t r = 0; r < n; ++r)
      if (t.get(r) != ignore) msum += mrow[static_cast<size_t>(r)];
    EXPECT_TRUE(std::isfinite(msum)) << "masked vocab " << vocab;
    EXPECT_NEAR(msum, mwant.loss_sum, 1e-5 * std::abs(mwant.loss_sum)) << "masked vocab " << vocab;
    expect_close("cross_entropy masked vocab " + std::to_string(vocab), kmdl, mdl, tol_for(DType::F32));
  }
  const int64_t vocab = 1003;
  HostT t = loss_targets(rng_, n, vocab, ignore);
  std::vector<float> row_loss(static_cast<size_t>(n));
  for (int32_t bad : {static_cast<int32_t>(vocab), -5}) {
    HostT tb = t;
    tb.set(9, bad);
    ErrorRecord err;
    HostT z = random({n, vocab}, DType::F32);
    k::cross_entropy_rows(DType::F32, z.ptr(), n, vocab, tb.as_ptr<int32_t>(), ignore, 1.0f, DType::F32, nullptr,
                          row_loss.data(), 100, &err.rec, {});
    ASSERT_TRUE(err.set()) << bad;
    EXPECT_EQ(err.rec.code, static_cast<int32_t>(k::DataErrorCode::Target));
    EXPECT_EQ(err.rec.index, 109);  // first_row + row
    EXPECT_EQ(err.rec.value, bad);
    EXPECT_EQ(err.rec.aux, ignore);
  }
}

// -------------------------------------------------------------------------------------------------------- AdamW

// The fused update against the host optimizer over odd shards (decayed and exempt ranges, padding, a range
// longer than two chunks), aligned (float4 path) and off by one float (scalar path): bit for bit, as the CPU
// loop and the kernel do the same correctly rounded operations in the same order.
TEST_P(EmulatedKernels, AdamWMatchesTheHostOptimizerBitForBit) {
  using namespace testing_optim;
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  optim::AdamWConfig config;
  config.decay = optim::DecayScope::ExemptNormsAndEmbeddings;
  config.weight_decay = 0.1;
  for (size_t offset : {0, 1}) {
    SCOPED_TRACE(offset == 0 ? "aligned" : "off by one float");
    HostShards host = make_host_shards(spec, specs, 17, 0.5f);
    optim::AdamW on_host(host.views, spec, config, nullptr);
    // The kernel's own copies: param, grad, exp_avg, exp_avg_sq, each `offset` floats into its buffer.
    struct Arrays {
      std::vector<float> p, g, m, v;
    };
    std::vector<Arrays> mine(specs.size());
    std::vector<k::AdamWChunk> chunks;
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t n = static_cast<size_t>(specs[i].numel) + offset;
      mine[i] = Arrays{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f)};
      std::copy(host.param[i].begin(), host.param[i].end(), mine[i].p.begin() + static_cast<long>(offset));
      for (const optim::DecayRange& r : on_host.ranges(i)) {
        const size_t at = offset + static_cast<size_t>(r.begin);
        k::append_adamw_chunks(chunks, mine[i].p.data() + at, mine[i].g.data() + at, mine[i].m.data() + at,
                               mine[i].v.data() + at, r.end - r.begin, r.decay);
      }
    }
    for (int step = 1; step <= 3; ++step) {
      fill_grads(host.grad, specs, step);
      for (size_t i = 0; i < specs.size(); ++i)
        std::copy(host.grad[i].begin(), host.grad[i].end(), mine[i].g.begin() + static_cast<long>(offset));
      const double lr = 1e-2 / step, scale = step == 2 ? 0.25 : 1.0;
      on_host.step(host.views, lr, scale);
      k::AdamWScalars s;
      s.beta1 = static_cast<float>(config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.step_size = static_cast<float>(lr / (1.0 - std::pow(config.beta1, step)));
      s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(config.beta2, step)));
      s.eps = static_cast<float>(config.eps);
      s.grad_scale = static_cast<float>(scale);
      s.decay_factor = static_cast<float>(1.0 - lr * config.weight_decay);
      k::adamw_step(chunks.data(), static_cast<int64_t>(chunks.size()), s, {});
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto n = static_cast<size_t>(specs[i].numel);
      EXPECT_EQ(std::memcmp(mine[i].p.data() + offset, host.param[i].data(), n * sizeof(float)), 0) << "shard " << i;
      std::vector<float> m(n), v(n);
      on_host.read_state(i, optim::OptimState::ExpAvg, m);
      on_host.read_state(i, optim::OptimState::ExpAvgSq, v);
      EXPECT_EQ(std::memcmp(mine[i].m.data() + offset, m.data(), n * sizeof(float)), 0) << "shard " << i << " exp_avg";
      EXPECT_EQ(std::memcmp(mine[i].v.data() + offset, v.data(), n * sizeof(float)), 0) << "shard " << i << " exp_avg_sq";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, EmulatedKernels,
                         ::testing::Values(simt_emulator::Schedule::Lockstep, simt_emulator::Schedule::InOrder,
                                           simt_emulator::Schedule::Reversed),
                         [](const ::testing::TestParamInfo<simt_emulator::Schedule>& info) {
                           switch (info.param) {
                             case simt_emulator::Schedule::Lockstep: return std::string("Lockstep");
                             case simt_emulator::Schedule::InOrder: return std::string("WarpsInOrder");
                             case simt_emulator::Schedule::Reversed: return std::string("WarpsReversed");
                           }
                           return std::string("Unknown");
                         });

// ------------------------------------------------------------------------------------------ the planner's mirror

// shardtrain plan sizes the CUDA backend's scratch from formulas of its own (ops::cuda_scratch_bytes, built
// without CUDA too): they must cover what the kernels' launchers ask for (the emulated launchers are the
// kernels' source; cub's sort storage, zero here, is estimated on top).
TEST(CudaScratchPlan, CoversTheKernelWorkspaces) {
  struct Shape {
    int64_t batch, seq, hidden, heads, vocab;
  };
  for (const Shape& sh : {Shape{64, 512, 768, 12, 50000}, Shape{2, 45, 72, 6, 1003}, Shape{1, 4096, 8192, 64, 128256},
                          Shape{8, 2048, 128, 96, 32000}}) {
    SCOPED_TRACE(testing::Message() << sh.batch << " x " << sh.seq << " hidden " << sh.hidden << " heads " << sh.heads);
    CudaScratchShape shape;
    shape.batch = sh.batch;
    shape.seq = sh.seq;
    shape.hidden = sh.hidden;
    shape.heads = sh.heads;
    shape.vocab = sh.vocab;
    const CudaScratchBytes b = cuda_scratch_bytes(shape);
    const int64_t n = sh.batch * sh.seq;
    const size_t attention = k::attention_backward_workspace_bytes(k::AttentionDims{sh.batch, sh.seq, sh.heads, 1, 64});
    const size_t rmsnorm = k::rmsnorm_backward_workspace_bytes(n, sh.hidden);
    const size_t embedding = k::embedding_backward_workspace_bytes(n, sh.vocab, sh.hidden);
    EXPECT_GE(b.op_workspace, attention);
    EXPECT_GE(b.op_workspace, rmsnorm);
    EXPECT_GE(b.op_workspace, embedding);
    EXPECT_LE(b.op_workspace, std::max({attention, rmsnorm, embedding + static_cast<size_t>(n) * 8 + 256}));
    EXPECT_GE(b.sum_partials, k::sum_squares_workspace_bytes());
    const int64_t chunk = linear_loss_chunk_tokens(sh.vocab, n, 0, DType::BF16);
    EXPECT_EQ(b.loss, static_cast<size_t>(chunk * sh.vocab * 2 + n * 4));  // bf16 logits (dlogits in place), row losses
    shape.param_dtype = DType::F32;
    const int64_t chunk32 = linear_loss_chunk_tokens(sh.vocab, n, 0, DType::F32);
    EXPECT_EQ(cuda_scratch_bytes(shape).loss, static_cast<size_t>(chunk32 * sh.vocab * 4 + n * 4));
  }
  EXPECT_EQ(linear_loss_logits_dtype(DType::BF16, DType::BF16), DType::BF16);
  EXPECT_EQ(linear_loss_logits_dtype(DType::BF16, DType::F32), DType::F32);
  EXPECT_EQ(linear_loss_logits_dtype(DType::F32, DType::BF16), DType::F32);
  EXPECT_EQ(linear_loss_chunk_tokens(50000, 32768, 0, DType::BF16), 2684);  // the seed: 128M bf16 logits per chunk
  EXPECT_EQ(linear_loss_chunk_tokens(50000, 32768, 0, DType::F32), 1342);   // 64M fp32 logits
  EXPECT_EQ(linear_loss_chunk_tokens(50000, 500, 0, DType::BF16), 500);     // never more than the micro-batch
  EXPECT_EQ(linear_loss_chunk_tokens(1 << 30, 32768, 0, DType::BF16), 64);  // at least 64 rows
  EXPECT_EQ(linear_loss_chunk_tokens(100, 32768, 0, DType::F32), 8192);     // at most 8192
  EXPECT_EQ(linear_loss_chunk_tokens(50000, 32768, 16, DType::F32), 16);    // a requested size wins
}

// ------------------------------------------------------------------------------------------------ the emulator

// What the GPU refuses, the emulated launch refuses: more than 48 KiB of dynamic shared memory without the
// attribute, a grid dimension past its limit.
TEST(SimtEmulatorLaunch, EnforcesTheLaunchLimitsOfTheGpu) {
  static const char kernel = 0;  // stands for a kernel's address
  EXPECT_THROW(simt::launch_emulated(&kernel, dim3(1), dim3(32), 64 * 1024, [] {}), std::runtime_error);
  simt::set_max_dynamic_smem(&kernel, 64 * 1024);
  EXPECT_NO_THROW(simt::launch_emulated(&kernel, dim3(1), dim3(32), 64 * 1024, [] {}));
  EXPECT_THROW(simt::launch_emulated(&kernel, dim3(1), dim3(32), 64 * 1024 + 4, [] {}), std::runtime_error);
  EXPECT_THROW(simt::launch_emulated(&kernel, dim3(1, 70000), dim3(32), 0, [] {}), std::runtime_error);
  EXPECT_THROW(simt::launch_emulated(&kernel, dim3(1), dim3(48), 0, [] {}), std::invalid_argument);  // not whole warps
}

}  // namespace
}  // namespace shardtrain::ops
