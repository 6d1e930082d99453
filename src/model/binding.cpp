// ParamBinding: per-parameter views with shape checks at bind time.
#include "shardtrain/model/binding.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

ops::Shape param_shape(const ParamInfo& p) {
  ops::Shape s;
  for (int64_t d : p.shape) s.dims[static_cast<size_t>(s.rank++)] = d;
  return s;
}

ParamBinding::ParamBinding(const ModelSpec& spec) : spec_(&spec), views_(spec.params().size()) {}

namespace {

void check_view(const ParamInfo& p, const ops::Tensor& view, const char* what) {
  if (!view.defined()) throw InternalError(fmt::format("bind {} of {}: null data", what, p.name));
  if (!dtype_is_float(view.dtype))
    throw InternalError(fmt::format("bind {} of {}: dtype {} is not a float type", what, p.name, dtype_name(view.dtype)));
  if (view.numel() != p.numel)
    throw InternalError(fmt::format("bind {} of {}: view {} has {} elements, expected {}", what, p.name,
                                    view.shape.str(), view.numel(), p.numel));
}

}  // namespace

void ParamBinding::bind_param(int index, const ops::Tensor& view) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "param");
  views_[static_cast<size_t>(index)].param = view.reshaped(param_shape(p));
}

void ParamBinding::bind_grad(int index, const ops::Tensor& view) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "grad");
  views_[static_cast<size_t>(index)].grad = view.reshaped(param_shape(p));
}

void ParamBinding::unbind(int index) { views_.at(static_cast<size_t>(index)) = Views{}; }

const ops::Tensor& ParamBinding::param(int index) const {
  const ops::Tensor& t = views_.at(static_cast<size_t>(index)).param;
  if (!t.defined())
    throw InternalError(fmt::format("parameter {} is not bound: bind it before its module runs", spec_->param(index).name));
  return t;
}

const ops::Tensor& ParamBinding::grad(int index) const {
  const ops::Tensor& t = views_.at(static_cast<size_t>(index)).grad;
  if (!t.defined())
    throw InternalError(fmt::format("gradient of {} is not bound: bind it before the module's backward",
                                    spec_->param(index).name));
  return t;
}

}  // namespace shardtrain::model
