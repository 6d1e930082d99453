// `bench ops`' rows and the op call descriptions they share with the timing ops: the keys equal the recorder's before
// the move into ops/op_calls.cpp (every op, a model run in f32 and bf16, fused and separate projections, documents);
// each row's work equals the work of the calls its function makes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "src/cli/op_rows.hpp"

namespace shardtrain::cli {
namespace {

using ops::Tensor;
using ops::Transpose;

// The recorder of `bench ops` as it was before ops/op_calls.cpp (commit fe06a95, src/cli/cmd_bench_ops.cpp), the
// reference the keys must stay equal to: profiles written before then are keyed its way.
// Every call made through it, as a key per call: the op and what sets its work (dtypes, element counts, GEMM
// dimensions and transposes, whether an output accumulates), not where the tensors are or how they are shaped
// beyond that. The model's attention mask (document segments) is left out: bench ops times plain causal
// attention. No op computes anything.
class LegacyRecorder final : public ops::Ops {
 public:
  std::vector<std::string> keys;

  DeviceKind device() const override { return DeviceKind::Cpu; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
  std::unique_ptr<ops::Ops> make_side_ops() const override { return nullptr; }
  void matmul(Transpose ta, Transpose tb, double, const Tensor& a, const Tensor& b, double beta, const Tensor& c) override {
    keys.push_back("matmul " + gemm(ta, tb, a, b, c) + (beta != 0.0 ? " +=" : ""));
  }
  void matmul_add(Transpose ta, Transpose tb, double, const Tensor& a, const Tensor& b, const Tensor& c,
                  const Tensor& out) override {
    keys.push_back("matmul_add " + gemm(ta, tb, a, b, out) + " c " + t(c));
  }
  void fill(const Tensor& out, double) override { keys.push_back("fill " + t(out)); }
  void copy(const Tensor& src, const Tensor& dst) override { keys.push_back("copy " + t(src) + " " + t(dst)); }
  void add(const Tensor& x, const Tensor& y) override { keys.push_back("add " + t(x) + " " + t(y)); }
  void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    keys.push_back("embedding_forward " + t(ids) + " " + t(table) + " " + t(out));
  }
  void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override {
    keys.push_back("embedding_backward " + t(ids) + " " + t(dout) + " " + t(dtable));
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double, const Tensor& h_out,
                       const Tensor& y, const Tensor& rstd) override {
    keys.push_back("rmsnorm_forward " + t(x) + " " + t(residual) + " " + t(weight) + " " + t(h_out) + " " + t(y) + " " +
                   t(rstd));
  }
  void rmsnorm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd, const Tensor& dh_extra,
                        const Tensor& dh, const Tensor& dweight) override {
    keys.push_back("rmsnorm_backward " + t(dy) + " " + t(h) + " " + t(weight) + " " + t(rstd) + " " + t(dh_extra) + " " +
                   t(dh) + " " + t(dweight));
  }
  void rope(const Tensor& x, const Tensor& positions, const ops::RopeFrequencies&, ops::RopeDirection) override {
    keys.push_back("rope " + t(x) + " " + t(positions));
  }
  void rope_qkv_forward(const Tensor& qkv, const Tensor& positions, const ops::RopeFrequencies&, const Tensor& q,
                        const Tensor& k, const Tensor& v) override {
    keys.push_back("rope_qkv_forward " + t(qkv) + " " + t(positions) + " " + t(q) + " " + t(k) + " " + t(v));
  }
  void rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                         const ops::RopeFrequencies&, const Tensor& dqkv) override {
    keys.push_back("rope_qkv_backward " + t(dq) + " " + t(dk) + " " + t(dv) + " " + t(positions) + " " + t(dqkv));
  }
  void attention_forward(const ops::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ops::AttentionMask&, const Tensor& out, const Tensor& lse) override {
    keys.push_back("attention_forward " + shape(s) + " " + t(q) + " " + t(k) + " " + t(v) + " " + t(out) + " " + t(lse));
  }
  void attention_backward(const ops::AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, const ops::AttentionMask&, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv) override {
    keys.push_back("attention_backward " + shape(s) + " " + t(q) + " " + t(k) + " " + t(v) + " " + t(out) + " " + t(lse) +
                   " " + t(dout) + " " + t(dq) + " " + t(dk) + " " + t(dv));
  }
  void attention_segments(const Tensor& input_ids, int32_t, const Tensor& document_ids, const Tensor& segments,
                          const Tensor& positions) override {
    keys.push_back("attention_segments " + t(input_ids) + " " + t(document_ids) + " " + t(segments) + " " + t(positions));
  }
  void swiglu_forward(const Tensor& gate_up, ops::GateUpLayout layout, const Tensor& out) override {
    keys.push_back("swiglu_forward " + t(gate_up) + " " + layout_name(layout) + " " + t(out));
  }
  void swiglu_backward(const Tensor& dout, const Tensor& gate_up, ops::GateUpLayout layout,
                       const Tensor& dgate_up) override {
    keys.push_back("swiglu_backward " + t(dout) + " " + t(gate_up) + " " + layout_name(layout) + " " + t(dgate_up) +
                   (dgate_up.data == gate_up.data ? " in place" : ""));
  }
  ops::LossSums cross_entropy(const Tensor& logits, const Tensor& targets, int32_t, double, const Tensor& dlogits) override {
    keys.push_back("cross_entropy " + t(logits) + " " + t(targets) + " " + t(dlogits));
    return {};
  }
  ops::LossSums linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets, int32_t, double,
                                     int64_t chunk_tokens, const Tensor& dh, const Tensor& dweight, double) override {
    keys.push_back(fmt::format("linear_cross_entropy {} {} {} chunk {} {} {}", t(h), t(weight), t(targets), chunk_tokens,
                               t(dh), t(dweight)));
    return {};
  }
  void defer_loss(bool) override {}
  ops::LossSums take_loss() override { return {}; }
  void sum_squares(const Tensor& x, const Tensor& out, ops::SumInto) override {
    keys.push_back("sum_squares " + t(x) + " " + t(out));
  }

 private:
  static std::string t(const Tensor& x) {
    return x.defined() ? fmt::format("{}[{}]", dtype_name(x.dtype), x.numel()) : std::string("-");
  }
  static std::string shape(const ops::AttentionShape& s) {
    return fmt::format("B {} S {} H {} Hkv {} Dh {}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
  }
  static const char* layout_name(ops::GateUpLayout l) { return l == ops::GateUpLayout::Rows ? "rows" : "halves"; }
  static std::string gemm(Transpose ta, Transpose tb, const Tensor& a, const Tensor& b, const Tensor& c) {
    const int64_t m = ta == Transpose::No ? a.shape.rows() : a.shape.cols();
    const int64_t k = ta == Transpose::No ? a.shape.cols() : a.shape.rows();
    const int64_t n = tb == Transpose::No ? b.shape.cols() : b.shape.rows();
    return fmt::format("{}{} m {} n {} k {} {} {} {}", ta == Transpose::Yes ? "T" : "N", tb == Transpose::Yes ? "T" : "N", m,
                       n, k, dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(c.dtype));
  }
};

