// The backend-neutral op interface the model is written against. One implementation per backend:
// the CPU one (OpenBLAS + OpenMP loops, cpu_ops.hpp) and CUDA (kernels/ + cuBLASLt, cuda_ops.hpp).
//
// Conventions shared by every op:
//  - Tensors are contiguous row-major views (tensor.hpp). Float tensors may be F32 or BF16 (storage;
//    arithmetic in fp32) and, on the CPU backend, F64 (arithmetic in double, used by gradient checks).
//    Index tensors are I32. "Stats" tensors saved for backward (rstd, lse) are F32, or F64 when the
//    activations are F64.
//  - Shapes in comments: N tokens (= B*S), D hidden, H query heads, Hkv key/value heads, Dh head dim,
//    F intermediate, V vocabulary.
//  - "accumulates" means out += result; every other output is overwritten.
//  - Ops run in call order on the backend's stream; an Ops object is not safe for concurrent calls.
#pragma once

#include <cstdint>
#include <memory>

#include "shardtrain/ops/rope.hpp"
#include "shardtrain/ops/tensor.hpp"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::ops {

enum class Transpose { No, Yes };
enum class RopeDirection { Forward, Backward };  // Backward applies the transposed rotation to a gradient

// How SwiGLU's gate and up (N, F each) lie in one tensor of 2 N F elements:
//   Rows:   (N, 2F), row n = gate_n then up_n: what one GEMM n2 [Wg; Wu]^T writes;
//   Halves: (2, N, F), all of gate then all of up: what two GEMMs n2 Wg^T, n2 Wu^T write.
enum class GateUpLayout { Rows, Halves };

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;     // H (query heads)
  int64_t kv_heads = 0;  // Hkv, divides H: query head h reads key/value head h / (H / Hkv)
  int64_t head_dim = 0;  // Dh
};

// Which keys a query may attend to. Causal always; with segments, query i attends key j only when
// segment[i] == segment[j] >= 0 (documents of a packed sequence). A negative segment marks padding: such a
// query attends to nothing (its output is zero, never NaN) and no query attends to it.
// What the caller knows of the segments on the host, so a backend can choose a kernel without reading them
// (the segments still decide the result; a backend may ignore the hint):
//   Causal     every segment is 0: no documents, no padding;
//   Documents  each row is contiguous runs of one document each (no padding), at most `runs` in the batch;
//   Unknown    anything else.
enum class SegmentsHint { Unknown, Causal, Documents };
struct AttentionMask {
  Tensor segments;  // (B, S) I32, or undefined: plain causal
  SegmentsHint hint = SegmentsHint::Unknown;
  int64_t runs = 0;  // Documents: an upper bound on the runs of documents in the batch (all rows together)
};

struct LossSums {
  double loss_sum = 0;  // sum of -log p(target) over counted tokens
  int64_t tokens = 0;   // tokens whose target is not ignore_index
};

enum class SumInto { Overwrite, Accumulate };  // Ops::sum_squares

class Ops {
 public:
  virtual ~Ops() = default;
  virtual DeviceKind device() const = 0;
  virtual void set_stream(StreamRef stream) = 0;
  // The stream ops run on (the null stream until set_stream; always the null stream on the CPU): what a caller
  // copies a kernel's inputs on, synchronizes before reading its results, or orders other streams after.
  virtual StreamRef stream() const = 0;

  // c = alpha * op(a) @ op(b) + beta * c; op(a): (M, K), op(b): (K, N), c: (M, N).
  // A linear layer y = x W^T with W (out, in) is matmul(No, Yes, 1, x, W, 0, y).
  virtual void matmul(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
                      const Tensor& c) = 0;
  // out = alpha * op(a) @ op(b) + c: the same as copying c into out and then matmul with beta = 1 (the same
  // bits), in one pass where the backend can (cuBLASLt reads C and writes D). c has out's shape and dtype
  // and is either out itself or does not overlap it. A residual add riding on a projection.
  virtual void matmul_add(Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, const Tensor& c,
                          const Tensor& out) = 0;

  virtual void fill(const Tensor& out, double value) = 0;
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;  // same numel, casts between float dtypes
  virtual void add(const Tensor& x, const Tensor& y) = 0;       // y += x

  // out[n, :] = table[ids[n], :]; ids (N) I32, table (V, D), out (N, D). Throws DataError on an id outside [0, V).
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // dtable[ids[n], :] += dout[n, :] (accumulates; deterministic order).
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;

