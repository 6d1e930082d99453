// Built without CUDA: the CUDA checks exist so code compiles, and report that no CUDA is built in.
#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"

namespace shardtrain::detail {
namespace {
void no_cuda(const char* lib, int status, const char* statement, const char* file, int line) {
  if (status == 0) return;
  throw_library_error(lib, ExitCode::Device, fmt::format("status {} (shardtrain was built without CUDA)", status), statement,
                      file, line);
}
}  // namespace
void check_cuda(int s, const char* st, const char* f, int l) { no_cuda("CUDA", s, st, f, l); }
void check_cublas(int s, const char* st, const char* f, int l) { no_cuda("cuBLAS", s, st, f, l); }
void check_nccl(int s, const char* st, const char* f, int l) { no_cuda("NCCL", s, st, f, l); }
void check_kernel_launch(const char*, const char*, int) {}
}  // namespace shardtrain::detail
