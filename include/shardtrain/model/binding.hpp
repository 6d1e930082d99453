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

 private:
  struct Views {
    ops::Tensor param, grad;
  };
  const ModelSpec* spec_;
  std::vector<Views> views_;
};

// The shape of a parameter as a tensor shape.
ops::Shape param_shape(const ParamInfo& p);

}  // namespace shardtrain::model
