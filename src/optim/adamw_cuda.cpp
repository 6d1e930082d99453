// The CUDA half of AdamW and the gradient norm: device states, the chunk table the fused kernel
// (kernels/adamw.cu) walks, the device sum of squares, and synchronous copies for checkpoints and faults.
#include <cuda_runtime.h>

#include <fmt/format.h>

#include "adamw_internal.hpp"
#include "kernels/adamw.cuh"
#include "kernels/sum_squares.cuh"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::optim {

void AdamW::allocate_device_state(State& s) {
  const size_t bytes = static_cast<size_t>(s.numel) * sizeof(float);
  s.device_exp_avg = DeviceBuffer(bytes);
  s.device_exp_avg_sq = DeviceBuffer(bytes);
  s.exp_avg = static_cast<float*>(s.device_exp_avg.data());
  s.exp_avg_sq = static_cast<float*>(s.device_exp_avg_sq.data());
  if (bytes > 0) {
    ST_CHECK_CUDA(cudaMemset(s.exp_avg, 0, bytes));
    ST_CHECK_CUDA(cudaMemset(s.exp_avg_sq, 0, bytes));
  }
}

// Cuts every segment into chunks of at most kAdamWChunkElements (the last of a segment may be shorter) and
// uploads the table (again when gradients moved: AdamW::bind_shards). Ends with a device synchronization, so kernels on any stream (non-blocking ones
// do not wait for the legacy stream the memsets and the copy ran on) see zeroed states and the table.
void AdamW::upload_chunk_table() {
  ST_CHECK_CUDA(cudaDeviceSynchronize());  // a rebuilt table (moved gradients): no update still reads the old one
  std::vector<kernels::AdamWChunk> chunks;
  segment_chunks_.assign(1, 0);
  for (const Segment& g : segments_) {
    kernels::append_adamw_chunks(chunks, g.param, g.grad, g.exp_avg, g.exp_avg_sq, g.n, g.decay);
    segment_chunks_.push_back(static_cast<int64_t>(chunks.size()));
  }
  if (!chunks.empty()) {
    chunk_table_ = DeviceBuffer(chunks.size() * sizeof(kernels::AdamWChunk));
    ST_CHECK_CUDA(cudaMemcpy(chunk_table_.data(), chunks.data(), chunk_table_.size(), cudaMemcpyHostToDevice));
  }
  ST_CHECK_CUDA(cudaDeviceSynchronize());
}

void AdamW::step_device(double lr, double grad_scale, StreamRef stream, int64_t first_chunk, int64_t chunks) {
  const detail::StepScalars sc = detail::step_scalars(config_, steps_, lr, grad_scale);
  kernels::AdamWScalars k;
  k.beta1 = sc.beta1;
  k.beta2 = sc.beta2;
  k.step_size = sc.step_size;
  k.inv_sqrt_bc2 = sc.inv_sqrt_bc2;
  k.eps = sc.eps;
  k.grad_scale = sc.grad_scale;
  k.decay_factor = sc.decay_factor;
  kernels::adamw_step(static_cast<const kernels::AdamWChunk*>(chunk_table_.data()) + first_chunk, chunks, k, stream);
}

namespace detail {

void device_copy_sync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  ST_CHECK_CUDA(cudaDeviceSynchronize());
  ST_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // A copy from pageable host memory may return before it lands: make it visible to every stream.
  ST_CHECK_CUDA(cudaDeviceSynchronize());
}

void device_grad_sq_sum_start(const std::vector<fsdp::ShardView>& shards, Communicator* device_axis, StreamRef stream,
                              DeviceBuffer& scratch, PinnedBuffer& host, CudaEvent& copied) {
  // Layout of the scratch: the accumulated double first, the sum-of-squares workspace from byte 256.
  constexpr size_t kWorkspaceOffset = 256;
  const size_t workspace_bytes = kernels::sum_squares_workspace_bytes();
  if (scratch.size() < kWorkspaceOffset + workspace_bytes) scratch = DeviceBuffer(kWorkspaceOffset + workspace_bytes);
  if (host.size() < sizeof(double)) host = PinnedBuffer(sizeof(double));
  auto* sum = static_cast<double*>(scratch.data());
  void* workspace = static_cast<char*>(scratch.data()) + kWorkspaceOffset;
  auto s = static_cast<cudaStream_t>(stream.handle);
  ST_CHECK_CUDA(cudaMemsetAsync(sum, 0, sizeof(double), s));
  for (const fsdp::ShardView& v : shards) {
    if (v.numel == 0) continue;
    kernels::sum_squares(DType::F32, v.grad, v.numel, sum, kernels::ReduceInto::Accumulate, workspace, workspace_bytes,
                         stream);
  }
  if (device_axis) device_axis->all_reduce(sum, sum, 1, DType::F64, ReduceOp::Sum, stream);
  ST_CHECK_CUDA(cudaMemcpyAsync(host.data(), sum, sizeof(double), cudaMemcpyDeviceToHost, s));
  copied.record(stream);
}

}  // namespace detail
}  // namespace shardtrain::optim
