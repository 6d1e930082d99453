// LlamaDecoderLayer forward and backward:
//   n1 = input_layernorm(x);  q, k, v = n1 Wq^T, n1 Wk^T, n1 Wv^T;  RoPE(q, k);  attn = GQA(q, k, v)
//   h = x + attn Wo^T;  n2 = post_attention_layernorm(h)  (add and norm fused)
//   x_out = h + (silu(n2 Wg^T) * n2 Wu^T) Wd^T  (the residual add rides on the down_proj GEMM: C = h, D = x_out)
// Where the bindings hold Wq, Wk, Wv adjacent in memory they are one ((H + 2 Hkv) Dh, D) matrix, and q, k, v one
// GEMM into the workspace's (N, (H + 2 Hkv) Dh) qkv, split and rotated by one rope_qkv launch; Wg, Wu likewise
// one (2F, D) matrix and one GEMM into gate_up (N, 2F). Backward mirrors both. Elsewhere (ProjectionFusion::Never,
// parameters in different FSDP units, a binding that separates them) one GEMM per projection, as before.
#include <exception>

#include <fmt/format.h>

#include "layer_exec.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::model::detail {
namespace {

using ops::Tensor;
using ops::Transpose;

}  // namespace

Scope::Scope(const Exec& e, int module, ForwardPhase phase)
    : e_(e), module_(module), phase_(phase), exceptions_(std::uncaught_exceptions()) {
  e.hooks.before_forward(module, phase);
}
// The after hook runs only on a normal exit: an error unwinding through a module skips it.
Scope::~Scope() noexcept(false) {
  if (std::uncaught_exceptions() == exceptions_) e_.hooks.after_forward(module_, phase_);
}

BackwardScope::BackwardScope(const Exec& e, int module) : e_(e), module_(module), exceptions_(std::uncaught_exceptions()) {
  e.hooks.before_backward(module);
}
BackwardScope::~BackwardScope() noexcept(false) {
  if (std::uncaught_exceptions() == exceptions_) e_.hooks.after_backward(module_);
}

namespace {

// y (N, out) = x (N, in) W^T, W (out, in); with a residual r (N, out): y = r + x W^T.
void linear_forward(const Exec& e, int module, int param, const Tensor& x, const Tensor& y, ForwardPhase phase,
                    const Tensor& residual = Tensor{}) {
  Scope s(e, module, phase);
  if (residual.defined()) {
    e.ops.matmul_add(Transpose::No, Transpose::Yes, 1.0, x, e.param(param), residual, y);
  } else {
    e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, x, e.param(param), 0.0, y);
  }
}

// dW += dy^T x (dW = dy^T x where the binding says its view holds nothing yet);  dx = dy W (beta_dx = 0) or
// dx += dy W (beta_dx = 1). Without hooks: the caller holds the module's scope (a group of projections opens its
// modules' scopes around all of its GEMMs, fused or not).
void linear_backward_in_scope(const Exec& e, int param, const Tensor& x, const Tensor& dy, const Tensor& dx,
                              double beta_dx) {
  e.ops.matmul(Transpose::Yes, Transpose::No, 1.0, dy, x, e.take_grad_beta(param), e.grad(param));
  e.ops.matmul(Transpose::No, Transpose::No, 1.0, dy, e.param(param), beta_dx, dx);
}

void linear_backward(const Exec& e, int module, int param, const Tensor& x, const Tensor& dy, const Tensor& dx,
                     double beta_dx) {
  BackwardScope s(e, module);
  linear_backward_in_scope(e, param, x, dy, dx, beta_dx);
}

Tensor heads_view(const Tensor& t, int64_t heads) {  // (N, heads * Dh) as (N, heads, Dh)
  return t.reshaped({t.shape[0], heads, t.shape[1] / heads});
}

// Adjacent parameters (or gradients) first, first + 1, ... as one (rows, cols) matrix in place.
Tensor stacked(const Tensor& first, int64_t rows) {
  return ops::make_tensor(first.data, first.dtype, {rows, first.shape[1]}, first.device);
}

const char* path_name(ProjectionPath p) { return p == ProjectionPath::Fused ? "one GEMM" : "one GEMM each"; }

// Records how a group ran, with a debug line when that differs from the last time (the first step, a rebinding
// that separates or joins the parameters).
void record_path(const Exec& e, int layer, ProjectionPath LayerProjections::*field, ProjectionPath path, const char* group,
                 const char* why_separate) {
  ProjectionPath& last = e.projections.at(static_cast<size_t>(layer)).*field;
  if (last != path) {
    log::debug("{}: {} {}{}", e.spec.module(e.spec.layer(layer).modules.layer).name, group, path_name(path),
               path == ProjectionPath::Separate ? why_separate : "");
  }
  last = path;
}

