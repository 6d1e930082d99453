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

// b starts where a ends, in the same region (allocation), memory and dtype.
bool follows(const ops::Tensor& a, const void* a_region, const ops::Tensor& b, const void* b_region) {
  return a.defined() && b.defined() && a_region == b_region && a.dtype == b.dtype && a.device == b.device &&
         static_cast<const char*>(a.data) + a.bytes() == static_cast<const char*>(b.data);
}

}  // namespace

void ParamBinding::update_follows(int index) {
  const auto i = static_cast<size_t>(index);
  for (size_t j : {i, i + 1}) {
    if (j == 0 || j >= views_.size()) continue;
    const Views &a = views_[j - 1], &b = views_[j];
    views_[j].param_follows = follows(a.param, a.param_region, b.param, b.param_region);
    views_[j].grad_follows = follows(a.grad, a.grad_region, b.grad, b.grad_region);
  }
}

void ParamBinding::bind_param(int index, const ops::Tensor& view, const void* region) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "param");
  views_[static_cast<size_t>(index)].param = view.reshaped(param_shape(p));
  views_[static_cast<size_t>(index)].param_region = region;
  update_follows(index);
}

bool gemm_writes_gradient(const ModelSpec& spec, int index) {
  const ModuleInfo& m = spec.module(spec.param(index).module);
  // The decoder projections, and an lm_head of its own (tied, its weight is the embedding's, which
  // embedding_backward adds into): the fused loss's first chunk writes it.
  return m.cls == ModuleClass::Linear && (m.layer >= 0 || index == spec.lm_head_param());
}

void ParamBinding::bind_grad(int index, const ops::Tensor& view, GradWrite write, const void* region) {
  const ParamInfo& p = spec_->param(index);
  check_view(p, view, "grad");
  if (write == GradWrite::Overwrite && !gemm_writes_gradient(*spec_, index))
    throw InternalError(
        fmt::format("bind grad of {} to be overwritten: its ops add into it (bind it zeroed, to accumulate)", p.name));
  Views& v = views_[static_cast<size_t>(index)];
  v.grad = view.reshaped(param_shape(p));
  v.grad_region = region;
  v.overwrite_pending = write == GradWrite::Overwrite;
  update_follows(index);
}

double ParamBinding::take_grad_beta(int first, int count) {
  const bool overwrite = views_.at(static_cast<size_t>(first)).overwrite_pending;
  for (int i = first; i < first + count; ++i) {
    Views& v = views_.at(static_cast<size_t>(i));
    if (v.overwrite_pending != overwrite)
      throw InternalError(
          fmt::format("gradients of {} and {} are written by one GEMM but bound, one to be overwritten, "
                      "the other to accumulate",
                      spec_->param(first).name, spec_->param(i).name));
    v.overwrite_pending = false;
  }
  return overwrite ? 0.0 : 1.0;
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
