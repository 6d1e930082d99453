// Where the model finds its parameters and gradients. The model owns no parameter storage: a driver (the
// FSDP engine, or DenseParams for one process) binds a view per parameter, and may rebind at any time
// (typically from a before_forward / before_backward hook after an all-gather). The model reads a view
// only while the module that uses it runs, and checks its shape then.
#pragma once

#include <vector>

#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/tensor.hpp"

namespace shardtrain::model {

// How backward writes a gradient view.
// - Accumulate: every write adds (+=) into what the view holds (zeroed by the driver before the step's first
//   backward, or an earlier micro-batch's sum).
// - Overwrite: the view holds nothing yet (any bits); the first write stores its result, later writes add. Saves the
//   driver zeroing memory that the first write replaces whole. Only a gradient that one GEMM writes whole can be
//   bound so (gemm_writes_gradient: the decoder layers' projections, and an untied lm_head, whose fused loss writes
//   it in its first chunk); the norms' and the embedding's are added into by their ops.
enum class GradWrite { Accumulate, Overwrite };

// Whether backward writes this parameter's gradient whole with one GEMM (dW = dy^T x): the projections of the
// decoder layers, and an lm_head that is not tied to the embedding. What GradWrite::Overwrite may be bound for.
bool gemm_writes_gradient(const ModelSpec& spec, int index);

class ParamBinding {
 public:
  explicit ParamBinding(const ModelSpec& spec);

  // `region`: the allocation the view lies in (the FSDP engine: its unit). Views follow one another only within one
  // region: two units' buffers that the allocator placed end to end are two allocations, and a GEMM fused across
  // them read past the end of the first (the emulator stopped it; wrapping each Linear with the norms did it).
  // nullptr: the driver's one store (DenseParams, the tests).
  void bind_param(int index, const ops::Tensor& view, const void* region = nullptr);  // shape: the parameter's
  // InternalError for GradWrite::Overwrite where !gemm_writes_gradient.
  void bind_grad(int index, const ops::Tensor& view, GradWrite write = GradWrite::Accumulate, const void* region = nullptr);
  // The beta of the next GEMM that writes the gradients of parameters first .. first + count - 1 (adjacent: one
  // GEMM): 0 once after they were bound with GradWrite::Overwrite, 1 after that or when bound to accumulate.
  // InternalError when they disagree (bound in different ways: a driver's mistake).
  double take_grad_beta(int first, int count = 1);
  // Bound with GradWrite::Overwrite and not written since: its view holds no gradient yet.
  bool grad_unwritten(int index) const { return views_.at(static_cast<size_t>(index)).overwrite_pending; }
  void unbind(int index);                     // both views
  const ops::Tensor& param(int index) const;  // throws InternalError naming the parameter when unbound
  const ops::Tensor& grad(int index) const;
  bool param_bound(int index) const { return views_.at(static_cast<size_t>(index)).param.defined(); }
  bool grad_bound(int index) const { return views_.at(static_cast<size_t>(index)).grad.defined(); }
  // Whether parameters first .. first + count - 1 are bound to views that follow one another in memory, in index
  // order, with nothing between, one dtype and device, and one region: then they are one matrix in place (q, k, v: one
  // ((H + 2 Hkv) Dh, D) matrix), and the model fuses their GEMMs. Settled when the views are bound, not per use.
  // grads_adjacent: the same of their gradient views. Drivers bind every gradient at its parameter's offset in a
  // buffer of the same layout (DenseParams, the FSDP engine), so the two agree.
  bool params_adjacent(int first, int count) const;
  bool grads_adjacent(int first, int count) const;

 private:
  struct Views {
    ops::Tensor param, grad;
    const void* param_region = nullptr;
    const void* grad_region = nullptr;
    bool param_follows = false;  // param starts where index - 1's param ends (same dtype, device and region)
    bool grad_follows = false;
    bool overwrite_pending = false;  // bound with GradWrite::Overwrite, not written since
  };
  void update_follows(int index);  // index's and index + 1's flags, from the views bound now
  const ModelSpec* spec_;
  std::vector<Views> views_;
};

// The shape of a parameter as a tensor shape.
ops::Shape param_shape(const ParamInfo& p);

}  // namespace shardtrain::model
