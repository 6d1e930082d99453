// CudaOps: the Ops interface on the GPU, each op (op_list.inc) forwarding to its function in this folder
// (context.hpp).
#include "shardtrain/ops/cuda_ops.hpp"

#include <cuda_runtime_api.h>

#include "context.hpp"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::ops {

CudaOps::CudaOps(const CudaOpsOptions& options) {
  if (cuda_device_count() == 0)
    throw Error(ExitCode::Device, "CudaOps: no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES empty)");
  ctx_ = std::make_unique<cuda::Context>(options);
}

CudaOps::~CudaOps() = default;

void CudaOps::set_stream(StreamRef stream) { ctx_->switch_stream(stream); }
StreamRef CudaOps::stream() const { return ctx_->stream; }
std::unique_ptr<Ops> CudaOps::make_side_ops() const {
  CudaOpsOptions side = ctx_->options;
  side.gemm_workspace_bytes = 0;
  return std::make_unique<CudaOps>(side);
}

#define SHARDTRAIN_OP(R, name, params, args) \
  R CudaOps::name params { return cuda::name(*ctx_, SHARDTRAIN_OP_UNPAREN args); }
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

void CudaOps::defer_loss(bool on) { ctx_->defer_loss = on; }
LossSums CudaOps::take_loss() {
  // Read (one copy, one wait), then the total starts again from zero: also when a kernel recorded a bad
  // target, so that the DataError leaves no stale sums behind.
  auto restart = [&] {
    ST_CHECK_CUDA(cudaMemsetAsync(ctx_->deferred_sums(), 0, sizeof(kernels::LossSumsDevice),
                                  static_cast<cudaStream_t>(ctx_->stream.handle)));
  };
  cuda::Readback r;
  try {
    r = ctx_->synchronize_and_check();
  } catch (...) {
    restart();
    throw;
  }
  restart();
  return LossSums{r.deferred.loss_sum, static_cast<int64_t>(r.deferred.tokens)};
}

void CudaOps::synchronize() { ctx_->synchronize_and_check(); }
size_t CudaOps::gemm_plans() const { return ctx_->gemm.plans(); }

std::unique_ptr<Ops> make_cuda_ops(const CudaOpsOptions& options) { return std::make_unique<CudaOps>(options); }

}  // namespace shardtrain::ops
