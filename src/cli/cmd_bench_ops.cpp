// `shardtrain bench ops`: every op a Llama training step runs, timed alone at the model's shapes on the
// current backend (CudaOps on a GPU, the CPU backend otherwise), against two ceilings measured in the same
// process: a large matmul (FLOP/s) and a large copy (bytes read + written per second).
//
// Work counted (N = batch * seq tokens, D hidden, H heads, Hkv KV heads, Dh head dim, F intermediate, V vocab):
//   GEMMs: 2 * M * N * K per call (a linear y = x W^T, its dx = dy W and its dW += dy^T x).
//   attention: forward 4 * B * H * S^2 * Dh / 2 (q k^T and p v, causal: half of the full S x S), backward
//     twice the forward (dv, dp, dq, dk; the recompute of p is not counted).
//   linear_cross_entropy: 2 * N * D * V for the logits, twice more with the gradient (dh and dW).
//   memory-bound ops: the bytes of every tensor argument read once and written once (an accumulated output
//     is read and written), at its dtype; nothing for caches or re-reads.
// Each row's calls per micro-batch are what the model's forward_backward runs (no checkpointing, q/k/v and
// gate/up fused as their adjacent parameters allow: decoder_layer.cpp); --check-calls runs the model once through
// a recorder of op calls and fails unless every row's count is the model's.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cmd_bench.hpp"
#include "shardtrain/model/config.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timer.hpp"
#include "shardtrain/train/config_io.hpp"

namespace shardtrain::cli {
namespace {

using ops::OpsBuffer;
using ops::Shape;
using ops::Tensor;
using ops::Transpose;

struct BenchOpsOptions {
  std::string config;
  int64_t layers = 0, hidden = 0, seq = 0, batch = 0, heads = 0, kv_heads = 0, vocab = 0, intermediate = 0;
  int ranks = 1;
  std::string dtype;  // "" = bf16 on CUDA, f32 on the CPU
  int iters = 20, warmup = 3, threads = 0;
  std::string json;
  bool check_calls = false;
};

enum class WorkKind { Flops, Bytes };

struct OpRow {
  std::string op;
  std::string shapes;
  WorkKind kind = WorkKind::Flops;
  double work = 0;     // FLOPs or bytes per call
  double seconds = 0;  // median per call
  int64_t calls = 0;   // per micro-batch forward+backward of the whole model (0: not part of it)
  double rate() const { return work / seconds; }
};

// The model and micro-batch the ops are timed at: the config's, then explicit options over it.
struct BenchShape {
  model::LlamaConfig model;
  int64_t batch = 0, seq = 0;
  std::string source;
};

BenchShape resolve_shape(const BenchOpsOptions& o) {
  BenchShape s;
  if (!o.config.empty()) {
    const train::TrainConfig c = train::load_train_config(o.config);
    s.model = c.model;
    s.seq = c.data.seq_len;
    s.batch = c.micro_batch_size_for(o.ranks);
    if (s.batch < 1)
      throw ConfigError(fmt::format("{}: data.global_batch_size {} gives no micro-batch for --ranks {}", o.config,
                                    c.data.global_batch_size, o.ranks));
    s.source = o.config;
  } else {  // `bench model`'s defaults
    s.model.num_hidden_layers = 4, s.model.hidden_size = 256, s.model.num_attention_heads = 4,
    s.model.num_key_value_heads = 4;
    s.model.intermediate_size = 1024, s.model.vocab_size = 32000;
    s.seq = 256, s.batch = 4;
    s.source = "options";
  }
  auto over = [](int64_t v, auto& field) {
    if (v > 0) field = v;
  };
  over(o.layers, s.model.num_hidden_layers);
  over(o.hidden, s.model.hidden_size);
  over(o.heads, s.model.num_attention_heads);
  over(o.kv_heads, s.model.num_key_value_heads);
  over(o.vocab, s.model.vocab_size);
  over(o.seq, s.seq);
  over(o.batch, s.batch);
  if (o.intermediate > 0) s.model.intermediate_size = o.intermediate;
  else if (o.hidden > 0 && o.config.empty()) s.model.intermediate_size = 4 * o.hidden;
  if (o.heads > 0 && o.kv_heads == 0 && o.config.empty()) s.model.num_key_value_heads = o.heads;
  s.model.max_position_embeddings = std::max<int64_t>(s.model.max_position_embeddings, s.seq);
  s.model.validate();
  return s;
}

// Every call made through it, as a key per call: the op and what sets its work (dtypes, element counts, GEMM
// dimensions and transposes, whether an output accumulates), not where the tensors are or how they are shaped
// beyond that. The model's attention mask (document segments) is left out: bench ops times plain causal
// attention. No op computes anything.
class CallRecorder final : public ops::Ops {
 public:
  std::vector<std::string> keys;

