// The CPU backend: GEMMs through OpenBLAS (split over OpenMP threads), everything else in OpenMP loops
// written to vectorize.
// All loops use static schedules and fixed reduction orders, so results are bit-reproducible for a
// given thread count (and most ops for any thread count; see docs/model.md).
#pragma once

#include <memory>

#include "shardtrain/ops/ops.hpp"

namespace shardtrain::ops {

struct CpuOpsOptions {
  int threads = 0;  // OpenMP and OpenBLAS threads; 0 = the cores this process may use (usable_cores())
};

// OpenBLAS keeps its thread count process-wide: creating a CPU backend sets it to 1, because the backend
// splits each GEMM over its own OpenMP threads (one thread pool; see docs/model.md).
std::unique_ptr<Ops> make_cpu_ops(const CpuOpsOptions& options = {});

// The machine's fp32 GEMM rate, for "% of peak" figures: an (n x n) @ (n x n) sgemm timed `repeats` times
// after one warm-up, both as one multi-threaded OpenBLAS call and split over OpenMP threads the way the
// CPU backend runs its GEMMs. Leaves OpenBLAS single-threaded, as the backend expects.
struct SgemmRate {
  double openblas_gflops = 0;  // median, OpenBLAS with `threads` threads
  double backend_gflops = 0;   // median, the backend's split
  double best_gflops = 0;      // the fastest single call of either: a busy machine slows calls, never speeds them
  double peak_gflops() const { return openblas_gflops > backend_gflops ? openblas_gflops : backend_gflops; }
};
SgemmRate measure_cpu_sgemm(int threads, int64_t n = 2048, int repeats = 5);

}  // namespace shardtrain::ops
