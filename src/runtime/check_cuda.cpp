// The CUDA half of the library error checks: descriptions from cudart, cuBLAS and NCCL.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"

namespace shardtrain::detail {

void check_cuda(int status, const char* statement, const char* file, int line) {
  if (status == cudaSuccess) return;
  const auto e = static_cast<cudaError_t>(status);
  const ExitCode code = ExitCode::Device;
  throw_library_error("CUDA", code, fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)), statement, file,
                      line);
}

void check_cublas(int status, const char* statement, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const auto s = static_cast<cublasStatus_t>(status);
  throw_library_error("cuBLAS", ExitCode::Device, fmt::format("{} ({})", cublasGetStatusString(s), cublasGetStatusName(s)),
                      statement, file, line);
}

void check_nccl(int status, const char* statement, const char* file, int line) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  const auto r = static_cast<ncclResult_t>(status);
  const char* last = ncclGetLastError(nullptr);
  throw_library_error("NCCL", ExitCode::Comm,
                      fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""), statement,
                      file, line);
}

void check_kernel_launch(const char* kernel, const char* file, int line) {
  check_cuda(cudaGetLastError(), kernel, file, line);
#ifndef NDEBUG
  check_cuda(cudaDeviceSynchronize(), kernel, file, line);
#endif
}

}  // namespace shardtrain::detail
