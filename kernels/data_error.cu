// Resetting the data-error record (data_error.cuh).
#include "kernels/data_error.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {

void data_error_reset(DataErrorRecord* record, StreamRef stream) {
  ST_CHECK_CUDA(cudaMemsetAsync(record, 0, sizeof(DataErrorRecord), detail::cuda_stream(stream)));
}

}  // namespace shardtrain::kernels
