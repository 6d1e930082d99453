// Private to the model: what a module's forward/backward needs while it runs, and the decoder layer's
// forward and backward (decoder_layer.cpp).
#pragma once

#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/model/binding.hpp"
#include "shardtrain/model/hooks.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/ops.hpp"

namespace shardtrain::model::detail {

struct Exec {
  ops::Ops& ops;
  const ModelSpec& spec;
  ParamBinding& binding;  // the GEMMs that write gradients take their beta from it (take_grad_beta)
  ModuleHooks& hooks;
  ops::AttentionShape shape;
  ops::AttentionMask mask;
  ops::Tensor positions;  // (N) I32
  ProjectionFusion fusion;
  std::vector<LayerProjections>& projections;  // per layer: how its projections ran (decoder_layer.cpp)

  const ops::Tensor& param(int i) const { return binding.param(i); }
  const ops::Tensor& grad(int i) const { return binding.grad(i); }
  // Consumes the binding's pending overwrite (ParamBinding::take_grad_beta): call once per GEMM, as it is issued.
  double take_grad_beta(int first, int count = 1) const { return binding.take_grad_beta(first, count); }
};

// RAII pairs of module hooks: before_* in the constructor, after_* in the destructor.
class Scope {
 public:
  Scope(const Exec& e, int module, ForwardPhase phase);
  ~Scope() noexcept(false);
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const Exec& e_;
  int module_;
  ForwardPhase phase_;
  int exceptions_;
};

class BackwardScope {
 public:
  BackwardScope(const Exec& e, int module);
  ~BackwardScope() noexcept(false);
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;

 private:
  const Exec& e_;
  int module_;
  int exceptions_;
};

// x (N, D) -> x_out (N, D), saving what backward needs into a.
void decoder_layer_forward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const ops::Tensor& x,
                           const ops::Tensor& x_out, ForwardPhase phase);
// dy: gradient at x_out (N, D) -> dx: gradient at x (N, D); parameter gradients accumulate. dx != dy.
void decoder_layer_backward(const Exec& e, int layer, const LayerActivations& a, const Workspace& w, const ops::Tensor& x,
                            const ops::Tensor& dy, const ops::Tensor& dx);

}  // namespace shardtrain::model::detail
