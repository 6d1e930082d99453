// The CUDA backend against the CPU backend, op by op: random inputs on odd shapes, f32 and bf16 storage (the
// CPU runs on the very same values, so differences come from summation order and output rounding only),
// accumulating outputs prefilled with nonzero values, masks and ignore_index, and the DataError cases.
// Tolerances: f32 about 1e-5 relative, bf16 about 1e-2. Every test skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"
#include "tests/ops/typed_tensor.hpp"
#include "tests/common/gpu_required.hpp"

namespace shardtrain::ops {
namespace {

using test::expect_bitwise_equal;
using test::expect_close;
using test::HostT;
using test::loss_targets;
using test::make_batch;
using test::rope_cases;
using test::Tol;
using test::tol_for;

struct DevT {
  DeviceBuffer buf;
  DType dtype = DType::F32;
  Shape shape;
  Tensor view() const { return make_tensor(buf.data(), dtype, shape, DeviceKind::Cuda); }
};

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    ST_SKIP_WITHOUT_GPU("GPU ops test");
    stream_ = std::make_unique<CudaStream>();
    gpu_ = std::make_unique<CudaOps>();
    gpu_->set_stream(stream_->ref());
    cpu_ = make_cpu_ops(CpuOpsOptions{1});
  }

  DevT up(const HostT& h) {
    DevT d{DeviceBuffer(h.bytes.size()), h.dtype, h.shape};
    copy_async(d.buf.data(), h.bytes.data(), h.bytes.size(), stream_->ref());
    return d;
  }
  HostT down(const DevT& d) {
    HostT h(d.shape, d.dtype);
    copy_async(h.bytes.data(), d.buf.data(), h.bytes.size(), stream_->ref());
    stream_->synchronize();
    return h;
  }
  HostT random(Shape s, DType d, double scale = 1.0) { return test::random_normal(rng_, s, d, scale); }
  HostT random_ints(Shape s, int32_t lo, int32_t hi) { return test::random_ints(rng_, s, lo, hi); }

  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<CudaOps> gpu_;
  std::unique_ptr<Ops> cpu_;
  std::mt19937_64 rng_{20240601};
};

std::string name(DType d) { return dtype_name(d); }

// ---------------------------------------------------------------------------------------------------------- GEMM

TEST_F(GpuOps, MatmulEveryTransposeDtypeMixAndBeta) {
  const int64_t m = 37, n = 45, k = 136;
  const DType combos[][3] = {{DType::F32, DType::F32, DType::F32},   {DType::BF16, DType::BF16, DType::BF16},
                             {DType::BF16, DType::BF16, DType::F32}, {DType::F32, DType::BF16, DType::F32},
                             {DType::F32, DType::F32, DType::BF16},  {DType::BF16, DType::F32, DType::BF16}};
  for (const auto& combo : combos) {
    for (Transpose ta : {Transpose::No, Transpose::Yes}) {
      for (Transpose tb : {Transpose::No, Transpose::Yes}) {
        for (double beta : {0.0, 1.0, 0.5}) {
          const std::string what = name(combo[0]) + " x " + name(combo[1]) + " -> " + name(combo[2]) +
                                   " ta=" + std::to_string(ta == Transpose::Yes) +
                                   " tb=" + std::to_string(tb == Transpose::Yes) + " beta=" + std::to_string(beta);
          HostT a = random(ta == Transpose::No ? Shape{m, k} : Shape{k, m}, combo[0]);
          HostT b = random(tb == Transpose::No ? Shape{k, n} : Shape{n, k}, combo[1]);
          HostT c = random({m, n}, combo[2]);
          DevT da = up(a), db = up(b), dc = up(c);
          cpu_->matmul(ta, tb, 0.75, a.view(), b.view(), beta, c.view());
          gpu_->matmul(ta, tb, 0.75, da.view(), db.view(), beta, dc.view());
          expect_close(what, down(dc), c, tol_for(combo[2]));
        }
      }
    }
  }
  // Plans are cached: the same call again adds none.
  const size_t plans = gpu_->gemm_plans();
  EXPECT_GT(plans, 0u);
  HostT a = random({m, k}, DType::BF16), b = random({n, k}, DType::BF16), c({m, n}, DType::F32);
  DevT da = up(a), db = up(b), dc = up(c);
  gpu_->matmul(Transpose::No, Transpose::Yes, 1.0, da.view(), db.view(), 0.0, dc.view());
  EXPECT_EQ(gpu_->gemm_plans(), plans);
}