// Why a group that could be fused is not.
const char* separate_reason(const Exec& e) {
  return e.fusion == ProjectionFusion::Never
             ? " (projection fusion off)"
             : " (not adjacent in memory: different FSDP units, or a binding that separates them)";
}

}  // namespace

void decoder_layer_forward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const Tensor& x,
                           const Tensor& x_out, ForwardPhase phase) {
  const LayerIndex& li = e.spec.layer(layer);
  const auto& m = li.modules;
  const auto& p = li.params;
  const double eps = e.spec.config().rms_norm_eps;
  const ops::RopeFrequencies rope = e.spec.config().rope_frequencies();
  const int64_t heads = e.shape.heads, kv_heads = e.shape.kv_heads, n = a.n1.shape[0];
  Scope layer_scope(e, m.layer, phase);
  {
    Scope s(e, m.input_layernorm, phase);
    e.ops.rmsnorm_forward(x, Tensor{}, e.param(p.input_layernorm), eps, Tensor{}, a.n1, a.rstd1);
  }
  {
    Scope s(e, m.self_attn, phase);
    {
      // One scope per projection, all open around the group's GEMMs (binding happens in the hooks).
      Scope sq(e, m.q_proj, phase), sk(e, m.k_proj, phase), sv(e, m.v_proj, phase);
      const bool fused = e.fusion == ProjectionFusion::WhereAdjacent && e.binding.params_adjacent(p.q_proj, 3);
      if (fused) {
        // (N, D) x ((H + 2 Hkv) Dh, D)^T -> rows of [q | k | v]; RoPE on q and k and the split in one launch
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n1, stacked(e.param(p.q_proj), w.qkv.shape[1]), 0.0, w.qkv);
        e.ops.rope_qkv_forward(w.qkv, e.positions, rope, heads_view(a.q, heads), heads_view(a.k, kv_heads),
                               heads_view(a.v, kv_heads));
      } else {
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n1, e.param(p.q_proj), 0.0, a.q);
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n1, e.param(p.k_proj), 0.0, a.k);
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n1, e.param(p.v_proj), 0.0, a.v);
        e.ops.rope(heads_view(a.q, heads), e.positions, rope, ops::RopeDirection::Forward);
        e.ops.rope(heads_view(a.k, kv_heads), e.positions, rope, ops::RopeDirection::Forward);
      }
      record_path(e, layer, &LayerProjections::qkv_forward, fused ? ProjectionPath::Fused : ProjectionPath::Separate,
                  "q_proj, k_proj, v_proj forward:", separate_reason(e));
    }
    e.ops.attention_forward(e.shape, a.q, a.k, a.v, e.mask, a.attn, a.lse);
    linear_forward(e, m.o_proj, p.o_proj, a.attn, w.attn_out, phase);
  }
  {
    Scope s(e, m.post_attention_layernorm, phase);
    e.ops.rmsnorm_forward(w.attn_out, x, e.param(p.post_attention_layernorm), eps, a.h, a.n2, a.rstd2);
  }
  {
    Scope s(e, m.mlp, phase);
    const int64_t f = a.act.shape[1];
    ops::GateUpLayout layout = ops::GateUpLayout::Halves;
    {
      Scope sg(e, m.gate_proj, phase), su(e, m.up_proj, phase);
      const bool fused = e.fusion == ProjectionFusion::WhereAdjacent && e.binding.params_adjacent(p.gate_proj, 2);
      if (fused) {  // (N, D) x (2F, D)^T -> rows of [gate | up]
        layout = ops::GateUpLayout::Rows;
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n2, stacked(e.param(p.gate_proj), 2 * f), 0.0,
                     a.gate_up.reshaped({n, 2 * f}));
      } else {  // (2, N, F): gate, then up
        const Tensor halves = a.gate_up.reshaped({2 * n, f});
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n2, e.param(p.gate_proj), 0.0, halves.row_slice(0, n));
        e.ops.matmul(Transpose::No, Transpose::Yes, 1.0, a.n2, e.param(p.up_proj), 0.0, halves.row_slice(n, n));
      }
      record_path(e, layer, &LayerProjections::gate_up_forward, fused ? ProjectionPath::Fused : ProjectionPath::Separate,
                  "gate_proj, up_proj forward:", separate_reason(e));
    }
    e.ops.swiglu_forward(a.gate_up, layout, a.act);
    linear_forward(e, m.down_proj, p.down_proj, a.act, x_out, phase, a.h);
  }
}