std::vector<std::string> keys_of(const std::vector<ops::OpCall>& calls) {
  std::vector<std::string> keys;
  for (const ops::OpCall& c : calls) keys.push_back(c.key);
  return keys;
}

// One forward_backward of a small model through `ops` (nothing computed).
void run_model(ops::Ops& ops, DType dt, model::ProjectionFusion fusion, bool documents) {
  model::LlamaConfig c;
  c.num_hidden_layers = 2, c.hidden_size = 64, c.num_attention_heads = 4, c.num_key_value_heads = 2;
  c.intermediate_size = 96, c.vocab_size = 50, c.max_position_embeddings = 64;
  model::LlamaModel m(c, ops, model::ModelOptions{.activation_dtype = dt, .projection_fusion = fusion});
  model::DenseParams params(m.spec(), dt, DType::F32);
  params.bind(m.binding());
  const int64_t B = 2, S = 12;
  std::vector<int32_t> ids(B * S, 1), targets(B * S, 2), docs(B * S, 0);
  for (int64_t i = 0; i < B * S; ++i) docs[static_cast<size_t>(i)] = static_cast<int32_t>(i % S >= 5);
  model::Batch batch;
  batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {B, S});
  batch.targets = ops::make_tensor(targets.data(), DType::I32, {B, S});
  if (documents) {
    batch.document_ids = ops::make_tensor(docs.data(), DType::I32, {B, S});
    batch.document_runs = 2 * B;
  }
  m.forward_backward(batch, model::StepOptions{.loss_scale = 1.0});
}

TEST(OpCalls, ModelKeysAreTheOldRecordersKeys) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (model::ProjectionFusion fusion : {model::ProjectionFusion::WhereAdjacent, model::ProjectionFusion::Never}) {
      for (bool documents : {false, true}) {
        LegacyRecorder legacy;
        CallRecorder now;
        run_model(legacy, dt, fusion, documents);
        run_model(now, dt, fusion, documents);
        ASSERT_GT(legacy.keys.size(), 40u);
        EXPECT_EQ(keys_of(now.calls), legacy.keys)
            << dtype_name(dt) << " fusion " << static_cast<int>(fusion) << " documents " << documents;
      }
    }
  }
}

