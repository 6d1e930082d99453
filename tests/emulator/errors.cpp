// The CUDA emulator's errors (SHARDTRAIN_CUDA=EMULATED): the last error a failed call left, as
// cudaGetLastError reads and clears it, and the names and texts of the codes the emulator returns.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "tests/emulator/cuda_emulator.hpp"

namespace shardtrain::cuda_emulator {
namespace {

std::atomic<cudaError_t> last_error{cudaSuccess};  // one per process (CUDA keeps one per host thread)

}  // namespace

cudaError_t record_error(cudaError_t e, const std::string& message) {
  if (!message.empty()) std::fprintf(stderr, "cuda emulator: %s\n", message.c_str());
  last_error.store(e);
  return e;
}

}  // namespace shardtrain::cuda_emulator

using shardtrain::cuda_emulator::last_error;

extern "C" {

cudaError_t CUDARTAPI cudaGetLastError(void) { return last_error.exchange(cudaSuccess); }

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return last_error.load(); }

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error (CUDA emulator)";
  }
}

}  // extern "C"