// out = op(a) op(b) + c with c beside out (cuBLASLt reads C, writes D) is what copying c into out and
// accumulating with beta = 1 computes: the same plan, so the same bits; c is left untouched. Mixes cuBLASLt
// has no native path for and c = out take the copy.
TEST_F(GpuOps, MatmulAddReadsCAndWritesOut) {
  const int64_t m = 37, n = 45, k = 136;
  const DType combos[][2] = {
      {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}, {DType::F32, DType::F32}, {DType::F32, DType::BF16}};
  for (const auto& combo : combos) {
    for (int64_t c_offset : {0, 1}) {
      const std::string what = name(combo[0]) + " -> " + name(combo[1]) + " c offset " + std::to_string(c_offset);
      HostT a = random({m, k}, combo[0]), b = random({n, k}, combo[0]), c = random({m + 1, n}, combo[1]);
      HostT out = random({m, n}, combo[1]), want = out;
      DevT da = up(a), db = up(b), dc = up(c), dout = up(out), dref = up(out);
      const Tensor cv = dc.view().row_slice(c_offset, m);
      gpu_->matmul_add(Transpose::No, Transpose::Yes, 0.5, da.view(), db.view(), cv, dout.view());
      gpu_->copy(cv, dref.view());
      gpu_->matmul(Transpose::No, Transpose::Yes, 0.5, da.view(), db.view(), 1.0, dref.view());
      // An aligned c gives the in-place call's plan key (and algorithm); a misaligned one may get another.
      expect_close(what + " vs copy + beta 1", down(dout), down(dref), c_offset == 0 ? Tol{0, 0} : tol_for(combo[1]));
      expect_close(what + " c untouched", down(dc), c, Tol{0, 0});
      cpu_->matmul_add(Transpose::No, Transpose::Yes, 0.5, a.view(), b.view(), c.view().row_slice(c_offset, m), want.view());
      expect_close(what + " vs cpu", down(dout), want, tol_for(combo[1]));
    }
  }
  // c = out: beta = 1 in place.
  HostT a = random({m, k}, DType::BF16), b = random({k, n}, DType::BF16), c = random({m, n}, DType::BF16);
  DevT da = up(a), db = up(b), dc = up(c), dref = up(c);
  gpu_->matmul_add(Transpose::No, Transpose::No, 1.0, da.view(), db.view(), dc.view(), dc.view());
  gpu_->matmul(Transpose::No, Transpose::No, 1.0, da.view(), db.view(), 1.0, dref.view());
  expect_close("c = out", down(dc), down(dref), Tol{0, 0});
  // c must be out or beside it, in out's dtype and shape.
  HostT big = random({2 * m, n}, DType::BF16);
  DevT dbig = up(big);
  EXPECT_THROW(gpu_->matmul_add(Transpose::No, Transpose::No, 1.0, da.view(), db.view(), dbig.view().row_slice(1, m),
                                dbig.view().row_slice(0, m)),
               InternalError);
  DevT d32 = up(random({m, n}, DType::F32));
  EXPECT_THROW(gpu_->matmul_add(Transpose::No, Transpose::No, 1.0, da.view(), db.view(), d32.view(), dc.view()),
               InternalError);
}

TEST_F(GpuOps, MatmulOnMisalignedRowSlicesAndEmptyK) {
  // Row slices starting one row in: pointers aligned to 4 (f32, K = 45) or 2 bytes (bf16).
  const int64_t m = 37, n = 29, k = 45;
  for (DType d : {DType::F32, DType::BF16}) {
    HostT a = random({m + 1, k}, d), b = random({n + 1, k}, d), c = random({m + 1, n}, DType::F32);
    DevT da = up(a), db = up(b), dc = up(c);
    cpu_->matmul(Transpose::No, Transpose::Yes, 1.0, a.view().row_slice(1, m), b.view().row_slice(1, n), 1.0,
                 c.view().row_slice(1, m));
    gpu_->matmul(Transpose::No, Transpose::Yes, 1.0, da.view().row_slice(1, m), db.view().row_slice(1, n), 1.0,
                 dc.view().row_slice(1, m));
    expect_close("misaligned " + name(d), down(dc), c, tol_for(DType::F32));
  }
  // K = 0: c = beta c. (a is (0, m) read transposed and b is (0, n): a (m, 0) shape has no row count.)
  for (double beta : {0.0, 0.5}) {
    HostT c = random({m, n}, DType::BF16);
    DevT dc = up(c);
    float dummy_host = 0;
    DeviceBuffer dummy(16);
    cpu_->matmul(Transpose::Yes, Transpose::No, 1.0, make_tensor(&dummy_host, DType::F32, {0, m}),
                 make_tensor(&dummy_host, DType::F32, {0, n}), beta, c.view());
    gpu_->matmul(Transpose::Yes, Transpose::No, 1.0, make_tensor(dummy.data(), DType::F32, {0, m}, DeviceKind::Cuda),
                 make_tensor(dummy.data(), DType::F32, {0, n}, DeviceKind::Cuda), beta, dc.view());
    expect_close("k=0 beta=" + std::to_string(beta), down(dc), c, Tol{0, 0});
  }
}