// The ops no model step calls, each through both recorders.
TEST(OpCalls, EveryOpKeysAsBefore) {
  std::vector<float> a(64), b(64), c(64);
  std::vector<int32_t> ids(8, 1);
  const Tensor x = ops::make_tensor(a.data(), DType::F32, {8, 8}), y = ops::make_tensor(b.data(), DType::F32, {8, 8});
  const Tensor h = ops::make_tensor(c.data(), DType::BF16, {4, 8}), pos = ops::make_tensor(ids.data(), DType::I32, {8});
  const Tensor sq = ops::make_tensor(c.data(), DType::F64, {1}), hb = ops::make_tensor(c.data(), DType::BF16, {8, 8});
  auto all = [&](ops::Ops& o) {
    o.fill(x, 0);
    o.copy(x, hb);
    o.add(x, y);
    o.rope(x.reshaped({8, 1, 8}), pos, ops::RopeFrequencies{}, ops::RopeDirection::Forward);
    o.cross_entropy(x, pos, -100, 1.0, y);
    o.cross_entropy(x, pos, -100, 1.0, {});
    o.sum_squares(x, sq, ops::SumInto::Accumulate);
    o.matmul(Transpose::Yes, Transpose::No, 1.0, x, y, 1.0, y);
    o.matmul_add(Transpose::No, Transpose::Yes, 1.0, x, y, y, y);
    o.swiglu_forward(x, ops::GateUpLayout::Halves, h);
    o.swiglu_backward(h, x, ops::GateUpLayout::Halves, y);
    o.swiglu_backward(h, x, ops::GateUpLayout::Rows, x);
  };
  LegacyRecorder legacy;
  CallRecorder now;
  all(legacy);
  all(now);
  EXPECT_EQ(keys_of(now.calls), legacy.keys);
  ASSERT_EQ(now.calls.size(), 12u);
  EXPECT_EQ(now.calls[7].key, "matmul TN m 8 n 8 k 8 f32 f32 f32 +=");
  EXPECT_EQ(now.calls[10].key, "swiglu_backward bf16[32] f32[64] halves f32[64]");
  EXPECT_EQ(now.calls[11].key, "swiglu_backward bf16[32] f32[64] rows f32[64] in place");
  // Work: add reads x and reads + writes y; the accumulated GEMM reads a, b and c and writes c.
  EXPECT_EQ(now.calls[2].bytes, 256.0 + 2 * 256.0);
  EXPECT_EQ(now.calls[7].flops, 2.0 * 8 * 8 * 8);
  EXPECT_EQ(now.calls[7].bytes, 256.0 * 4);
  EXPECT_EQ(now.calls[6].bytes, 256.0 + 16.0);      // sum_squares: x, and the accumulated double read + written
  EXPECT_EQ(now.calls[3].bytes, 2 * 256.0 + 32.0);  // rope in place, positions
  EXPECT_EQ(now.calls[7].shape, "8x8x8");
}

// Each row's work (FLOPs or bytes, as `bench ops` states it) is the work of the calls its function makes, and every
// row of a model step makes at least one call.
TEST(OpRows, RowWorkIsTheWorkOfItsCalls) {
  for (DType dt : {DType::F32, DType::BF16}) {
    BenchShape s;
    s.model.num_hidden_layers = 3, s.model.hidden_size = 96, s.model.num_attention_heads = 6;
    s.model.num_key_value_heads = 2, s.model.intermediate_size = 160, s.model.vocab_size = 300;
    s.batch = 3, s.seq = 20;
    const std::vector<RecordedRow> rows = record_rows(s, dt, DeviceKind::Cpu);
    ASSERT_EQ(rows.size(), 29u);
    for (const RecordedRow& r : rows) {
      ASSERT_FALSE(r.calls.empty()) << r.row.op;
      double work = 0;
      for (const ops::OpCall& c : r.calls) work += r.row.kind == WorkKind::Flops ? c.flops : c.bytes;
      EXPECT_DOUBLE_EQ(work, r.row.work) << r.row.op << " " << dtype_name(dt);
    }
    EXPECT_EQ(rows[0].row.op, "qkv_proj fwd");
    EXPECT_EQ(rows[0].calls.at(0).key,
              fmt::format("matmul NT m 60 n 160 k 96 {0} {0} {0}", dtype_name(dt)));  // n: (H + 2 Hkv) Dh
  }
}

}  // namespace
}  // namespace shardtrain::cli
