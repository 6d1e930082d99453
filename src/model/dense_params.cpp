// DenseParams: contiguous host storage for every parameter and gradient (see dense_params.hpp).
#include "shardtrain/model/dense_params.hpp"

#include <cstring>

#include "shardtrain/model/init.hpp"

namespace shardtrain::model {

DenseParams::DenseParams(const ModelSpec& spec, DType param_dtype, DType grad_dtype)
    : spec_(&spec), param_dtype_(param_dtype), grad_dtype_(grad_dtype) {
  const int64_t align = 64 / static_cast<int64_t>(std::max(dtype_size(param_dtype), dtype_size(grad_dtype)));
  for (const ParamInfo& p : spec.params()) {
    offsets_.push_back(total_);
    total_ += (p.numel + align - 1) / align * align;
  }
  params_ = ops::HostBuffer(static_cast<size_t>(total_) * dtype_size(param_dtype));
  grads_ = ops::HostBuffer(static_cast<size_t>(total_) * dtype_size(grad_dtype));
  std::memset(params_.data(), 0, static_cast<size_t>(total_) * dtype_size(param_dtype));
  zero_grads();
}

void DenseParams::initialize() { initialize(spec_->config().init_seed); }

void DenseParams::initialize(uint64_t seed) {
  for (const ParamInfo& p : spec_->params()) init_param_slice(p, seed, 0, param(p.index).reshaped({p.numel}));
}

void DenseParams::zero_grads() { std::memset(grads_.data(), 0, static_cast<size_t>(total_) * dtype_size(grad_dtype_)); }

void DenseParams::bind(ParamBinding& binding) const {
  for (const ParamInfo& p : spec_->params()) {
    binding.bind_param(p.index, param(p.index));
    binding.bind_grad(p.index, grad(p.index));
  }
}

ops::Tensor DenseParams::param(int index) const {
  const size_t off = static_cast<size_t>(offset(index)) * dtype_size(param_dtype_);
  return ops::make_tensor(params_.as<char>() + off, param_dtype_, param_shape(spec_->param(index)));
}

ops::Tensor DenseParams::grad(int index) const {
  const size_t off = static_cast<size_t>(offset(index)) * dtype_size(grad_dtype_);
  return ops::make_tensor(grads_.as<char>() + off, grad_dtype_, param_shape(spec_->param(index)));
}

ops::Tensor DenseParams::flat_params() const { return ops::make_tensor(params_.data(), param_dtype_, {total_}); }
ops::Tensor DenseParams::flat_grads() const { return ops::make_tensor(grads_.data(), grad_dtype_, {total_}); }

}  // namespace shardtrain::model
