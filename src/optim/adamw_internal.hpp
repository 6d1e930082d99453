// What adamw.cpp shares with the CUDA half (adamw_cuda.cpp, or adamw_no_cuda.cpp without CUDA): the
// per-step scalars, computed once on the host for both paths, and the device helpers the host code calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/optim/adamw.hpp"

namespace shardtrain::optim::detail {

// The scalars of step t (the optimizer's step count after the increment), as both updates use them.
struct StepScalars {
  float beta1 = 0, beta2 = 0;
  float step_size = 0;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 - beta2^t)
  float eps = 0;
  float grad_scale = 1;
  float decay_factor = 1;  // 1 - lr * weight_decay
};
StepScalars step_scalars(const AdamWConfig& config, int64_t step, double lr, double grad_scale);

// A synchronous copy between any two of host and device memory that waits for all queued device work
// first (the source may still be written by a kernel on another stream) and finishes before returning.
void device_copy_sync(void* dst, const void* src, size_t bytes);

// GradNorm::start for CUDA shards: queues on `stream` the sum of squares of their gradients (in double, in
// `scratch`), its all-reduce over `device_axis` (null: none), the copy into `host` (pinned; both grown as
// needed) and `copied` after it. No host synchronization.
void device_grad_sq_sum_start(const std::vector<fsdp::ShardView>& shards, Communicator* device_axis, StreamRef stream,
                              DeviceBuffer& scratch, PinnedBuffer& host, CudaEvent& copied);

}  // namespace shardtrain::optim::detail