TEST_F(GpuOps, MatmulTf32IsOptInAndClose) {
  CudaOps tf32(CudaOpsOptions{F32MatmulPrecision::Tf32});
  tf32.set_stream(stream_->ref());
  HostT a = random({37, 136}, DType::F32), b = random({136, 45}, DType::F32), c({37, 45}, DType::F32);
  DevT da = up(a), db = up(b), dc = up(c);
  cpu_->matmul(Transpose::No, Transpose::No, 1.0, a.view(), b.view(), 0.0, c.view());
  tf32.matmul(Transpose::No, Transpose::No, 1.0, da.view(), db.view(), 0.0, dc.view());
  expect_close("tf32", down(dc), c, Tol{1e-2, 5e-3});
}

// ------------------------------------------------------------------------------------------------- element-wise

TEST_F(GpuOps, FillCopyAddMatchExactly) {
  const Shape s{37, 72};
  for (DType d : {DType::F32, DType::BF16}) {
    HostT out(s, d);
    DevT dout = up(out);
    cpu_->fill(out.view(), 0.3);
    gpu_->fill(dout.view(), 0.3);
    expect_close("fill " + name(d), down(dout), out, Tol{0, 0});
  }
  for (DType from : {DType::F32, DType::BF16}) {
    for (DType to : {DType::F32, DType::BF16}) {
      HostT x = random(s, from), y = random(s, to), z(s, to);
      DevT dx = up(x), dy = up(y), dz = up(z);
      cpu_->copy(x.view(), z.view());
      gpu_->copy(dx.view(), dz.view());
      expect_close("copy " + name(from) + " -> " + name(to), down(dz), z, Tol{0, 0});
      cpu_->add(x.view(), y.view());
      gpu_->add(dx.view(), dy.view());
      expect_close("add " + name(from) + " into " + name(to), down(dy), y, Tol{0, 0});
    }
  }
}

// Gate and up in both layouts: (N, 2F) rows (the fused gate/up GEMM's output) and (2, N, F) halves; the backward
// out of place and in place (the model's).
TEST_F(GpuOps, SwigluForwardBackward) {
  const int64_t n = 37, f = 136;
  for (DType d : {DType::F32, DType::BF16}) {
    for (GateUpLayout layout : {GateUpLayout::Rows, GateUpLayout::Halves}) {
      const std::string what = name(d) + (layout == GateUpLayout::Rows ? " rows" : " halves");
      HostT gu = test::gate_up_tensor(random({n, f}, d, 2.0), random({n, f}, d), layout == GateUpLayout::Rows);
      HostT dout = random({n, f}, d), out({n, f}, d), dgu(gu.shape, d);
      DevT g_gu = up(gu), g_dout = up(dout), g_out = up(out), g_dgu = up(dgu);
      cpu_->swiglu_forward(gu.view(), layout, out.view());
      gpu_->swiglu_forward(g_gu.view(), layout, g_out.view());
      expect_close("swiglu out " + what, down(g_out), out, tol_for(d));
      cpu_->swiglu_backward(dout.view(), gu.view(), layout, dgu.view());
      gpu_->swiglu_backward(g_dout.view(), g_gu.view(), layout, g_dgu.view());
      expect_close("swiglu dgate_up " + what, down(g_dgu), dgu, tol_for(d));
      gpu_->swiglu_backward(g_dout.view(), g_gu.view(), layout, g_gu.view());
      expect_close("swiglu dgate_up in place " + what, down(g_gu), dgu, tol_for(d));
    }
  }
}

TEST_F(GpuOps, SumSquaresIsExactEnoughAndDeterministic) {
  for (DType d : {DType::F32, DType::BF16}) {
    HostT x = random({100003}, d, 3.0);
    double want = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float v = static_cast<float>(x.get(i));
      want += static_cast<double>(v * v);
    }
    DevT dx = up(x), out = up(HostT({1}, DType::F64));
    gpu_->sum_squares(dx.view(), out.view(), SumInto::Overwrite);
    const HostT first = down(out);
    EXPECT_NEAR(first.get(0), want, 1e-9 * want) << name(d);
    gpu_->sum_squares(dx.view(), out.view(), SumInto::Overwrite);
    expect_bitwise_equal("sum_squares " + name(d), down(out), first);
    gpu_->sum_squares(dx.view(), out.view(), SumInto::Accumulate);
    EXPECT_NEAR(down(out).get(0), 2 * want, 2e-9 * want) << name(d);
  }
}