void decoder_layer_backward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const Tensor& x,
                            const Tensor& dy, const Tensor& dx) {
  const LayerIndex& li = e.spec.layer(layer);
  const auto& m = li.modules;
  const auto& p = li.params;
  const ops::RopeFrequencies rope = e.spec.config().rope_frequencies();
  const int64_t heads = e.shape.heads, kv_heads = e.shape.kv_heads, n = a.n1.shape[0], f = a.act.shape[1];
  {
    BackwardScope s(e, m.mlp);
    linear_backward(e, m.down_proj, p.down_proj, a.act, dy, w.dact, 0.0);
    // gate_up holds gate and up as this layer's forward laid them out (the forward and its recompute decide alike)
    const bool rows = e.projections.at(static_cast<size_t>(layer)).gate_up_forward == ProjectionPath::Fused;
    BackwardScope su(e, m.up_proj), sg(e, m.gate_proj);
    // In place: gate and up are dead once their gradients exist (saves a (N, 2F) buffer).
    e.ops.swiglu_backward(w.dact, a.gate_up, rows ? ops::GateUpLayout::Rows : ops::GateUpLayout::Halves, a.gate_up);
    if (rows) {
      if (!e.binding.grads_adjacent(p.gate_proj, 2))
        throw InternalError(
            fmt::format("{}: the gradients of gate_proj and up_proj are not bound adjacent, while their "
                        "parameters were: bind each gradient in its parameter's layout",
                        e.spec.module(m.layer).name));
      const Tensor dgate_up = a.gate_up.reshaped({n, 2 * f});
      e.ops.matmul(Transpose::Yes, Transpose::No, 1.0, dgate_up, a.n2, e.take_grad_beta(p.gate_proj, 2),
                   stacked(e.grad(p.gate_proj), 2 * f));
      e.ops.matmul(Transpose::No, Transpose::No, 1.0, dgate_up, stacked(e.param(p.gate_proj), 2 * f), 0.0, w.dn);
    } else {
      const Tensor halves = a.gate_up.reshaped({2 * n, f});
      linear_backward_in_scope(e, p.up_proj, a.n2, halves.row_slice(n, n), w.dn, 0.0);
      linear_backward_in_scope(e, p.gate_proj, a.n2, halves.row_slice(0, n), w.dn, 1.0);
    }
    record_path(e, layer, &LayerProjections::gate_up_backward, rows ? ProjectionPath::Fused : ProjectionPath::Separate,
                "gate_proj, up_proj backward:", separate_reason(e));
  }
  {
    // dh = norm backward + dy (h also feeds x_out directly)
    BackwardScope s(e, m.post_attention_layernorm);
    e.ops.rmsnorm_backward(w.dn, a.h, e.param(p.post_attention_layernorm), a.rstd2, dy, w.dh,
                           e.grad(p.post_attention_layernorm));
  }
  {
    BackwardScope s(e, m.self_attn);
    linear_backward(e, m.o_proj, p.o_proj, a.attn, w.dh, w.dattn, 0.0);
    e.ops.attention_backward(e.shape, a.q, a.k, a.v, a.attn, a.lse, w.dattn, e.mask, w.dq, w.dk, w.dv);
    BackwardScope sv(e, m.v_proj), sk(e, m.k_proj), sq(e, m.q_proj);
    const bool fused = e.fusion == ProjectionFusion::WhereAdjacent && e.binding.params_adjacent(p.q_proj, 3) &&
                       e.binding.grads_adjacent(p.q_proj, 3);
    if (fused) {
      // dq, dk rotated back and dv, packed into rows of [dq | dk | dv] (in dact's memory, dead by now)
      e.ops.rope_qkv_backward(heads_view(w.dq, heads), heads_view(w.dk, kv_heads), heads_view(w.dv, kv_heads), e.positions,
                              rope, w.qkv);
      const int64_t rows_qkv = w.qkv.shape[1];
      e.ops.matmul(Transpose::Yes, Transpose::No, 1.0, w.qkv, a.n1, e.take_grad_beta(p.q_proj, 3),
                   stacked(e.grad(p.q_proj), rows_qkv));
      e.ops.matmul(Transpose::No, Transpose::No, 1.0, w.qkv, stacked(e.param(p.q_proj), rows_qkv), 0.0, w.dn);
    } else {
      e.ops.rope(heads_view(w.dq, heads), e.positions, rope, ops::RopeDirection::Backward);
      e.ops.rope(heads_view(w.dk, kv_heads), e.positions, rope, ops::RopeDirection::Backward);
      linear_backward_in_scope(e, p.v_proj, a.n1, w.dv, w.dn, 0.0);
      linear_backward_in_scope(e, p.k_proj, a.n1, w.dk, w.dn, 1.0);
      linear_backward_in_scope(e, p.q_proj, a.n1, w.dq, w.dn, 1.0);
    }
    record_path(e, layer, &LayerProjections::qkv_backward, fused ? ProjectionPath::Fused : ProjectionPath::Separate,
                "q_proj, k_proj, v_proj backward:", separate_reason(e));
  }
  {
    // dx = norm backward + dh (x also feeds h directly)
    BackwardScope s(e, m.input_layernorm);
    e.ops.rmsnorm_backward(w.dn, x, e.param(p.input_layernorm), a.rstd1, w.dh, dx, e.grad(p.input_layernorm));
  }
}

}  // namespace shardtrain::model::detail
