// One error-check macro family for MPI, HDF5, CUDA, cuBLAS(Lt) and NCCL calls.
// A failure throws LibraryError whose message carries the statement, file:line, rank, host and the
// library's own description. The header needs none of the libraries' headers: status codes travel as
// integers and are described in check.cpp / check_cuda.cpp.
#pragma once

#include <cstdint>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::detail {

[[noreturn]] void throw_library_error(const char* library, ExitCode code, const std::string& what, const char* statement,
                                      const char* file, int line);
void check_mpi(int status, const char* statement, const char* file, int line);
// HDF5 returns a negative herr_t/hid_t on failure; the value is passed through on success.
int64_t check_hdf5(int64_t status, const char* statement, const char* file, int line);
void check_cuda(int status, const char* statement, const char* file, int line);
void check_cublas(int status, const char* statement, const char* file, int line);
void check_nccl(int status, const char* statement, const char* file, int line);
// After a kernel launch: the launch error, and in debug builds a device synchronize, so an
// asynchronous fault is reported at the kernel that caused it.
void check_kernel_launch(const char* kernel, const char* file, int line);

}  // namespace shardtrain::detail

#define ST_CHECK_MPI(stmt) ::shardtrain::detail::check_mpi((stmt), #stmt, __FILE__, __LINE__)
#define ST_CHECK_HDF5(stmt) ::shardtrain::detail::check_hdf5(static_cast<int64_t>(stmt), #stmt, __FILE__, __LINE__)
#define ST_CHECK_CUDA(stmt) ::shardtrain::detail::check_cuda(static_cast<int>(stmt), #stmt, __FILE__, __LINE__)
#define ST_CHECK_CUBLAS(stmt) ::shardtrain::detail::check_cublas(static_cast<int>(stmt), #stmt, __FILE__, __LINE__)
#define ST_CHECK_NCCL(stmt) ::shardtrain::detail::check_nccl(static_cast<int>(stmt), #stmt, __FILE__, __LINE__)
#define ST_CHECK_KERNEL(name) ::shardtrain::detail::check_kernel_launch((name), __FILE__, __LINE__)
