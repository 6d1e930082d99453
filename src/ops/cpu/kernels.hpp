// The CPU kernels behind CpuOps, one file per op family (gemm, elementwise, rmsnorm, rope, attention,
// cross_entropy). Arguments mirror the Ops interface (ops.hpp), plus the backend context.
#pragma once

#include "common.hpp"

namespace shardtrain::ops::cpu {

// gemm.cpp
void matmul(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
            const Tensor& c);
// Raw row-major GEMM in compute type A (float -> sgemm, double -> dgemm), split over `threads`.
template <typename A>
void gemm_raw(int threads, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda,
              const A* b, int64_t ldb, A beta, A* c, int64_t ldc);

// elementwise.cpp
void fill(Context& ctx, const Tensor& out, double value);
void copy(Context& ctx, const Tensor& src, const Tensor& dst);
// out = alpha op(a) op(b) + c: c copied into out, then matmul with beta = 1.
void matmul_add(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b,
                const Tensor& c, const Tensor& out);
void add(Context& ctx, const Tensor& x, const Tensor& y);
void sum_squares(Context& ctx, const Tensor& x, const Tensor& out, SumInto mode);
void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out);
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable);
void swiglu_forward(Context& ctx, const Tensor& gate_up, GateUpLayout layout, const Tensor& out);
void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up, GateUpLayout layout,
                     const Tensor& dgate_up);

// rmsnorm.cpp
void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     const Tensor& h_out, const Tensor& y, const Tensor& rstd);
void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight);

// rope.cpp
void rope(Context& ctx, const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction);
void rope_qkv_forward(Context& ctx, const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq,
                      const Tensor& q, const Tensor& k, const Tensor& v);
void rope_qkv_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                       const RopeFrequencies& freq, const Tensor& dqkv);

// attention.cpp
void attention_forward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, const Tensor& out, const Tensor& lse);
void attention_backward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_segments(Context& ctx, const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                        const Tensor& segments, const Tensor& positions);

// cross_entropy.cpp
LossSums cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                       double grad_scale, const Tensor& dlogits);
LossSums linear_cross_entropy(Context& ctx, const Tensor& h, const Tensor& weight, const Tensor& targets,
                              int32_t ignore_index, double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                              const Tensor& dweight);

}  // namespace shardtrain::ops::cpu
