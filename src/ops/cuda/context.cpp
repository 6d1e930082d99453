// The CUDA backend's context: scratch growth, the readback of loss sums and data errors.
#include "context.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "cudnn_attention.hpp"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::ops::cuda {
namespace {

std::string describe(const kernels::DataErrorRecord& e) {
  switch (static_cast<kernels::DataErrorCode>(e.code)) {
    case kernels::DataErrorCode::TokenId:
      return fmt::format("token id {} at position {} is outside the vocabulary [0, {})", e.value, e.index, e.bound);
    case kernels::DataErrorCode::Target:
      return fmt::format("target {} at position {} is outside the vocabulary [0, {}) and is not ignore_index {}", e.value,
                         e.index, e.bound, e.aux);
    case kernels::DataErrorCode::DocumentId: {
      const int64_t seq = e.bound > 0 ? e.bound : 1;
      return fmt::format("document id {} at (row {}, position {}) is negative", e.value, e.index / seq, e.index % seq);
    }
    case kernels::DataErrorCode::SequenceCount:
      return fmt::format(
          "cuDNN attention: more runs of documents than the bound of {} given for the batch (run {} "
          "starts at token {})",
          e.bound, e.value, e.index);
    case kernels::DataErrorCode::DocumentSplit: {
      const int64_t seq = e.bound > 0 ? e.bound : 1;
      return fmt::format(
          "cuDNN attention: document {} has two separate runs in row {} (the second starts at position "
          "{}); its packed-documents layout needs each document contiguous within a row",
          e.value, e.index / seq, e.index % seq);
    }
    case kernels::DataErrorCode::None: break;
  }
  return fmt::format("bad input recorded by a kernel (code {}, value {}, index {})", e.code, e.value, e.index);
}

}  // namespace

void* Scratch::get(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (buffer_.size() >= bytes) return buffer_.data();
  if (buffer_.data() != nullptr) {
    ST_CHECK_CUDA(cudaDeviceSynchronize());  // the old buffer may still be in use by queued work
    buffer_ = DeviceBuffer();
  }
  // A little headroom, so that a slowly growing shape does not reallocate every call.
  buffer_ = DeviceBuffer(bytes + bytes / 8);
  return buffer_.data();
}

Context::Context(const CudaOpsOptions& opts)
    : options(opts),
      readback_device(sizeof(Readback)),
      readback_host(sizeof(Readback)),
      gemm(opts.gemm_workspace_bytes, opts.f32_matmul) {
  ST_CHECK_CUDA(cudaMemset(readback_device.data(), 0, sizeof(Readback)));
  ST_CHECK_CUDA(cudaDeviceSynchronize());
  ST_CHECK_CUDA(cudaEventCreateWithFlags(&stream_switch, cudaEventDisableTiming));
  deterministic_attention = deterministic_attention_from_env();
}

Context::~Context() {
  // Queued work may still use the scratch buffers freed next; errors cannot be reported from here.
  cudaDeviceSynchronize();
  if (stream_switch) cudaEventDestroy(stream_switch);
}

CudnnAttention& Context::cudnn_attention() {
  if (!cudnn) cudnn = std::make_unique<CudnnAttention>();
  return *cudnn;
}

void Context::switch_stream(StreamRef next) {
  if (next.handle == stream.handle) return;
  ST_CHECK_CUDA(cudaEventRecord(stream_switch, static_cast<cudaStream_t>(stream.handle)));
  ST_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(next.handle), stream_switch, 0));
  stream = next;
}

Readback Context::synchronize_and_check() {
  ST_CHECK_CUDA(cudaMemcpyAsync(readback_host.data(), readback_device.data(), sizeof(Readback), cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(stream.handle)));
  ST_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
  Readback r;
  std::memcpy(&r, readback_host.data(), sizeof(Readback));
  if (r.error.code != 0) {
    kernels::data_error_reset(error_record(), stream);
    throw DataError(describe(r.error));
  }
  return r;
}

}  // namespace shardtrain::ops::cuda