// ---------------------------------------------------------------------------------------------------- embedding

TEST_F(GpuOps, EmbeddingForwardAndDataError) {
  const int64_t n = 37, vocab = 1003, d = 72;
  HostT ids = random_ints({n}, 0, static_cast<int32_t>(vocab));
  ids.set(5, vocab - 1);
  ids.set(6, 0);
  DevT g_ids = up(ids);
  for (DType td : {DType::F32, DType::BF16}) {
    for (DType od : {DType::F32, DType::BF16}) {
      HostT table = random({vocab, d}, td), out({n, d}, od);
      DevT g_table = up(table), g_out = up(out);
      cpu_->embedding_forward(ids.view(), table.view(), out.view());
      gpu_->embedding_forward(g_ids.view(), g_table.view(), g_out.view());
      expect_close("embedding " + name(td) + " -> " + name(od), down(g_out), out, Tol{0, 0});
    }
  }
  // An id outside the vocabulary surfaces at the next synchronization point, once.
  HostT bad = ids;
  bad.set(11, vocab);
  DevT g_bad = up(bad), g_table = up(random({vocab, d}, DType::F32)), g_out = up(HostT({n, d}, DType::F32));
  gpu_->embedding_forward(g_bad.view(), g_table.view(), g_out.view());
  EXPECT_THROW(gpu_->synchronize(), DataError);
  EXPECT_NO_THROW(gpu_->synchronize());
}

TEST_F(GpuOps, EmbeddingBackwardAccumulatesDeterministically) {
  const int64_t n = 300, vocab = 1003, d = 72;
  HostT ids = random_ints({n}, 0, 12);                  // many repeats, runs crossing the kernel's 64-position segments
  for (int64_t i = 40; i < 260; i += 2) ids.set(i, 7);  // one run over three segments
  for (int64_t i = 0; i < n; i += 7) ids.set(i, 500 + i);
  DevT g_ids = up(ids);
  const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}};
  for (const auto& p : pairs) {
    const std::string what = "embedding_backward " + name(p[0]) + " into " + name(p[1]);
    HostT dout = random({n, d}, p[0]), table0 = random({vocab, d}, p[1]);
    HostT table = table0;
    DevT g_dout = up(dout), g_table = up(table0);
    cpu_->embedding_backward(ids.view(), dout.view(), table.view());
    gpu_->embedding_backward(g_ids.view(), g_dout.view(), g_table.view());
    const HostT first = down(g_table);
    // f32 tables: the CPU's exact order within a segment, pieces of a run added in order across them; bf16
    // ones are rounded once instead of per token.
    expect_close(what, first, table, p[1] == DType::F32 ? Tol{1e-6, 1e-7} : Tol{2e-2, 2e-2});
    DevT again = up(table0);
    gpu_->embedding_backward(g_ids.view(), g_dout.view(), again.view());
    expect_bitwise_equal(what, down(again), first);
  }
  HostT bad = ids;
  bad.set(3, -1);
  DevT g_bad = up(bad), g_dout = up(random({n, d}, DType::F32)), g_table = up(random({vocab, d}, DType::F32));
  gpu_->embedding_backward(g_bad.view(), g_dout.view(), g_table.view());
  EXPECT_THROW(gpu_->synchronize(), DataError);
}

// ------------------------------------------------------------------------------------------------ RMSNorm, RoPE

TEST_F(GpuOps, RmsnormForwardWithAndWithoutResidual) {
  for (int64_t d : {72, 520}) {
    const int64_t rows = 37;
    const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}};
    for (const auto& p : pairs) {
      for (bool residual : {false, true}) {
        const std::string what =
            "rmsnorm d=" + std::to_string(d) + " " + name(p[0]) + " w " + name(p[1]) + (residual ? " +residual" : "");
        HostT x = random({rows, d}, p[0]), r = random({rows, d}, p[0]), w = random({d}, p[1]);
        HostT h({rows, d}, p[0]), y({rows, d}, p[0]), rstd({rows}, DType::F32);
        DevT gx = up(x), gr = up(r), gw = up(w), gh = up(h), gy = up(y), grstd = up(rstd);
        cpu_->rmsnorm_forward(x.view(), residual ? r.view() : Tensor{}, w.view(), 1e-5, residual ? h.view() : Tensor{},
                              y.view(), rstd.view());
        gpu_->rmsnorm_forward(gx.view(), residual ? gr.view() : Tensor{}, gw.view(), 1e-5, residual ? gh.view() : Tensor{},
                              gy.view(), grstd.view());
        expect_close(what + " y", down(gy), y, tol_for(p[0]));
        expect_close(what + " rstd", down(grstd), rstd, tol_for(DType::F32));
        if (residual) expect_close(what + " h", down(gh), h, Tol{0, 0});
      }
    }
  }
}

