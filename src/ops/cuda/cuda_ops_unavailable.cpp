// make_cuda_ops in a build without the CUDA backend: a clear Device error instead of a link error.
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {

std::unique_ptr<Ops> make_cuda_ops(const CudaOpsOptions&) {
  throw Error(ExitCode::Device, "the CUDA backend was not built (configure with SHARDTRAIN_CUDA=ON and a CUDA Toolkit)");
}

}  // namespace shardtrain::ops
