// ParamBinding: per-parameter views with shape checks, and which neighbours they continue, at bind time.
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
    throw InternalError(fmt::format("bind {} of {}: view {} has {} elements, expected {}", what, p.name, view.shape.str(),
                                    view.numel(), p.numel));
}

// b starts where a ends, in the same memory and dtype.
bool follows(const ops::Tensor& a, const ops::Tensor& b) {
  return a.defined() && b.defined() && a.dtype == b.dtype && a.device == b.device &&
         static_cast<const char*>(a.data) + a.bytes() == static_cast<const char*>(b.data);
}

}  // namespace

void ParamBinding::update_follows(int index) {
  const auto i = static_cast<size_t>(index);
  for (size_t j : {i, i + 1}) {
    if (j == 0 || j >= views_.size()) continue;
    views_[j].param_follows = follows(views_[j - 1].param, views_[j].param);
    views_[j].grad_follows = follows(views_[j - 1].grad, views_[j].grad);
  }
}

void ParamBinding::bind_param(int index, const ops::Tensor& view) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "param");
  views_[static_cast<size_t>(index)].param = view.reshaped(param_shape(p));
  update_follows(index);
}

void ParamBinding::bind_grad(int index, const ops::Tensor& view) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "grad");
  views_[static_cast<size_t>(index)].grad = view.reshaped(param_shape(p));
  update_follows(index);
}

void ParamBinding::unbind(int index) {
  views_.at(static_cast<size_t>(index)) = Views{};
  update_follows(index);
}

bool ParamBinding::params_adjacent(int first, int count) const {
  if (!param_bound(first)) return false;
  for (int i = first + 1; i < first + count; ++i)
    if (!views_.at(static_cast<size_t>(i)).param_follows) return false;
  return true;
}

bool ParamBinding::grads_adjacent(int first, int count) const {
  if (!grad_bound(first)) return false;
  for (int i = first + 1; i < first + count; ++i)
    if (!views_.at(static_cast<size_t>(i)).grad_follows) return false;
  return true;
}

const ops::Tensor& ParamBinding::param(int index) const {
  const ops::Tensor& t = views_.at(static_cast<size_t>(index)).param;
  if (!t.defined())
    throw InternalError(fmt::format("parameter {} is not bound: bind it before its module runs", spec_->param(index).name));
  return t;
}

const ops::Tensor& ParamBinding::grad(int index) const {
  const ops::Tensor& t = views_.at(static_cast<size_t>(index)).grad;
  if (!t.defined())
    throw InternalError(
        fmt::format("gradient of {} is not bound: bind it before the module's backward", spec_->param(index).name));
  return t;
}

}  // namespace shardtrain::model