  DeviceKind device() const override { return DeviceKind::Cpu; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
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
                                     int64_t chunk_tokens, const Tensor& dh, const Tensor& dweight) override {
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

// Times ops on one backend: each op's tensors are allocated on the device, filled, timed and freed. With a
// CallRecorder as the ops (record mode), each timed function is called once instead, and the calls it made are
// kept, one list per time() call, in order.
class OpsBench {
 public:
  OpsBench(ops::Ops& ops, StreamRef stream, int warmup, int iters)
      : ops_(ops), stream_(stream), warmup_(warmup), iters_(iters) {}
  explicit OpsBench(CallRecorder& recorder) : ops_(recorder), recorder_(&recorder) {}

  Tensor tensor(DType dtype, Shape shape, double scale = 1.0) {
    buffers_.emplace_back(ops_.device(), std::max<size_t>(1, static_cast<size_t>(shape.numel()) * dtype_size(dtype)));
    const Tensor t = buffers_.back().view(dtype, shape);
    ops::fill_uniform(t, ++seed_, scale, stream_);
    return t;
  }
  void release() { buffers_.clear(); }

  double time(const std::function<void()>& fn) {
    if (!recorder_) return median_call_seconds(ops_.device(), stream_, warmup_, iters_, fn);
    recorder_->keys.clear();
    fn();
    recorded_.push_back(recorder_->keys);
    return 1.0;
  }

  ops::Ops& ops() { return ops_; }
  const std::vector<std::vector<std::string>>& recorded() const { return recorded_; }

 private:
  ops::Ops& ops_;
  CallRecorder* recorder_ = nullptr;
  std::vector<std::vector<std::string>> recorded_;
  StreamRef stream_;
  int warmup_ = 0, iters_ = 1;
  uint64_t seed_ = 0;
  std::vector<OpsBuffer> buffers_;
};

enum class Residual { None, InGemm };  // the forward adds a residual in the GEMM (matmul_add: down_proj's)

// The rows of one linear layer (in -> out features): forward, dx and dW, at the model's dtypes (activations
// and weight in `dt`, the gradient in f32 as the FSDP engine keeps it).
void linear_rows(OpsBench& b, std::vector<OpRow>& rows, const std::string& name, int64_t n, int64_t in, int64_t out,
                 int64_t calls, DType dt, Residual residual = Residual::None) {
  const Tensor x = b.tensor(dt, {n, in}), w = b.tensor(dt, {out, in}, 0.02), y = b.tensor(dt, {n, out});
  const Tensor dy = b.tensor(dt, {n, out}), dx = b.tensor(dt, {n, in}), dw = b.tensor(DType::F32, {out, in}, 0.0);
  const Tensor r = residual == Residual::InGemm ? b.tensor(dt, {n, out}) : Tensor{};
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(in) * static_cast<double>(out);
  auto& o = b.ops();
  if (residual == Residual::InGemm) {
    rows.push_back({name + " fwd", fmt::format("r + x ({}, {}) W^T ({}, {})", n, in, out, in), WorkKind::Flops, flops,
                    b.time([&] { o.matmul_add(Transpose::No, Transpose::Yes, 1.0, x, w, r, y); }), calls});
  } else {
    rows.push_back({name + " fwd", fmt::format("x ({}, {}) W^T ({}, {})", n, in, out, in), WorkKind::Flops, flops,
                    b.time([&] { o.matmul(Transpose::No, Transpose::Yes, 1.0, x, w, 0.0, y); }), calls});
  }
  rows.push_back({name + " bwd dx", fmt::format("dy ({}, {}) W ({}, {})", n, out, out, in), WorkKind::Flops, flops,
                  b.time([&] { o.matmul(Transpose::No, Transpose::No, 1.0, dy, w, 0.0, dx); }), calls});
  rows.push_back({name + " bwd dW", fmt::format("dy^T ({}, {}) x ({}, {}) += f32", out, n, n, in), WorkKind::Flops, flops,
                  b.time([&] { o.matmul(Transpose::Yes, Transpose::No, 1.0, dy, x, 1.0, dw); }), calls});
  b.release();
}

std::vector<OpRow> run_rows(OpsBench& b, const BenchShape& s, DType dt) {
  const model::LlamaConfig& c = s.model;
  const int64_t B = s.batch, S = s.seq, N = B * S, D = c.hidden_size, H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t Dh = c.head_dim(), KV = c.kv_dim(), F = c.intermediate_size, V = c.vocab_size, L = c.num_hidden_layers;
  const double e = static_cast<double>(dtype_size(dt)), nd = static_cast<double>(N * D), nf = static_cast<double>(N * F);
  auto& o = b.ops();
  std::vector<OpRow> rows;

  // q, k, v as one GEMM with [Wq; Wk; Wv] and gate, up as one with [Wg; Wu], as the model runs them
  const int64_t QKV = (H + 2 * Hkv) * Dh;
  linear_rows(b, rows, "qkv_proj", N, D, QKV, L, dt);
  linear_rows(b, rows, "o_proj", N, H * Dh, D, L, dt);
  linear_rows(b, rows, "gate_up_proj", N, D, 2 * F, L, dt);
  linear_rows(b, rows, "down_proj", N, F, D, L, dt, Residual::InGemm);

  {  // attention, plain causal (no document segments)
    const ops::AttentionShape as{B, S, H, Hkv, Dh};
    const Tensor q = b.tensor(dt, {B, S, H, Dh}), k = b.tensor(dt, {B, S, Hkv, Dh}), v = b.tensor(dt, {B, S, Hkv, Dh});
    const Tensor out = b.tensor(dt, {B, S, H, Dh}), lse = b.tensor(DType::F32, {B, H, S}),
                 dout = b.tensor(dt, {B, S, H, Dh});
    const Tensor dq = b.tensor(dt, {B, S, H, Dh}), dk = b.tensor(dt, {B, S, Hkv, Dh}), dv = b.tensor(dt, {B, S, Hkv, Dh});
    const double fwd =
        2.0 * static_cast<double>(B * H) * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(Dh);
    const std::string shapes = fmt::format("B {} S {} H {} Hkv {} Dh {}, causal", B, S, H, Hkv, Dh);
    rows.push_back(
        {"attention fwd", shapes, WorkKind::Flops, fwd, b.time([&] { o.attention_forward(as, q, k, v, {}, out, lse); }), L});
    rows.push_back({"attention bwd", shapes, WorkKind::Flops, 2 * fwd,
                    b.time([&] { o.attention_backward(as, q, k, v, out, lse, dout, {}, dq, dk, dv); }), L});
#if SHARDTRAIN_WITH_CUDA
    if (dt == DType::BF16 && o.device() == DeviceKind::Cuda && !ops::CudaOps::fma_attention()) {
      // The fp32-FMA kernels beside the tensor-core ones, for the record (not part of the step).
      ops::CudaOps::use_fma_attention(true);
      rows.push_back({"attention fwd (FMA kernels)", shapes, WorkKind::Flops, fwd,
                      b.time([&] { o.attention_forward(as, q, k, v, {}, out, lse); }), 0});
      rows.push_back({"attention bwd (FMA kernels)", shapes, WorkKind::Flops, 2 * fwd,
                      b.time([&] { o.attention_backward(as, q, k, v, out, lse, dout, {}, dq, dk, dv); }), 0});
      ops::CudaOps::use_fma_attention(false);
    }
#endif
    b.release();
  }
  {  // RMSNorm: weight in the parameter dtype, rstd f32, dweight f32 (accumulated)
    const Tensor x = b.tensor(dt, {N, D}), res = b.tensor(dt, {N, D}), w = b.tensor(dt, {D}), h = b.tensor(dt, {N, D});
    const Tensor y = b.tensor(dt, {N, D}), rstd = b.tensor(DType::F32, {N}), dy = b.tensor(dt, {N, D});
    const Tensor dh = b.tensor(dt, {N, D}), dw = b.tensor(DType::F32, {D}, 0.0);
    const double eps = c.rms_norm_eps, small = static_cast<double>(D) * e + 4.0 * static_cast<double>(N);
    const std::string shapes = fmt::format("({}, {})", N, D);
    rows.push_back({"rmsnorm fwd", shapes, WorkKind::Bytes, 2 * nd * e + small,
                    b.time([&] { o.rmsnorm_forward(x, {}, w, eps, {}, y, rstd); }), L + 1});
    rows.push_back({"rmsnorm fwd +residual", shapes, WorkKind::Bytes, 4 * nd * e + small,
                    b.time([&] { o.rmsnorm_forward(x, res, w, eps, h, y, rstd); }), L});
    // 2L calls with dh_extra (the residual stream); the final norm's without it
    rows.push_back({"rmsnorm bwd +dh_extra", shapes, WorkKind::Bytes, 4 * nd * e + small + 8.0 * static_cast<double>(D),
                    b.time([&] { o.rmsnorm_backward(dy, h, w, rstd, res, dh, dw); }), 2 * L});
    rows.push_back({"rmsnorm bwd", shapes, WorkKind::Bytes, 3 * nd * e + small + 8.0 * static_cast<double>(D),
                    b.time([&] { o.rmsnorm_backward(dy, h, w, rstd, {}, dh, dw); }), 1});
    b.release();
  }
  {  // RoPE of q and k fused with the split of the qkv projection (forward), and its transpose into dqkv (backward)
    const Tensor qkv = b.tensor(dt, {N, QKV}), q = b.tensor(dt, {N, H, Dh}), k = b.tensor(dt, {N, Hkv, Dh});
    const Tensor v = b.tensor(dt, {N, Hkv, Dh}), pos = b.tensor(DType::I32, {N}, static_cast<double>(S));
    const std::string shapes = fmt::format("({}, {}) <-> q k v, H {} Hkv {} Dh {}", N, QKV, H, Hkv, Dh);
    const double bytes = 2.0 * static_cast<double>(N * QKV) * e + 4.0 * static_cast<double>(N);
    rows.push_back({"rope_qkv fwd", shapes, WorkKind::Bytes, bytes,
                    b.time([&] { o.rope_qkv_forward(qkv, pos, c.rope_frequencies(), q, k, v); }), L});
    rows.push_back({"rope_qkv bwd", shapes, WorkKind::Bytes, bytes,
                    b.time([&] { o.rope_qkv_backward(q, k, v, pos, c.rope_frequencies(), qkv); }), L});
    b.release();
  }
  {  // SwiGLU on the (N, 2F) rows of the gate_up GEMM; the backward writes the gradients over gate_up, as the model
    const Tensor gate_up = b.tensor(dt, {N, 2 * F}), out = b.tensor(dt, {N, F}), dout = b.tensor(dt, {N, F});
    const std::string shapes = fmt::format("({}, {}) -> ({}, {})", N, 2 * F, N, F);
    const ops::GateUpLayout rows_layout = ops::GateUpLayout::Rows;
    rows.push_back({"swiglu fwd", shapes, WorkKind::Bytes, 3 * nf * e,
                    b.time([&] { o.swiglu_forward(gate_up, rows_layout, out); }), L});
    rows.push_back({"swiglu bwd", shapes, WorkKind::Bytes, 5 * nf * e,
                    b.time([&] { o.swiglu_backward(dout, gate_up, rows_layout, gate_up); }), L});
    b.release();
  }
  {  // embedding: table in the parameter dtype, its gradient f32 (each of the N rows read and written)
    const Tensor ids = b.tensor(DType::I32, {N}, static_cast<double>(V)), table = b.tensor(dt, {V, D}, 0.02);
    const Tensor out = b.tensor(dt, {N, D}), dout = b.tensor(dt, {N, D}), dtable = b.tensor(DType::F32, {V, D}, 0.0);
    const std::string shapes = fmt::format("ids ({}) table ({}, {})", N, V, D);
    rows.push_back({"embedding fwd", shapes, WorkKind::Bytes, 2 * nd * e + 4.0 * N,
                    b.time([&] { o.embedding_forward(ids, table, out); }), 1});
    rows.push_back({"embedding bwd", shapes, WorkKind::Bytes, nd * e + 8 * nd + 4.0 * N,
                    b.time([&] { o.embedding_backward(ids, dout, dtable); }), 1});
    b.release();
  }
  {  // segments and positions from the batch's ids (no documents, no padding)
    const Tensor ids = b.tensor(DType::I32, {B, S}, static_cast<double>(V));
    const Tensor seg = b.tensor(DType::I32, {B, S}, 1.0), pos = b.tensor(DType::I32, {B, S}, 1.0);
    rows.push_back({"attention_segments", fmt::format("ids ({}, {})", B, S), WorkKind::Bytes, 12.0 * static_cast<double>(N),
                    b.time([&] { o.attention_segments(ids, -1, {}, seg, pos); }), 1});
    b.release();
  }
  {  // lm_head fused with the loss (chunks as the model runs it: chunk_tokens 0 = the backend's default)
    const Tensor h = b.tensor(dt, {N, D}), w = b.tensor(dt, {V, D}, 0.02),
                 tgt = b.tensor(DType::I32, {N}, static_cast<double>(V));
    const Tensor dh = b.tensor(dt, {N, D}), dw = b.tensor(DType::F32, {V, D}, 0.0);
    const double fwd = 2.0 * nd * static_cast<double>(V), scale = 1.0 / static_cast<double>(N);
    const std::string shapes = fmt::format("h ({}, {}) W ({}, {})", N, D, V, D);
    rows.push_back({"linear_cross_entropy fwd+bwd", shapes, WorkKind::Flops, 3 * fwd,
                    b.time([&] { o.linear_cross_entropy(h, w, tgt, -100, scale, 0, dh, dw); }), 1});
    rows.push_back({"linear_cross_entropy loss only", shapes, WorkKind::Flops, fwd,
                    b.time([&] { o.linear_cross_entropy(h, w, tgt, -100, scale, 0, {}, {}); }), 0});
    b.release();
  }
  {  // copy of an (N, D) activation (none in the step since down_proj's GEMM adds the residual: for the record);
     // cast: FSDP's f32 -> bf16 of one decoder layer's parameters (the engine's, not the model's)
    const int64_t P = 2 * D + D * H * Dh * 2 + 2 * D * KV + 3 * D * F;
    const Tensor src = b.tensor(dt, {N, D}), dst = b.tensor(dt, {N, D});
    const Tensor master = b.tensor(DType::F32, {P}), half = b.tensor(DType::BF16, {P});
    rows.push_back({"copy", fmt::format("({}, {}) {}", N, D, dtype_name(dt)), WorkKind::Bytes, 2 * nd * e,
                    b.time([&] { o.copy(src, dst); }), 0});
    rows.push_back({"cast f32 -> bf16", fmt::format("({}) one layer's params", P), WorkKind::Bytes,
                    6.0 * static_cast<double>(P), b.time([&] { o.copy(master, half); }), 0});
    b.release();
  }
  return rows;
}

// --check-calls: each key of op call the rows time, times the rows' calls per micro-batch, against the calls of
// one forward_backward of the model (the bench's config and dtypes, DenseParams, no checkpointing) at batch 1 x
// seq min(seq, 16), where the same rows are recorded; nothing is computed. Throws InternalError listing every
// call whose counts differ.
void check_calls(const BenchShape& shape, DType dt) {
  BenchShape small = shape;
  small.batch = 1;
  small.seq = std::min<int64_t>(shape.seq, 16);
  CallRecorder row_calls;
  OpsBench rec(row_calls);
  const std::vector<OpRow> rows = run_rows(rec, small, dt);
  std::map<std::string, int64_t> want;
  std::map<std::string, std::string> row_names;
  for (size_t i = 0; i < rows.size(); ++i) {
    for (const std::string& key : rec.recorded().at(i)) {
      want[key] += rows[i].calls;
      row_names[key] += (row_names[key].empty() ? "" : ", ") + rows[i].op;
    }
  }
  CallRecorder model_calls;
  model::LlamaModel model(small.model, model_calls, model::ModelOptions{.activation_dtype = dt});
  model::DenseParams params(model.spec(), dt, DType::F32);
  params.bind(model.binding());
  std::vector<int32_t> ids(static_cast<size_t>(small.seq), 1), targets(static_cast<size_t>(small.seq), 1);
  model::Batch batch;
  batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {1, small.seq});
  batch.targets = ops::make_tensor(targets.data(), DType::I32, {1, small.seq});
  model.forward_backward(batch, model::StepOptions{.loss_scale = 1.0});
  std::map<std::string, int64_t> got;
  for (const std::string& key : model_calls.keys) ++got[key];
  std::string mismatches;
  for (const auto& [key, n] : got) {
    const auto it = want.find(key);
    if (it == want.end()) mismatches += fmt::format("\n  {}: {} per micro-batch in the model, no row times it", key, n);
    else if (it->second != n)
      mismatches +=
          fmt::format("\n  {} ({}): {} per micro-batch in the rows, {} in the model", key, row_names[key], it->second, n);
  }
  for (const auto& [key, n] : want)
    if (n != 0 && !got.count(key))
      mismatches += fmt::format("\n  {} ({}): {} per micro-batch in the rows, none in the model", key, row_names[key], n);
  if (!mismatches.empty())
    throw InternalError("bench ops: the rows' calls per micro-batch are not the model's" + mismatches);
  log::info("bench ops: every row's calls per micro-batch are the model's ({} op calls at batch 1 x seq {})",
            model_calls.keys.size(), small.seq);
}

std::string format_work(const OpRow& r) {
  if (r.kind == WorkKind::Flops)
    return r.work >= 1e12 ? fmt::format("{:.2f} TFLOP", r.work * 1e-12) : fmt::format("{:.3g} GFLOP", r.work * 1e-9);
  return r.work >= 1e9 ? fmt::format("{:.2f} GB", r.work * 1e-9) : fmt::format("{:.3g} MB", r.work * 1e-6);
}

std::string format_rate(const OpRow& r) {
  return r.kind == WorkKind::Flops ? format_flops(r.rate()) : fmt::format("{:.3g} GB/s", r.rate() * 1e-9);
}

int run_bench_ops(const BenchOpsOptions& o, Runtime* rt) {
  if (rt->topology().world_size > 1)
    throw UsageError("bench ops: runs on one rank (start it without mpirun, or with -np 1)");
  if (o.ranks < 1) throw UsageError(fmt::format("bench ops: --ranks {}: expected 1 or more", o.ranks));
  const BenchShape shape = resolve_shape(o);
  const Device& device = rt->device();
  const bool cuda = device.is_cuda();
  const DType dt = o.dtype.empty() ? (cuda ? DType::BF16 : DType::F32) : parse_dtype(o.dtype);
  if (dt != DType::F32 && dt != DType::BF16)
    throw UsageError(fmt::format("bench ops: --dtype {}: expected f32 or bf16", o.dtype));

  const int threads = o.threads > 0 ? o.threads : rt->host_threads();
  std::unique_ptr<CudaStream> stream;
  std::unique_ptr<ops::Ops> backend;
  if (cuda) {
    backend = ops::make_cuda_ops();
    stream = std::make_unique<CudaStream>();
    backend->set_stream(stream->ref());
  } else {
    backend = ops::make_cpu_ops(ops::CpuOpsOptions{threads});
  }
  const StreamRef sref = stream ? stream->ref() : StreamRef{};
  if (o.check_calls) check_calls(shape, dt);

  // Ceilings: bf16 8192^3 on a GPU (f32 when --dtype f32), f32 2048^3 on the CPU; copies of 1 GiB / 256 MiB.
  const int64_t peak_n = cuda ? 8192 : 2048;
  const size_t copy_bytes = cuda ? (size_t{1} << 30) : (size_t{256} << 20);
  log::info("bench ops: measuring the ceilings ({} {}^3 matmul, {} copy) on {}", dtype_name(dt), peak_n,
            format_bytes(copy_bytes), device.describe());
  const double peak_flops = ops::measure_matmul_flops(*backend, dt, peak_n, cuda ? 20 : 5, sref);
  const double copy_bw = ops::measure_copy_bandwidth(*backend, copy_bytes, cuda ? 20 : 5, sref);

  OpsBench bench(*backend, sref, o.warmup, o.iters);
  const std::vector<OpRow> rows = run_rows(bench, shape, dt);

  const model::LlamaConfig& c = shape.model;
  const int64_t tokens = shape.batch * shape.seq;
  double model_seconds = 0;
  for (const OpRow& r : rows) model_seconds += r.seconds * static_cast<double>(r.calls);

  fmt::print("bench ops on {} ({} backend{}), {} storage, median of {} calls after {} warm-up\n", device.describe(),
             cuda ? "CUDA" : "CPU", cuda ? std::string() : fmt::format(", {} threads", threads), dtype_name(dt), o.iters,
             o.warmup);
  fmt::print(
      "model ({}): layers {} hidden {} heads {}/{} (kv) head_dim {} intermediate {} vocab {} | micro-batch {} x seq {} = {} tokens\n",
      shape.source, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim(),
      c.intermediate_size, c.vocab_size, shape.batch, shape.seq, tokens);
  fmt::print("ceilings: matmul {} {}^3 {}; copy {:.3g} GB/s (read + write)\n", dtype_name(dt), peak_n,
             format_flops(peak_flops), copy_bw * 1e-9);
  fmt::print(
      "work: GEMMs 2*M*N*K; attention fwd 2*B*H*S^2*Dh (causal half of 4*B*H*S^2*Dh), bwd 2x fwd; "
      "linear_cross_entropy 2*N*D*V (+4*N*D*V with the gradient); memory-bound ops: bytes of each tensor read once + written once\n\n");
  fmt::print("{:<31} {:<38} {:>10} {:>12} {:>15} {:>8} {:>6}\n", "op", "shapes", "median", "work", "rate", "% ceil",
             "calls");
  for (const OpRow& r : rows) {
    const double ceiling = r.kind == WorkKind::Flops ? peak_flops : copy_bw;
    fmt::print("{:<31} {:<38} {:>10} {:>12} {:>15} {:>7.1f}% {:>6}\n", r.op, r.shapes, format_seconds(r.seconds),
               format_work(r), format_rate(r), 100.0 * r.rate() / ceiling, r.calls);
  }
  fmt::print(
      "\n% ceil: of the matmul ceiling (FLOP rows) or the copy ceiling (byte rows; above 100% the data stayed in cache).\n");
  fmt::print("sum of medians x calls (one micro-batch's forward+backward ops, no FSDP, no optimizer): {}, {:.0f} tokens/s\n",
             format_seconds(model_seconds), static_cast<double>(tokens) / model_seconds);

  if (!o.json.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device.describe();
    j["backend"] = cuda ? "cuda" : "cpu";
    j["threads"] = cuda ? 0 : threads;
    j["dtype"] = dtype_name(dt);
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["model"] = {{"source", shape.source},
                  {"layers", c.num_hidden_layers},
                  {"hidden", c.hidden_size},
                  {"heads", c.num_attention_heads},
                  {"kv_heads", c.num_key_value_heads},
                  {"head_dim", c.head_dim()},
                  {"intermediate", c.intermediate_size},
                  {"vocab", c.vocab_size}};
    j["batch"] = shape.batch;
    j["seq"] = shape.seq;
    j["tokens"] = tokens;
    j["ceilings"] = {
        {"matmul_flops_per_s", peak_flops}, {"matmul_n", peak_n}, {"copy_bytes_per_s", copy_bw}, {"copy_bytes", copy_bytes}};
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const OpRow& r : rows) {
      const double ceiling = r.kind == WorkKind::Flops ? peak_flops : copy_bw;
      list.push_back({{"op", r.op},
                      {"shapes", r.shapes},
                      {"kind", r.kind == WorkKind::Flops ? "flops" : "bytes"},
                      {"work", r.work},
                      {"seconds", r.seconds},
                      {"rate", r.rate()},
                      {"fraction_of_ceiling", r.rate() / ceiling},
                      {"calls_per_microbatch", r.calls}});
    }
    j["rows"] = list;
    j["model_op_seconds_per_microbatch"] = model_seconds;
    write_text_file(o.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

BenchSubcommand add_bench_ops_command(CLI::App& bench) {
  auto o = std::make_shared<BenchOpsOptions>();
  CLI::App* a = bench.add_subcommand("ops",
                                     "time every op of a training step at a model's shapes on the current backend "
                                     "(CUDA on a GPU, else the CPU), against a measured matmul and copy ceiling");
  a->add_option("--config,-c", o->config,
                "take the model and micro-batch from a training config (TOML); options below override it");
  a->add_option("--ranks", o->ranks,
                "with --config: the data-parallel ranks the micro-batch is derived for "
                "(data.micro_batch_size, or global_batch_size / ranks)")
      ->capture_default_str();
  a->add_option("--layers", o->layers, "decoder layers (default: the config's, or 4)");
  a->add_option("--hidden", o->hidden, "hidden size (default: the config's, or 256)");
  a->add_option("--seq", o->seq, "sequence length (default: the config's, or 256)");
  a->add_option("--batch", o->batch, "sequences per micro-batch (default: the config's, or 4)");
  a->add_option("--heads", o->heads, "attention heads (default: the config's, or 4)");
  a->add_option("--kv-heads", o->kv_heads, "key/value heads (default: the config's, or --heads)");
  a->add_option("--vocab", o->vocab, "vocabulary size (default: the config's, or 32000)");
  a->add_option("--intermediate", o->intermediate, "MLP size (default: the config's, or 4 * hidden)");
  a->add_option("--dtype", o->dtype, "activation and parameter storage: f32 or bf16 (default bf16 on CUDA, f32 on the CPU)");
  a->add_option("--iters", o->iters, "timed calls per op")->capture_default_str()->check(CLI::Range(1, 100000));
  a->add_option("--warmup", o->warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 100000));
  a->add_option("--threads", o->threads, "CPU backend threads (0 = the rank's cores)")->capture_default_str();
  a->add_option("--json", o->json, "also write every row as JSON to this file");
  a->add_flag("--check-calls", o->check_calls,
              "first run the model once (batch 1, no math) through a recorder of op "
              "calls and fail unless each row's calls per micro-batch are the model's");
  return {a, [o](Runtime* rt) { return run_bench_ops(*o, rt); }};
}

}  // namespace shardtrain::cli