TEST_F(GpuOps, RmsnormBackwardAccumulatesWeightGradDeterministically) {
  // 200 rows: several 64-row parts; dim 768: 8 warps a block (the seed's), 1600: 7, 12290: the unfused path.
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{37, 72}, {200, 72}, {200, 768}, {130, 1600}, {5, 12290}}) {
    const DType pairs[][2] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}};
    for (const auto& p : pairs) {
      for (bool extra : {false, true}) {
        const std::string what = "rmsnorm_backward rows=" + std::to_string(rows) + " " + name(p[0]) + " dw " + name(p[1]) +
                                 (extra ? " +dh_extra" : "");
        HostT h = random({rows, d}, p[0]), w = random({d}, p[0]), dy = random({rows, d}, p[0]);
        HostT e = random({rows, d}, p[0]), y({rows, d}, p[0]), rstd({rows}, DType::F32), dh({rows, d}, p[0]);
        cpu_->rmsnorm_forward(h.view(), Tensor{}, w.view(), 1e-5, Tensor{}, y.view(), rstd.view());
        HostT dw0 = random({d}, p[1]);
        HostT dw = dw0;
        DevT gh = up(h), gw = up(w), gdy = up(dy), ge = up(e), grstd = up(rstd), gdh = up(dh), gdw = up(dw0);
        cpu_->rmsnorm_backward(dy.view(), h.view(), w.view(), rstd.view(), extra ? e.view() : Tensor{}, dh.view(),
                               dw.view());
        gpu_->rmsnorm_backward(gdy.view(), gh.view(), gw.view(), grstd.view(), extra ? ge.view() : Tensor{}, gdh.view(),
                               gdw.view());
        expect_close(what + " dh", down(gdh), dh, tol_for(p[0]));
        const HostT first = down(gdw);
        expect_close(what + " dweight", first, dw, p[1] == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(p[1]));
        DevT again = up(dw0);
        gpu_->rmsnorm_backward(gdy.view(), gh.view(), gw.view(), grstd.view(), extra ? ge.view() : Tensor{}, gdh.view(),
                               again.view());
        expect_bitwise_equal(what + " dweight", down(again), first);
      }
    }
  }
}

