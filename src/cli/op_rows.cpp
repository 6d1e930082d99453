// The rows of `bench ops` (op_rows.hpp): what each times, at which shapes, and the work it counts (the conventions are
// in cmd_bench_ops.cpp's header and ops/op_calls.hpp).
#include "op_rows.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::cli {

using ops::Tensor;
using ops::Transpose;

std::unique_ptr<ops::Ops> CallRecorder::make_side_ops() const {
  throw InternalError("the op call recorder has no side streams: its calls are one list");
}

Tensor OpsBench::tensor(DType dtype, ops::Shape shape, double scale) {
  if (recorder_) {  // an address per tensor (never read: the recorder computes nothing), distinct for aliasing checks
    next_fake_ += 4096;
    return ops::make_tensor(reinterpret_cast<void*>(next_fake_), dtype, shape, recorder_->device());
  }
  buffers_.emplace_back(ops_.device(), std::max<size_t>(1, static_cast<size_t>(shape.numel()) * dtype_size(dtype)));
  const Tensor t = buffers_.back().view(dtype, shape);
  ops::fill_uniform(t, ++seed_, scale, stream_);
  return t;
}

double OpsBench::time(const std::function<void()>& fn) {
  if (!recorder_) return median_call_seconds(ops_.device(), stream_, warmup_, iters_, fn);
  recorder_->calls.clear();
  fn();
  recorded_.push_back(recorder_->calls);
  return 1.0;
}

namespace {

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

}  // namespace

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
                    // dW overwritten in the first chunk, as the engine runs an untied lm_head (a fresh gradient)
                    b.time([&] { o.linear_cross_entropy(h, w, tgt, -100, scale, 0, dh, dw, 0.0); }), 1});
    rows.push_back({"linear_cross_entropy loss only", shapes, WorkKind::Flops, fwd,
                    b.time([&] { o.linear_cross_entropy(h, w, tgt, -100, scale, 0, {}, {}, 1.0); }), 0});
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

std::vector<RecordedRow> record_rows(const BenchShape& s, DType dt, DeviceKind device) {
  CallRecorder recorder(device);
  OpsBench bench(recorder);
  const std::vector<OpRow> rows = run_rows(bench, s, dt);
  if (rows.size() != bench.recorded().size())
    throw InternalError(fmt::format("bench ops: {} rows but {} recorded", rows.size(), bench.recorded().size()));
  std::vector<RecordedRow> out;
  for (size_t i = 0; i < rows.size(); ++i) out.push_back({rows[i], bench.recorded()[i]});
  return out;
}

nlohmann::ordered_json model_json(const BenchShape& shape) {
  const model::LlamaConfig& c = shape.model;
  return {{"source", shape.source},
          {"layers", c.num_hidden_layers},
          {"hidden", c.hidden_size},
          {"heads", c.num_attention_heads},
          {"kv_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim()},
          {"intermediate", c.intermediate_size},
          {"vocab", c.vocab_size}};
}

}  // namespace shardtrain::cli
