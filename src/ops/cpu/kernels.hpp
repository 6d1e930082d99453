// The CPU kernels behind CpuOps, one file per op family (gemm, elementwise, rmsnorm, rope, attention,
// cross_entropy): cpu::<op>(Context&, the op's parameters) for each op of op_list.inc.
#pragma once

#include "common.hpp"

namespace shardtrain::ops::cpu {

#define SHARDTRAIN_OP(R, name, params, args) R name(Context& ctx, SHARDTRAIN_OP_UNPAREN params);
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

// gemm.cpp: raw row-major GEMM in compute type A (float -> sgemm, double -> dgemm), split over `threads`.
template <typename A>
void gemm_raw(int threads, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda,
              const A* b, int64_t ldb, A beta, A* c, int64_t ldc);

}  // namespace shardtrain::ops::cpu
