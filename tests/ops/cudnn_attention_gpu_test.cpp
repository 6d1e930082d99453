// cuDNN's fused flash attention (src/ops/cuda/cudnn_attention.hpp) against our attention kernels
// (kernels::attention_forward / attention_backward, themselves checked against the CPU backend) on the same random
// bf16 inputs: B 2, S 45 / 130 / 512, Dh 64 and 128, H/Hkv 6/2 and 8/8, plain causal and packed documents (several
// documents per row, ids never reused, a padding tail). cuDNN's outputs start as NaN, so an element it does not
// write fails; padding rows must come back zero (lse -inf). The deterministic backward must give the same bits
// twice. Each case prints what ran: cuDNN's version, the engine, the plan's build time and workspace, the errors.
// Label gpu: skips without a device (fails under SHARDTRAIN_REQUIRE_GPU=1), and says so where cuDNN is absent.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.cuh"
#include "kernels/data_error.cuh"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "src/ops/cuda/cudnn_attention.hpp"
#include "tests/common/gpu_required.hpp"

namespace shardtrain::ops::cuda {
namespace {

struct Case {
  int64_t b, s, h, hkv, dh;
  SdpaMasking masking;
};

std::string name(const Case& c) {
  return fmt::format("B={} S={} H={}/{} Dh={} {}", c.b, c.s, c.h, c.hkv, c.dh,
                     c.masking == SdpaMasking::Causal ? "causal" : "documents");
}

// (B, S) segments: causal all 0; documents of varied lengths (a 64-token one crossing tiles in row 1), ids
// counted up and never reused, and the last fifth of each row padding (-1).
std::vector<int32_t> make_segments(const Case& c, int64_t* runs) {
  std::vector<int32_t> seg(static_cast<size_t>(c.b * c.s), 0);
  *runs = c.b;
  if (c.masking == SdpaMasking::Causal) return seg;
  const int64_t lengths[] = {1, 7, 20, 3, 50, 64, 2, 33};
  int32_t next_id = 0;
  *runs = 0;
  for (int64_t r = 0; r < c.b; ++r) {
    const int64_t real = c.s - c.s / 5;
    int64_t t = 0, i = r;
    while (t < real) {
      const int64_t len = lengths[i++ % 8];
      const int32_t id = next_id++;
      ++*runs;
      for (int64_t j = 0; j < len && t < real; ++j, ++t) seg[static_cast<size_t>(r * c.s + t)] = id;
    }
    for (; t < c.s; ++t) seg[static_cast<size_t>(r * c.s + t)] = -1;
  }
  return seg;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> x(n);
  for (uint16_t& v : x) v = bf16(dist(rng)).bits;
  return x;
}

struct Dev {
  DeviceBuffer buf;
  explicit Dev(size_t bytes) : buf(bytes) {}
  template <typename T>
  Dev(const std::vector<T>& host, StreamRef s) : buf(host.size() * sizeof(T)) {
    copy_async(buf.data(), host.data(), buf.size(), s);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(buf.data());
  }
  void poison(StreamRef s) const {  // 0xFF bytes: NaN in bf16 and fp32
    std::vector<uint8_t> ff(buf.size(), 0xff);
    copy_async(buf.data(), ff.data(), ff.size(), s);
    stream_synchronize(s);
  }
  std::vector<float> bf16_values(StreamRef s) const {
    std::vector<uint16_t> h(buf.size() / 2);
    copy_async(h.data(), buf.data(), buf.size(), s);
    stream_synchronize(s);
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = float_from_bf16_bits(h[i]);
    return out;
  }
  std::vector<float> f32_values(StreamRef s) const {
    std::vector<float> h(buf.size() / 4);
    copy_async(h.data(), buf.data(), buf.size(), s);
    stream_synchronize(s);
    return h;
  }
  std::vector<uint8_t> bytes(StreamRef s) const {
    std::vector<uint8_t> h(buf.size());
    copy_async(h.data(), buf.data(), buf.size(), s);
    stream_synchronize(s);
    return h;
  }
};

// ||got - want|| / ||want|| over the elements where want is finite; a non-finite `got` there counts as a failure.
struct Diff {
  double rel = 0;
  size_t nonfinite = 0, worst_at = 0;
  double worst = 0;
};
Diff compare(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    if (!std::isfinite(got[i])) {
      ++d.nonfinite;
      continue;
    }
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
    if (std::abs(e) > d.worst) {
      d.worst = std::abs(e);
      d.worst_at = i;
    }
  }
  d.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

constexpr double kTol = 2e-2;     // relative norm, bf16 outputs
constexpr double kLseTol = 2e-3;  // relative norm, fp32 statistics of the same bf16 inputs

void expect_close(const char* what, const std::vector<float>& got, const std::vector<float>& want, double tol) {
  const Diff d = compare(got, want);
  EXPECT_EQ(d.nonfinite, 0u) << what << ": non-finite where our kernels' result is finite (first unwritten?)";
  EXPECT_LE(d.rel, tol) << what << ": relative error " << d.rel << ", worst at " << d.worst_at << " (cuDNN "
                        << got[d.worst_at] << ", ours " << want[d.worst_at] << ")";
  std::printf("    %-4s relative error %.2e (worst |diff| %.3g at %zu)\n", what, d.rel, d.worst, d.worst_at);
}

// Rows of padding tokens (segment < 0) of a (tokens, row) tensor must be exactly zero; counts the others.
size_t nonzero_padding(const std::vector<float>& x, const std::vector<int32_t>& seg, int64_t row) {
  size_t bad = 0;
  for (size_t t = 0; t < seg.size(); ++t)
    if (seg[t] < 0)
      for (int64_t e = 0; e < row; ++e) bad += x[t * static_cast<size_t>(row) + static_cast<size_t>(e)] != 0.f;
  return bad;
}

class CudnnAttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ST_SKIP_WITHOUT_GPU("cuDNN attention GPU test");
    stream_ = std::make_unique<CudaStream>();
    attention_ = std::make_unique<CudnnAttention>();
    std::printf("%s\n", attention_->library_description().c_str());
    error_ = std::make_unique<Dev>(sizeof(kernels::DataErrorRecord));
    kernels::data_error_reset(error_->as<kernels::DataErrorRecord>(), s());
  }
  StreamRef s() const { return stream_->ref(); }
  kernels::DataErrorRecord read_error() {
    kernels::DataErrorRecord r;
    copy_async(&r, error_->buf.data(), sizeof r, s());
    stream_synchronize(s());
    return r;
  }
  // Skips the test with cuDNN's reason where it cannot run a call at all (no cuDNN, an old one, no engine).
  bool runnable(const SdpaCall& call) {
    const std::string why = attention_->unsupported_reason(call, DType::BF16);
    if (why.empty()) return true;
    std::printf("  cuDNN cannot run %s: %s\n", describe_call(call).c_str(), why.c_str());
    return false;
  }
  void print_plan(const SdpaCall& call) {
    if (const SdpaPlanInfo* info = attention_->plan_info(call))
      std::printf("  %-58s %s; plan built in %.0f ms; workspace %zu B (cuDNN's %lld B)%s%s\n", describe_call(call).c_str(),
                  info->engine.c_str(), info->build_ms, info->workspace_bytes,
                  static_cast<long long>(info->cudnn_workspace_bytes), info->padding_mask ? "; sequence lengths" : "",
                  info->ragged ? (info->ragged_intermediates ? "; packed, token-sized scratch" : "; packed") : "");
  }

