// The backend-neutral op interface the model is written against. One implementation per backend: the CPU
// one (OpenBLAS + OpenMP loops, cpu_ops.hpp) and the CUDA one (kernels/, cuBLASLt, cuDNN; cuda_ops.hpp). The
// ops themselves are declared once, in op_list.inc, and expanded here and in both backends.
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

// op_list.inc's parameter and argument lists without their parentheses, for the backends' forwarders.
#define SHARDTRAIN_OP_UNPAREN(...) __VA_ARGS__

class Ops {
 public:
  virtual ~Ops() = default;
  virtual DeviceKind device() const = 0;
  virtual void set_stream(StreamRef stream) = 0;
  // The stream ops run on (the null stream until set_stream; always the null stream on the CPU): what a caller
  // copies a kernel's inputs on, synchronizes before reading its results, or orders other streams after.
  virtual StreamRef stream() const = 0;
  // Another Ops of the same backend for a side stream, without a GEMM workspace (the FSDP engine's casts and adds
  // beside compute). Its own stream is the null stream until set_stream.
  virtual std::unique_ptr<Ops> make_side_ops() const = 0;

  // The ops, one pure virtual member each, as op_list.inc declares them (with what each computes).
#define SHARDTRAIN_OP(R, name, params, args) virtual R name params = 0;
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

  // Deferred losses: one host read per training step instead of one per loss call (on a GPU each read is a
  // synchronization). While on, cross_entropy and linear_cross_entropy return zero sums and add theirs to
  // the backend's running total, in call order; take_loss() returns the total since the last take_loss()
  // and starts it again from zero. On a GPU, take_loss() is where a bad target recorded by a kernel
  // surfaces as DataError. Off by default.
  virtual void defer_loss(bool on) = 0;
  virtual LossSums take_loss() = 0;
};

}  // namespace shardtrain::ops