  // RMSNorm with an optional fused residual add: h = x + residual (or x), y = h * rstd * weight,
  // rstd = 1 / sqrt(mean(h^2) + eps). x, residual, h_out, y: (N, D); weight (D); rstd (N).
  // h_out may be undefined when there is no residual; it may not alias x or residual.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                               const Tensor& h_out, const Tensor& y, const Tensor& rstd) = 0;
  // dh = d(y)/d(h)^T dy + dh_extra (dh_extra: the gradient reaching h by other paths, e.g. the residual
  // stream; may be undefined). dweight accumulates. h is the normalized input (x + residual).
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                                const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) = 0;

  // Rotary position embedding in the rotate-half convention (Hugging Face Llama, the seed): for i < Dh/2,
  // angle = pos * inv_freq[i] (rope.hpp: theta^(-2i/Dh), optionally rescaled);
  // (x_i, x_{i+Dh/2}) -> (x_i cos - x_{i+Dh/2} sin, x_{i+Dh/2} cos + x_i sin). x (N, heads, Dh) in place;
  // positions (N) I32.
  virtual void rope(const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) = 0;
  // q, k, v out of one projection [Wq; Wk; Wv]: qkv (N, (H + 2 Hkv) Dh), row n = q_n, k_n, v_n as one GEMM
  // n1 [Wq; Wk; Wv]^T writes it; q (N, H, Dh) and k (N, Hkv, Dh) receive it rotated (rope, Forward), v
  // (N, Hkv, Dh) a copy. q, k, v are contiguous; no two of the four overlap. positions (N) I32.
  virtual void rope_qkv_forward(const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq,
                                const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  // Its transpose: dqkv (N, (H + 2 Hkv) Dh) = rows of (rope Backward of dq, rope Backward of dk, dv), the
  // gradient at the projection's output (overwritten; disjoint from dq, dk, dv).
  virtual void rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                                 const RopeFrequencies& freq, const Tensor& dqkv) = 0;

  // Causal grouped-query attention, softmax(q k^T / sqrt(Dh) + mask) v, without repeating K/V.
  // q, out (B, S, H, Dh); k, v (B, S, Hkv, Dh); lse (B, H, S) stats: log-sum-exp of each row, -inf when
  // the row is fully masked.
  virtual void attention_forward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionMask& mask, const Tensor& out, const Tensor& lse) = 0;
  // dq, dk, dv overwritten (dk, dv summed over the query heads of each group).
  virtual void attention_backward(const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                                  const Tensor& dq, const Tensor& dk, const Tensor& dv) = 0;
  // segments (B, S) and positions (B, S) from a batch: segment = document id (0 without documents), -1 where
  // input_ids == pad_token_id (pad_token_id < 0: no padding); positions restart at 0 at each document start
  // when document_ids is defined, else 0..S-1. document_ids may be undefined.
  virtual void attention_segments(const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                                  const Tensor& segments, const Tensor& positions) = 0;

  // SwiGLU: out (N, F) = silu(gate) * up, gate and up (N, F) read from one tensor gate_up of 2 N F elements
  // laid out as `layout` says (GateUpLayout). Backward writes dgate and dup into dgate_up in the same layout;
  // dgate_up may be gate_up itself (in place), else it does not overlap it.
  virtual void swiglu_forward(const Tensor& gate_up, GateUpLayout layout, const Tensor& out) = 0;
  virtual void swiglu_backward(const Tensor& dout, const Tensor& gate_up, GateUpLayout layout,
                               const Tensor& dgate_up) = 0;

  // Cross-entropy of logits (N, V) against targets (N) I32, skipping ignore_index. When dlogits is defined it
  // receives grad_scale * d(loss_sum)/d(logits) (zero rows for ignored targets). Throws DataError on a target
  // outside [0, V) that is not ignore_index.
  virtual LossSums cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                                 double grad_scale, const Tensor& dlogits) = 0;
  // lm_head fused with the loss: logits = h W^T are formed chunk_tokens rows at a time, so (N, V) never exists.
  // h (N, D), weight (V, D). When dh is defined: dh = grad_scale * dloss/dh (overwritten) and
  // dweight += grad_scale * dloss/dW (accumulates); when dh is undefined only the loss is computed.
  virtual LossSums linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                        int32_t ignore_index, double grad_scale, int64_t chunk_tokens,
                                        const Tensor& dh, const Tensor& dweight) = 0;

  // Deferred losses: one host read per training step instead of one per loss call (on a GPU each read is a
  // synchronization). While on, cross_entropy and linear_cross_entropy return zero sums and add theirs to
  // the backend's running total, in call order; take_loss() returns the total since the last take_loss()
  // and starts it again from zero. On a GPU, take_loss() is where a bad target recorded by a kernel
  // surfaces as DataError. Off by default.
  virtual void defer_loss(bool on) = 0;
  virtual LossSums take_loss() = 0;

  // out (one F64 element in the backend's memory) = or += the sum of x^2 (x F32 or BF16; each square in fp32,
  // added in double) in an order fixed by n alone (the same bits every call): the local part of a gradient norm.
  virtual void sum_squares(const Tensor& x, const Tensor& out, SumInto mode) = 0;
};

}  // namespace shardtrain::ops