  void run_case(const Case& c);
  void run_all(SdpaMasking masking);

  std::unique_ptr<CudaStream> stream_;
  std::unique_ptr<CudnnAttention> attention_;
  std::unique_ptr<Dev> error_;
};

void CudnnAttentionGpu::run_case(const Case& c) {
  SCOPED_TRACE(name(c));
  std::printf("case %s\n", name(c).c_str());
  std::mt19937_64 rng(static_cast<uint64_t>(c.s * 7919 + c.h * 131 + c.hkv * 17 + c.dh));
  const size_t nq = static_cast<size_t>(c.b * c.s * c.h * c.dh), nkv = static_cast<size_t>(c.b * c.s * c.hkv * c.dh);
  const size_t nlse = static_cast<size_t>(c.b * c.h * c.s);
  int64_t runs = 0;
  const std::vector<int32_t> seg = make_segments(c, &runs);
  const bool docs = c.masking == SdpaMasking::Documents;
  Dev q(random_bf16(nq, rng), s()), k(random_bf16(nkv, rng), s()), v(random_bf16(nkv, rng), s());
  Dev dout(random_bf16(nq, rng), s()), segd(seg, s());
  const int32_t* segp = docs ? segd.as<int32_t>() : nullptr;

  SdpaCall fwd;
  fwd.batch = c.b;
  fwd.seq = c.s;
  fwd.heads = c.h;
  fwd.kv_heads = c.hkv;
  fwd.head_dim = c.dh;
  fwd.masking = c.masking;
  fwd.max_sequences = docs ? runs : 0;
  fwd.direction = SdpaDirection::Forward;
  if (!runnable(fwd)) {
    // On a GPU session plain causal attention must run (packed documents may be refused: older cuDNN, Ampere).
    if (test_env::gpu_required() && !docs) ADD_FAILURE() << "cuDNN cannot run " << describe_call(fwd);
    return;
  }
  // Ours: the reference.
  const kernels::AttentionDims d{c.b, c.s, c.h, c.hkv, c.dh};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
  Dev out_ref(nq * 2), lse_ref(nlse * 4), dq_ref(nq * 2), dk_ref(nkv * 2), dv_ref(nkv * 2);
  Dev work_ref(kernels::attention_backward_workspace_bytes(d));
  kernels::attention_forward(DType::BF16, d, q.buf.data(), k.buf.data(), v.buf.data(), segp, scale, out_ref.buf.data(),
                             lse_ref.as<float>(), s());
  kernels::attention_backward(DType::BF16, d, q.buf.data(), k.buf.data(), v.buf.data(), out_ref.buf.data(),
                              lse_ref.as<float>(), dout.buf.data(), segp, scale, dq_ref.buf.data(), dk_ref.buf.data(),
                              dv_ref.buf.data(), work_ref.buf.data(), s());
  const std::vector<float> want_out = out_ref.bf16_values(s()), want_lse = lse_ref.f32_values(s());
  const std::vector<float> want_dq = dq_ref.bf16_values(s()), want_dk = dk_ref.bf16_values(s()),
                           want_dv = dv_ref.bf16_values(s());

  print_plan(fwd);
  Dev out(nq * 2), lse(nlse * 4);
  out.poison(s());
  lse.poison(s());
  Dev ws_fwd(std::max<size_t>(attention_->workspace_bytes(fwd), 1));
  attention_->forward(fwd,
                      SdpaForwardTensors{q.buf.data(), k.buf.data(), v.buf.data(), segp, out.buf.data(), lse.as<float>()},
                      ws_fwd.buf.data(), ws_fwd.buf.size(), error_->as<kernels::DataErrorRecord>(), s());
  const std::vector<float> got_out = out.bf16_values(s()), got_lse = lse.f32_values(s());
  expect_close("out", got_out, want_out, kTol);
  expect_close("lse", got_lse, want_lse, kLseTol);
  size_t lse_mismatch = 0;  // -inf exactly where ours is (padding rows), finite elsewhere
  for (size_t i = 0; i < nlse; ++i)
    lse_mismatch += std::isinf(want_lse[i]) != std::isinf(got_lse[i]) || std::isnan(got_lse[i]);
  EXPECT_EQ(lse_mismatch, 0u) << "lse: -inf rows differ from ours, or NaN";
  EXPECT_EQ(nonzero_padding(got_out, seg, c.h * c.dh), 0u) << "out: padding rows not zero";

  // The backward on our forward's out and lse, both variants; the deterministic one twice.
  for (bool deterministic : {false, true}) {
    SdpaCall bwd = fwd;
    bwd.direction = SdpaDirection::Backward;
    bwd.deterministic = deterministic;
    if (!runnable(bwd)) {
      if (test_env::gpu_required() && !docs && !deterministic) ADD_FAILURE() << "cuDNN cannot run " << describe_call(bwd);
      continue;
    }
    print_plan(bwd);
    Dev ws(std::max<size_t>(attention_->workspace_bytes(bwd), 1));
    std::vector<uint8_t> first[3];
    for (int run = 0; run < 2; ++run) {
      Dev dq(nq * 2), dk(nkv * 2), dv(nkv * 2);
      dq.poison(s());
      dk.poison(s());
      dv.poison(s());
      attention_->backward(
          bwd,
          SdpaBackwardTensors{q.buf.data(), k.buf.data(), v.buf.data(), out_ref.buf.data(), lse_ref.as<float>(),
                              dout.buf.data(), segp, dq.buf.data(), dk.buf.data(), dv.buf.data()},
          ws.buf.data(), ws.buf.size(), error_->as<kernels::DataErrorRecord>(), s());
      const std::vector<uint8_t> now[3] = {dq.bytes(s()), dk.bytes(s()), dv.bytes(s())};
      if (run == 0) {
        const std::vector<float> got_dq = dq.bf16_values(s()), got_dk = dk.bf16_values(s()), got_dv = dv.bf16_values(s());
        expect_close("dq", got_dq, want_dq, kTol);
        expect_close("dk", got_dk, want_dk, kTol);
        expect_close("dv", got_dv, want_dv, kTol);
        EXPECT_EQ(nonzero_padding(got_dq, seg, c.h * c.dh), 0u) << "dq: padding rows not zero";
        EXPECT_EQ(nonzero_padding(got_dk, seg, c.hkv * c.dh), 0u) << "dk: padding rows not zero";
        EXPECT_EQ(nonzero_padding(got_dv, seg, c.hkv * c.dh), 0u) << "dv: padding rows not zero";
        for (int i = 0; i < 3; ++i) first[i] = now[i];
      } else {
        const bool same = now[0] == first[0] && now[1] == first[1] && now[2] == first[2];
        std::printf("    %s backward: two runs %s\n", deterministic ? "deterministic" : "default",
                    same ? "bit-identical" : "differ");
        if (deterministic) {
          EXPECT_TRUE(same) << "the deterministic backward differs between two runs";
        }
      }
    }
  }
  const kernels::DataErrorRecord e = read_error();
  EXPECT_EQ(e.code, 0) << "data error recorded: code " << e.code << " value " << e.value << " index " << e.index;
}

