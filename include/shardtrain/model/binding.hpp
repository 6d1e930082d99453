// Where the model finds its parameters and gradients. The model owns no parameter storage: a driver (the
// FSDP engine, or DenseParams for one process) binds a view per parameter, and may rebind at any time
// (typically from a before_forward / before_backward hook after an all-gather). The model reads a view
// only while the module that uses it runs, and checks its shape then.
#pragma once

#include <vector>

#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/tensor.hpp"

namespace shardtrain::model {

class ParamBinding {
 public:
  explicit ParamBinding(const ModelSpec& spec);

  void bind_param(int index, const ops::Tensor& view);  // shape must be the parameter's shape
  void bind_grad(int index, const ops::Tensor& view);   // gradients accumulate (+=) into this view
  void unbind(int index);                               // both views
  const ops::Tensor& param(int index) const;            // throws InternalError naming the parameter when unbound
  const ops::Tensor& grad(int index) const;
  bool param_bound(int index) const { return views_.at(static_cast<size_t>(index)).param.defined(); }
  bool grad_bound(int index) const { return views_.at(static_cast<size_t>(index)).grad.defined(); }
  // Whether parameters first .. first + count - 1 are bound to views that follow one another in memory, in index
  // order, with nothing between and one dtype and device: then they are one matrix in place (q, k, v: one
  // ((H + 2 Hkv) Dh, D) matrix), and the model fuses their GEMMs. Settled when the views are bound, not per use.
  // grads_adjacent: the same of their gradient views. Drivers bind every gradient at its parameter's offset in a
  // buffer of the same layout (DenseParams, the FSDP engine), so the two agree.
  bool params_adjacent(int first, int count) const;
  bool grads_adjacent(int first, int count) const;

 private:
  struct Views {
    ops::Tensor param, grad;
    bool param_follows = false;  // param starts where index - 1's param ends (same dtype and device)
    bool grad_follows = false;
  };
  void update_follows(int index);  // index's and index + 1's flags, from the views bound now
  const ModelSpec* spec_;
  std::vector<Views> views_;
};

// The shape of a parameter as a tensor shape.
ops::Shape param_shape(const ParamInfo& p);

}  // namespace shardtrain::model
