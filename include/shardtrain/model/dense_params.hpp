// All parameters (and their gradients) in two contiguous host buffers, one view per parameter: the
// single-process stand-in for the FSDP engine's flat shards, used by tests, the bench and one-rank runs.
#pragma once

#include <vector>

#include "shardtrain/model/binding.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/ops/tensor.hpp"

namespace shardtrain::model {

class DenseParams {
 public:
  // Each parameter starts at a 64-byte aligned offset. Contents are zero until initialize().
  explicit DenseParams(const ModelSpec& spec, DType param_dtype = DType::F32, DType grad_dtype = DType::F32);

  void initialize();               // with the config's init_seed
  void initialize(uint64_t seed);  // the counter-based init of init.hpp, parameter by parameter
  void zero_grads();
  void bind(ParamBinding& binding) const;  // binds every parameter and gradient view

  ops::Tensor param(int index) const;
  ops::Tensor grad(int index) const;
  ops::Tensor flat_params() const;  // every element of the buffer, padding included (1-D)
  ops::Tensor flat_grads() const;
  int64_t offset(int index) const { return offsets_.at(static_cast<size_t>(index)); }  // in elements
  const ModelSpec& spec() const { return *spec_; }

 private:
  const ModelSpec* spec_;
  DType param_dtype_, grad_dtype_;
  std::vector<int64_t> offsets_;
  int64_t total_ = 0;
  ops::HostBuffer params_, grads_;
};

}  // namespace shardtrain::model
