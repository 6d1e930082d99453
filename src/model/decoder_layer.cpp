// LlamaDecoderLayer forward and backward:
//   n1 = input_layernorm(x);  q, k, v = n1 Wq^T, n1 Wk^T, n1 Wv^T;  RoPE(q, k);  attn = GQA(q, k, v)
//   h = x + attn Wo^T;  n2 = post_attention_layernorm(h)  (add and norm fused)
//   x_out = h + (silu(n2 Wg^T) * n2 Wu^T) Wd^T  (the residual add rides on the down_proj GEMM: C = h, D = x_out)
#include <exception>

#include "layer_exec.hpp"

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

BackwardScope::BackwardScope(const Exec& e, int module)
    : e_(e), module_(module), exceptions_(std::uncaught_exceptions()) {
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

// dW += dy^T x;  dx = dy W (beta_dx = 0) or dx += dy W (beta_dx = 1).
void linear_backward(const Exec& e, int module, int param, const Tensor& x, const Tensor& dy, const Tensor& dx,
                     double beta_dx) {
  BackwardScope s(e, module);
  e.ops.matmul(Transpose::Yes, Transpose::No, 1.0, dy, x, 1.0, e.grad(param));
  e.ops.matmul(Transpose::No, Transpose::No, 1.0, dy, e.param(param), beta_dx, dx);
}

Tensor heads_view(const Tensor& t, int64_t heads) {  // (N, heads * Dh) as (N, heads, Dh)
  return t.reshaped({t.shape[0], heads, t.shape[1] / heads});
}

}  // namespace

void decoder_layer_forward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const Tensor& x,
                           const Tensor& x_out, ForwardPhase phase) {
  const LayerIndex& li = e.spec.layer(layer);
  const auto& m = li.modules;
  const auto& p = li.params;
  const double eps = e.spec.config().rms_norm_eps;
  const ops::RopeFrequencies rope = e.spec.config().rope_frequencies();
  Scope layer_scope(e, m.layer, phase);
  {
    Scope s(e, m.input_layernorm, phase);
    e.ops.rmsnorm_forward(x, Tensor{}, e.param(p.input_layernorm), eps, Tensor{}, a.n1, a.rstd1);
  }
  {
    Scope s(e, m.self_attn, phase);
    linear_forward(e, m.q_proj, p.q_proj, a.n1, a.q, phase);
    linear_forward(e, m.k_proj, p.k_proj, a.n1, a.k, phase);
    linear_forward(e, m.v_proj, p.v_proj, a.n1, a.v, phase);
    e.ops.rope(heads_view(a.q, e.shape.heads), e.positions, rope, ops::RopeDirection::Forward);
    e.ops.rope(heads_view(a.k, e.shape.kv_heads), e.positions, rope, ops::RopeDirection::Forward);
    e.ops.attention_forward(e.shape, a.q, a.k, a.v, e.mask, a.attn, a.lse);
    linear_forward(e, m.o_proj, p.o_proj, a.attn, w.attn_out, phase);
  }
  {
    Scope s(e, m.post_attention_layernorm, phase);
    e.ops.rmsnorm_forward(w.attn_out, x, e.param(p.post_attention_layernorm), eps, a.h, a.n2, a.rstd2);
  }
  {
    Scope s(e, m.mlp, phase);
    linear_forward(e, m.gate_proj, p.gate_proj, a.n2, a.gate, phase);
    linear_forward(e, m.up_proj, p.up_proj, a.n2, a.up, phase);
    e.ops.swiglu_forward(a.gate, a.up, a.act);
    linear_forward(e, m.down_proj, p.down_proj, a.act, x_out, phase, a.h);
  }
}

void decoder_layer_backward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const Tensor& x,
                            const Tensor& dy, const Tensor& dx) {
  const LayerIndex& li = e.spec.layer(layer);
  const auto& m = li.modules;
  const auto& p = li.params;
  const ops::RopeFrequencies rope = e.spec.config().rope_frequencies();
  {
    BackwardScope s(e, m.mlp);
    linear_backward(e, m.down_proj, p.down_proj, a.act, dy, w.dact, 0.0);
    // In place: gate and up are dead once their gradients exist (saves two (N, F) buffers).
    e.ops.swiglu_backward(w.dact, a.gate, a.up, a.gate, a.up);
    linear_backward(e, m.up_proj, p.up_proj, a.n2, a.up, w.dn, 0.0);
    linear_backward(e, m.gate_proj, p.gate_proj, a.n2, a.gate, w.dn, 1.0);
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
    e.ops.rope(heads_view(w.dq, e.shape.heads), e.positions, rope, ops::RopeDirection::Backward);
    e.ops.rope(heads_view(w.dk, e.shape.kv_heads), e.positions, rope, ops::RopeDirection::Backward);
    linear_backward(e, m.v_proj, p.v_proj, a.n1, w.dv, w.dn, 0.0);
    linear_backward(e, m.k_proj, p.k_proj, a.n1, w.dk, w.dn, 1.0);
    linear_backward(e, m.q_proj, p.q_proj, a.n1, w.dq, w.dn, 1.0);
  }
  {
    // dx = norm backward + dh (x also feeds h directly)
    BackwardScope s(e, m.input_layernorm);
    e.ops.rmsnorm_backward(w.dn, x, e.param(p.input_layernorm), a.rstd1, w.dh, dx, e.grad(p.input_layernorm));
  }
}

}  // namespace shardtrain::model::detail