TEST_F(GpuOps, RopeForwardBackward) {
  const int64_t n = 37, heads = 6;
  HostT pos({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) pos.set(i, i < 20 ? i : (i - 20) * 3);  // a restart, then wider steps
  DevT gpos = up(pos);
  for (int64_t dh : {24, 64}) {
    for (const auto& [freq_name, freq] : rope_cases()) {
      for (DType d : {DType::F32, DType::BF16}) {
        for (RopeDirection dir : {RopeDirection::Forward, RopeDirection::Backward}) {
          const std::string what = "rope dh=" + std::to_string(dh) + " " + freq_name + " " + name(d) +
                                   (dir == RopeDirection::Forward ? " forward" : " backward");
          HostT x = random({n, heads, dh}, d);
          DevT gx = up(x);
          cpu_->rope(x.view(), pos.view(), freq, dir);
          gpu_->rope(gx.view(), gpos.view(), freq, dir);
          expect_close(what, down(gx), x, d == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(d));
        }
      }
    }
  }
}

// RoPE of q and k fused with the split of the packed q/k/v projection, and its transpose, against the CPU op (rope's
// own to the bit): GQA and not, Dh 24 (bf16: one pair per thread) and 64 (16-byte accesses).
TEST_F(GpuOps, RopeQkvForwardBackward) {
  const int64_t n = 37;
  HostT pos({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) pos.set(i, i < 20 ? i : (i - 20) * 3);
  DevT gpos = up(pos);
  const int64_t head_cases[][2] = {{6, 2}, {8, 8}};
  for (const auto& hc : head_cases) {
    const int64_t heads = hc[0], kv = hc[1];
    for (int64_t dh : {24, 64}) {
      for (const auto& [freq_name, freq] : rope_cases()) {
        for (DType d : {DType::F32, DType::BF16}) {
          const std::string what = "rope_qkv H " + std::to_string(heads) + " Hkv " + std::to_string(kv) +
                                   " dh=" + std::to_string(dh) + " " + freq_name + " " + name(d);
          const Tol tol = d == DType::F32 ? Tol{1e-5, 1e-5} : tol_for(d);
          const int64_t width = (heads + 2 * kv) * dh;
          HostT packed = random({n, width}, d), q({n, heads, dh}, d), k({n, kv, dh}, d), v({n, kv, dh}, d);
          DevT g_packed = up(packed), g_q = up(q), g_k = up(k), g_v = up(v);
          cpu_->rope_qkv_forward(packed.view(), pos.view(), freq, q.view(), k.view(), v.view());
          gpu_->rope_qkv_forward(g_packed.view(), gpos.view(), freq, g_q.view(), g_k.view(), g_v.view());
          expect_close(what + " q", down(g_q), q, tol);
          expect_close(what + " k", down(g_k), k, tol);
          expect_close(what + " v", down(g_v), v, Tol{0, 0});
          HostT dq = random(q.shape, d), dk = random(k.shape, d), dv = random(v.shape, d), dpacked({n, width}, d);
          DevT g_dq = up(dq), g_dk = up(dk), g_dv = up(dv), g_dpacked = up(dpacked);
          cpu_->rope_qkv_backward(dq.view(), dk.view(), dv.view(), pos.view(), freq, dpacked.view());
          gpu_->rope_qkv_backward(g_dq.view(), g_dk.view(), g_dv.view(), gpos.view(), freq, g_dpacked.view());
          expect_close(what + " dqkv", down(g_dpacked), dpacked, tol);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------- attention

TEST_F(GpuOps, AttentionSegmentsMatchExactly) {
  for (int64_t s : {45, 700}) {  // 700: several 256-token tiles per row
    HostT ids, docs;
    make_batch(rng_, 2, s, ids, docs);
    DevT gids = up(ids), gdocs = up(docs);
    for (int32_t pad : {7, -1}) {
      for (bool with_docs : {false, true}) {
        const std::string what =
            "segments S=" + std::to_string(s) + " pad=" + std::to_string(pad) + (with_docs ? " docs" : "");
        HostT seg({2, s}, DType::I32), pos({2, s}, DType::I32);
        DevT gseg = up(seg), gpos = up(pos);
        cpu_->attention_segments(ids.view(), pad, with_docs ? docs.view() : Tensor{}, seg.view(), pos.view());
        gpu_->attention_segments(gids.view(), pad, with_docs ? gdocs.view() : Tensor{}, gseg.view(), gpos.view());
        expect_close(what + " segments", down(gseg), seg, Tol{0, 0});
        expect_close(what + " positions", down(gpos), pos, Tol{0, 0});
      }
    }
  }
  HostT ids, docs;
  make_batch(rng_, 2, 45, ids, docs);
  docs.set(50, -2);
  DevT gids = up(ids), gdocs = up(docs), gseg = up(HostT({2, 45}, DType::I32)), gpos = up(HostT({2, 45}, DType::I32));
  gpu_->attention_segments(gids.view(), 7, gdocs.view(), gseg.view(), gpos.view());
  EXPECT_THROW(gpu_->synchronize(), DataError);
}

TEST_F(GpuOps, AttentionForwardBackwardCausalAndSegments) {
  const int64_t b = 2, s = 45, h = 6, hkv = 2;
  HostT ids, docs;
  make_batch(rng_, b, s, ids, docs);
  HostT seg({b, s}, DType::I32), pos({b, s}, DType::I32);
  cpu_->attention_segments(ids.view(), 7, docs.view(), seg.view(), pos.view());
  DevT gseg = up(seg);
  for (int64_t dh : {24, 64}) {
    const AttentionShape shape{b, s, h, hkv, dh};
    for (DType d : {DType::F32, DType::BF16}) {
      for (bool masked : {false, true}) {
        const std::string what = "attention Dh=" + std::to_string(dh) + " " + name(d) + (masked ? " segments" : " causal");
        const AttentionMask cmask{masked ? seg.view() : Tensor{}};
        const AttentionMask gmask{masked ? gseg.view() : Tensor{}};
        HostT q = random({b, s, h, dh}, d), k = random({b, s, hkv, dh}, d), v = random({b, s, hkv, dh}, d);
        HostT out({b, s, h, dh}, d), lse({b, h, s}, DType::F32), dout = random({b, s, h, dh}, d);
        DevT gq = up(q), gk = up(k), gv = up(v), gout = up(out), glse = up(lse), gdout = up(dout);
        cpu_->attention_forward(shape, q.view(), k.view(), v.view(), cmask, out.view(), lse.view());
        gpu_->attention_forward(shape, gq.view(), gk.view(), gv.view(), gmask, gout.view(), glse.view());
        expect_close(what + " out", down(gout), out, tol_for(d));
        expect_close(what + " lse", down(glse), lse, Tol{1e-5, 1e-5});
        // Backward from the CPU's out and lse on both sides, so only the backward is compared.
        DevT cout_dev = up(out), clse_dev = up(lse);
        HostT dq({b, s, h, dh}, d), dk({b, s, hkv, dh}, d), dv({b, s, hkv, dh}, d);
        DevT gdq = up(random({b, s, h, dh}, d)), gdk = up(random({b, s, hkv, dh}, d)), gdv = up(random({b, s, hkv, dh}, d));
        cpu_->attention_backward(shape, q.view(), k.view(), v.view(), out.view(), lse.view(), dout.view(), cmask, dq.view(),
                                 dk.view(), dv.view());
        gpu_->attention_backward(shape, gq.view(), gk.view(), gv.view(), cout_dev.view(), clse_dev.view(), gdout.view(),
                                 gmask, gdq.view(), gdk.view(), gdv.view());
        const Tol t = d == DType::F32 ? Tol{1e-4, 1e-5} : tol_for(d);
        expect_close(what + " dq", down(gdq), dq, t);
        expect_close(what + " dk", down(gdk), dk, t);
        expect_close(what + " dv", down(gdv), dv, t);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------------- losses

TEST_F(GpuOps, CrossEntropyLossGradientAndDataError) {
  const int64_t n = 37, vocab = 1003;
  const int32_t ignore = -100;
  HostT t = loss_targets(rng_, n, vocab, ignore);
  DevT gt = up(t);
  for (DType d : {DType::F32, DType::BF16}) {
    HostT logits = random({n, vocab}, d, 3.0), dl({n, vocab}, d);
    DevT gl = up(logits), gdl = up(random({n, vocab}, d));
    const LossSums want = cpu_->cross_entropy(logits.view(), t.view(), ignore, 0.37, dl.view());
    const LossSums got = gpu_->cross_entropy(gl.view(), gt.view(), ignore, 0.37, gdl.view());
    EXPECT_EQ(got.tokens, want.tokens) << name(d);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum)) << name(d);
    expect_close("cross_entropy dlogits " + name(d), down(gdl), dl, tol_for(d));
    const LossSums loss_only = gpu_->cross_entropy(gl.view(), gt.view(), ignore, 0.37, Tensor{});
    EXPECT_EQ(loss_only.tokens, want.tokens);
    EXPECT_NEAR(loss_only.loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum)) << name(d);
  }
  HostT logits = random({n, vocab}, DType::F32);
  DevT gl = up(logits);
  for (int32_t bad : {static_cast<int32_t>(vocab), -5}) {
    HostT tb = t;
    tb.set(9, bad);
    DevT gtb = up(tb);
    EXPECT_THROW(gpu_->cross_entropy(gl.view(), gtb.view(), ignore, 1.0, Tensor{}), DataError) << bad;
  }
  EXPECT_NO_THROW(gpu_->cross_entropy(gl.view(), gt.view(), ignore, 1.0, Tensor{}));  // the record was reset
}

// Deferred losses: zero sums from the calls, the total (in call order) from take_loss(), which starts over;
// a bad target recorded while deferring surfaces at take_loss() and leaves no stale total behind.
TEST_F(GpuOps, DeferredLossIsReadOncePerTake) {
  const int64_t n = 29, vocab = 517;
  const int32_t ignore = -100;
  HostT t = loss_targets(rng_, n, vocab, ignore);
  DevT gt = up(t);
  HostT logits = random({n, vocab}, DType::F32, 2.0), logits2 = random({n, vocab}, DType::F32, 2.0);
  DevT gl = up(logits), gl2 = up(logits2);
  const LossSums a = gpu_->cross_entropy(gl.view(), gt.view(), ignore, 1.0, Tensor{});
  const LossSums b = gpu_->cross_entropy(gl2.view(), gt.view(), ignore, 1.0, Tensor{});
  gpu_->defer_loss(true);
  const LossSums z1 = gpu_->cross_entropy(gl.view(), gt.view(), ignore, 1.0, Tensor{});
  const LossSums z2 = gpu_->cross_entropy(gl2.view(), gt.view(), ignore, 1.0, Tensor{});
  EXPECT_EQ(z1.tokens, 0);
  EXPECT_EQ(z2.loss_sum, 0.0);
  const LossSums total = gpu_->take_loss();
  EXPECT_EQ(total.tokens, a.tokens + b.tokens);
  EXPECT_EQ(total.loss_sum, a.loss_sum + b.loss_sum);  // the same doubles, added in the same order
  EXPECT_EQ(gpu_->take_loss().tokens, 0);              // started over
  HostT tb = t;
  tb.set(3, static_cast<int32_t>(vocab));
  DevT gtb = up(tb);
  EXPECT_NO_THROW(gpu_->cross_entropy(gl.view(), gtb.view(), ignore, 1.0, Tensor{}));  // recorded, not read
  EXPECT_THROW(gpu_->take_loss(), DataError);
  const LossSums after = gpu_->take_loss();
  EXPECT_EQ(after.tokens, 0);
  EXPECT_EQ(after.loss_sum, 0.0);
  gpu_->defer_loss(false);
  EXPECT_EQ(gpu_->cross_entropy(gl.view(), gt.view(), ignore, 1.0, Tensor{}).tokens, a.tokens);
}

TEST_F(GpuOps, LinearCrossEntropyInChunksMatchesCpu) {
  const int64_t n = 37, d = 72, vocab = 1003;
  const int32_t ignore = -100;
  HostT t = loss_targets(rng_, n, vocab, ignore);
  DevT gt = up(t);
  const DType sets[][3] = {{DType::F32, DType::F32, DType::F32},
                           {DType::BF16, DType::BF16, DType::F32},
                           {DType::BF16, DType::BF16, DType::BF16},
                           {DType::F32, DType::BF16, DType::F32}};
  for (const auto& set : sets) {
    for (int64_t chunk : {16, 0}) {
      for (double beta : {1.0, 0.0}) {  // dW added into (onto random values), or overwritten (over NaN)
        const std::string what = "linear_cross_entropy h " + name(set[0]) + " W " + name(set[1]) + " dW " + name(set[2]) +
                                 " chunk " + std::to_string(chunk) + (beta == 0.0 ? " overwriting dW" : "");
        HostT hh = random({n, d}, set[0]), w = random({vocab, d}, set[1], 0.3), dh({n, d}, set[0]);
        HostT dw0 = random({vocab, d}, set[2], 0.1);
        if (beta == 0.0)
          for (int64_t i = 0; i < dw0.numel(); ++i) dw0.set(i, std::nan(""));
        HostT dw = dw0;
        DevT gh = up(hh), gw = up(w), gdh = up(random({n, d}, set[0])), gdw = up(dw0);
        const LossSums want =
            cpu_->linear_cross_entropy(hh.view(), w.view(), t.view(), ignore, 0.5, chunk, dh.view(), dw.view(), beta);
        const LossSums got =
            gpu_->linear_cross_entropy(gh.view(), gw.view(), gt.view(), ignore, 0.5, chunk, gdh.view(), gdw.view(), beta);
        // bf16 h and W: both backends round the logits and dlogits to bf16; a logit whose fp32 value lies near a
        // rounding boundary may round the other way after cuBLAS's summation order (one bf16 step, 2^-8).
        const bool bf16_logits = set[0] == DType::BF16 && set[1] == DType::BF16;
        const double loss_tol = bf16_logits ? 1e-4 : 1e-5;
        EXPECT_EQ(got.tokens, want.tokens) << what;
        EXPECT_NEAR(got.loss_sum, want.loss_sum, loss_tol * std::abs(want.loss_sum)) << what;
        expect_close(what + " dh", down(gdh), dh, bf16_logits ? Tol{1e-2, 5e-3} : tol_for(set[0]));
        expect_close(what + " dweight", down(gdw), dw, bf16_logits ? Tol{1e-2, 5e-3} : tol_for(set[2]));
        const LossSums loss_only =
            gpu_->linear_cross_entropy(gh.view(), gw.view(), gt.view(), ignore, 0.5, chunk, Tensor{}, Tensor{}, 1.0);
        EXPECT_EQ(loss_only.tokens, want.tokens) << what;
        EXPECT_NEAR(loss_only.loss_sum, want.loss_sum, loss_tol * std::abs(want.loss_sum)) << what;
      }
    }
  }
  HostT tb = t;
  tb.set(30, vocab + 3);
  DevT gtb = up(tb), gh = up(random({n, d}, DType::F32)), gw = up(random({vocab, d}, DType::F32));
  EXPECT_THROW(gpu_->linear_cross_entropy(gh.view(), gw.view(), gtb.view(), ignore, 1.0, 16, Tensor{}, Tensor{}, 1.0),
               DataError);
}

// ------------------------------------------------------------------------------------------------------- checks

TEST_F(GpuOps, RejectsHostTensorsAndF64) {
  HostT host({4, 4}, DType::F32);
  EXPECT_THROW(gpu_->fill(host.view(), 1.0), InternalError);
  DevT f64 = up(HostT({4, 4}, DType::F64));
  EXPECT_THROW(gpu_->fill(f64.view(), 1.0), InternalError);
  DevT a = up(random({4, 4}, DType::F32));
  EXPECT_THROW(gpu_->matmul(Transpose::No, Transpose::No, 1.0, a.view(), host.view(), 0.0, a.view()), InternalError);
}

}  // namespace
}  // namespace shardtrain::ops
