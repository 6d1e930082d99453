// Module-boundary hooks: how a driver (the FSDP engine) steps in around each module without the model
// knowing about communication. Module ids index ModelSpec::modules(). Calls nest like the module tree:
// before_forward(layer), before_forward(input_layernorm), after_forward(input_layernorm), ...,
// after_forward(layer). Backward visits modules in reverse execution order with the same nesting.
//
// A group of projections (q_proj, k_proj, v_proj; gate_proj, up_proj), whose GEMMs may be one (decoder_layer.cpp),
// opens all of its modules' hooks before its first GEMM and closes them after its last, in reverse:
// before_forward(q), before_forward(k), before_forward(v), ..., after_forward(v), after_forward(k),
// after_forward(q); in backward before_backward(v), (k), (q), ..., after_backward(q), (k), (v).
//
// Under activation checkpointing, a decoder layer's backward starts by recomputing its forward: the model
// calls before_backward(layer), then the forward hooks of the layer and its children with
// ForwardPhase::Recompute, then the backward hooks of the children, then after_backward(layer).
//
// lm_head is fused with the loss: forward_backward() calls before_forward(lm_head), before_backward(lm_head),
// runs logits + loss + gradients chunk by chunk, then after_forward(lm_head), after_backward(lm_head).
// forward() (no gradients) calls only the forward pair.
#pragma once

namespace shardtrain::model {

enum class ForwardPhase { Normal, Recompute };

class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void before_forward(int module, ForwardPhase phase) {}
  virtual void after_forward(int module, ForwardPhase phase) {}
  virtual void before_backward(int module) {}
  virtual void after_backward(int module) {}  // the module's gradient contributions are complete
};

}  // namespace shardtrain::model
