// Resetting the data-error record (data_error.cuh).
#include <cuda_runtime.h>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {

void data_error_reset(DataErrorRecord* record, StreamRef stream) {
  ST_CHECK_CUDA(cudaMemsetAsync(record, 0, sizeof(DataErrorRecord), static_cast<cudaStream_t>(stream.handle)));
}

}  // namespace shardtrain::kernels