void CudnnAttentionGpu::run_all(SdpaMasking masking) {
  if (const std::string why = attention_->unavailable_reason(); !why.empty()) {
    if (test_env::gpu_required()) FAIL() << "cuDNN is not usable: " << why;
    GTEST_SKIP() << "cuDNN is not usable (" << why << "): cuDNN attention test skipped";
  }
  for (int64_t s : {45, 130, 512})
    for (int64_t dh : {64, 128})
      for (auto [h, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {8, 8}}) {
        run_case(Case{2, s, h, hkv, dh, masking});
        if (HasFailure()) return;  // one failing case is enough to read
      }
}

// Plain causal first and packed documents apart, so that a failure of one leaves the other's results to read.
TEST_F(CudnnAttentionGpu, CausalMatchesOurKernels) { run_all(SdpaMasking::Causal); }
TEST_F(CudnnAttentionGpu, DocumentsMatchOurKernels) { run_all(SdpaMasking::Documents); }

// A document in two runs of one row: recorded as a data error by the sequence kernel the cuDNN forward queues.
TEST_F(CudnnAttentionGpu, SplitDocumentIsADataError) {
  const Case c{1, 64, 4, 4, 64, SdpaMasking::Documents};
  std::vector<int32_t> seg(64, 0);
  for (int t = 20; t < 40; ++t) seg[static_cast<size_t>(t)] = 1;  // 0 ... 1 ... 0 again
  SdpaCall fwd;
  fwd.batch = c.b;
  fwd.seq = c.s;
  fwd.heads = c.h;
  fwd.kv_heads = c.hkv;
  fwd.head_dim = c.dh;
  fwd.masking = c.masking;
  fwd.max_sequences = 3;
  if (!runnable(fwd)) GTEST_SKIP() << "cuDNN cannot run the case";
  std::mt19937_64 rng(3);
  const size_t n = 64 * 4 * 64;
  Dev q(random_bf16(n, rng), s()), k(random_bf16(n, rng), s()), v(random_bf16(n, rng), s()), segd(seg, s());
  Dev out(n * 2), lse(4 * 64 * 4), ws(std::max<size_t>(attention_->workspace_bytes(fwd), 1));
  attention_->forward(
      fwd, SdpaForwardTensors{q.buf.data(), k.buf.data(), v.buf.data(), segd.as<int32_t>(), out.buf.data(), lse.as<float>()},
      ws.buf.data(), ws.buf.size(), error_->as<kernels::DataErrorRecord>(), s());
  const kernels::DataErrorRecord e = read_error();
  EXPECT_EQ(e.code, static_cast<int32_t>(kernels::DataErrorCode::DocumentSplit));
  EXPECT_EQ(e.value, 0);
  EXPECT_EQ(e.index, 40);
}

// Calls cuDNN cannot take say why, whatever the device.
TEST_F(CudnnAttentionGpu, ReasonsForCallsItCannotRun) {
  if (const std::string why = attention_->unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  SdpaCall c;
  c.batch = 2;
  c.seq = 64;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 64;
  EXPECT_NE(attention_->unsupported_reason(c, DType::F32), "");
  c.head_dim = 60;
  EXPECT_NE(attention_->unsupported_reason(c, DType::BF16).find("head dim 60"), std::string::npos);
}

}  // namespace
}  // namespace shardtrain::ops::cuda
