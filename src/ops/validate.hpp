// Argument checks both op backends make: the require helpers, and one validator per op for what the CPU and
// CUDA backends check alike, with the same messages. What differs between backends (where a tensor's memory
// must be, which float dtypes they compute in) comes in through TensorChecks, one per backend.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <utility>

#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {

// Throws InternalError "<op>: <message>" unless ok.
template <typename... Args>
inline void require(bool ok, const char* op, fmt::format_string<Args...> f, Args&&... args) {
  if (!ok) throw InternalError(fmt::format("{}: {}", op, fmt::format(f, std::forward<Args>(args)...)));
}

void require_numel(const Tensor& t, int64_t n, const char* op, const char* name);

// The checks of one tensor argument that differ between backends. The CPU backend's is in cpu/common.hpp,
// the CUDA backend's in cuda/context.hpp.
class TensorChecks {
 public:
  // t is bound and its memory is where the backend computes (host or device memory).
  virtual void require_resident(const Tensor& t, const char* op, const char* name) const = 0;
  // t is resident and of a float dtype the backend computes in.
  virtual void require_float(const Tensor& t, const char* op, const char* name) const = 0;
  // t is a float tensor the op next compares (dtype and size) with one already checked; both backends
  // check it as require_float does (bound, resident, a float dtype), before the comparison.
  virtual void require_peer(const Tensor& t, const char* op, const char* name) const = 0;

 protected:
  ~TensorChecks() = default;
};

// t is resident and I32.
void require_i32(const TensorChecks& checks, const Tensor& t, const char* op, const char* name);

// f64 never mixes with the fp32 family: an op whose main tensor is f64 needs every float tensor f64.
void require_same_family(const Tensor& main, const Tensor& other, const char* op, const char* name);

// Stats saved for backward (rstd, lse): resident, f32 (f64 when the activations are f64), n elements.
void require_stats(const TensorChecks& checks, const Tensor& stats, const Tensor& activations, int64_t n, const char* op,
                   const char* name);

// ----------------------------------------------------------------------------------------------- one per op

struct MatmulDims {
  int64_t m, n, k;  // op(a) (M, K), op(b) (K, N), c (M, N)
};
MatmulDims validate_matmul(const TensorChecks& checks, Transpose ta, Transpose tb, const Tensor& a, const Tensor& b,
                           const Tensor& c);

// matmul's checks on (a, b, out), and c: out's shape and dtype, out itself or disjoint from it and from a and b.
MatmulDims validate_matmul_add(const TensorChecks& checks, Transpose ta, Transpose tb, const Tensor& a, const Tensor& b,
                               const Tensor& c, const Tensor& out);

void validate_copy(const TensorChecks& checks, const Tensor& src, const Tensor& dst);
void validate_add(const TensorChecks& checks, const Tensor& x, const Tensor& y);

struct EmbeddingDims {
  int64_t tokens, vocab, dim;  // ids (N), table (V, D)
};
EmbeddingDims validate_embedding_forward(const TensorChecks& checks, const Tensor& ids, const Tensor& table,
                                         const Tensor& out);
EmbeddingDims validate_embedding_backward(const TensorChecks& checks, const Tensor& ids, const Tensor& dout,
                                          const Tensor& dtable);

struct RowDims {
  int64_t rows, cols;  // a tensor folded to (rows, last dim)
};

// SwiGLU's gate_up (2 N F elements in `layout`) against out (forward) or dout (backward), folded to (N, F), named
// out_name; for the backward also dgate_up (undefined in the forward): gate_up's dtype and shape, gate_up itself
// or disjoint from it. Returns (N, F).
RowDims validate_swiglu(const TensorChecks& checks, const char* op, const Tensor& gate_up, GateUpLayout layout,
                        const Tensor& out, const char* out_name, const Tensor& dgate_up);
// x, weight, y and residual. The backend then checks h_out (its messages differ between the backends) and
// rstd (require_stats).
RowDims validate_rmsnorm_forward(const TensorChecks& checks, const Tensor& x, const Tensor& residual, const Tensor& weight,
                                 const Tensor& y);
// h, weight and dweight. The backend then checks dy, dh, dh_extra (messages differ) and rstd (require_stats).
RowDims validate_rmsnorm_backward(const TensorChecks& checks, const Tensor& h, const Tensor& weight, const Tensor& dweight);

void validate_rope(const TensorChecks& checks, const Tensor& x, const Tensor& positions);

struct QkvDims {
  int64_t tokens, heads, kv_heads, head_dim;  // N, H, Hkv, Dh
};
// rope_qkv_forward and _backward: the packed (N, (H + 2 Hkv) Dh) tensor and the three (N, heads, Dh) ones, named
// by names[0..3] (qkv, q, k, v or dqkv, dq, dk, dv), all one float dtype, no two of the four overlapping.
QkvDims validate_rope_qkv(const TensorChecks& checks, const char* op, const Tensor& qkv, const Tensor& positions,
                          const Tensor& q, const Tensor& k, const Tensor& v, const char* const names[4]);

// The shape, q, k, v, the mask and lse, as attention_forward and attention_backward both take them. The
// backward's other tensors are the backend's to check (messages differ).
void validate_attention(const TensorChecks& checks, const char* op, const AttentionShape& shape, const Tensor& q,
                        const Tensor& k, const Tensor& v, const AttentionMask& mask, const Tensor& lse);
void validate_attention_forward(const TensorChecks& checks, const AttentionShape& shape, const Tensor& q, const Tensor& k,
                                const Tensor& v, const AttentionMask& mask, const Tensor& out, const Tensor& lse);

struct BatchDims {
  int64_t batch, seq;  // (B, S)
};
// document_ids may be undefined.
BatchDims validate_attention_segments(const TensorChecks& checks, const Tensor& input_ids, const Tensor& document_ids,
                                      const Tensor& segments, const Tensor& positions);

// logits (N, V); dlogits may be undefined.
RowDims validate_cross_entropy(const TensorChecks& checks, const Tensor& logits, const Tensor& targets,
                               const Tensor& dlogits);

struct LinearLossDims {
  int64_t tokens, hidden, vocab;  // h (N, D), weight (V, D)
};
// dh undefined: loss only (dweight and dweight_beta are not checked).
LinearLossDims validate_linear_cross_entropy(const TensorChecks& checks, const Tensor& h, const Tensor& weight,
                                             const Tensor& targets, const Tensor& dh, const Tensor& dweight,
                                             double dweight_beta);

}  // namespace shardtrain::ops
