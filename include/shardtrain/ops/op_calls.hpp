// One description per op call: what sets its cost (a key) and the work it does (FLOPs, bytes). `bench ops`
// records the calls its rows time and the model makes (src/cli/op_rows.cpp), a profile maps keys to measured
// seconds, and the timing ops (timing_ops.hpp) charge each call what the key or the work says.
//
// Work counted, as `bench ops` counts it (N tokens, D hidden, H heads, Dh head dim, V vocabulary):
//   GEMMs: 2 * M * N * K per call;
//   attention: forward 2 * B * H * S^2 * Dh (causal: half of q k^T and p v), backward twice the forward;
//   linear_cross_entropy: 2 * N * D * V for the logits, 4 * N * D * V more with the gradient (dh and dW);
//   bytes, every op: each tensor argument read once or written once at its dtype, an accumulated output read and
//   written; an embedding touches the N rows of its table it gathers or scatters, not the whole table.
// Memory-bound ops count no FLOPs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardtrain/ops/ops.hpp"

namespace shardtrain::ops {

struct OpCall {
  std::string name;   // the Ops member: "matmul", "attention_backward", ...
  std::string key;    // the op and what sets its work (dtypes, element counts, GEMM dims and transposes, whether an
                      // output accumulates), not where the tensors are: "matmul NT m 4096 n 1152 k 768 bf16 bf16 bf16"
  std::string shape;  // short, for labels: "4096x1152x768" (M x N x K), "B 8 S 512 H 12/3 Dh 64", "4096x768"
  double flops = 0;
  double bytes = 0;
  AttentionShape attention;  // attention_forward and attention_backward: their shape (zeros for other ops)
};

// A GEMM call's key read back (matmul and matmul_add keys, as DescribingOps writes them): its dims, and what else
// sets its speed, so that a GEMM a profile lacks can be priced like the nearest one it has (op_cost.hpp).
struct GemmKey {
  // transposes, a's, b's and the output's dtypes: "TN bf16 bf16 f32". A matmul that accumulates into its output
  // ("+=", beta 1), one that does not, and a matmul_add (a residual added in the epilogue) of the same dims have the
  // same form: they differ in the bytes of one tensor, not in their tiles.
  std::string form;
  int64_t m = 0, n = 0, k = 0;
};
// nullopt for a key that is not a GEMM's, or not in the format above.
std::optional<GemmKey> parse_gemm_key(std::string_view key);

// An Ops that computes nothing and describes every call to on_call, in call order. The losses return zero sums;
// defer_loss does nothing and take_loss returns zeros unless a subclass says otherwise. The attention mask's
// segments count as bytes but are not in the key (`bench ops` times plain causal attention).
class DescribingOps : public Ops {
 public:
#define SHARDTRAIN_OP(R, name, params, args) R name params final;
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP
  void defer_loss(bool) override {}
  LossSums take_loss() override { return {}; }

 protected:
  virtual void on_call(OpCall call) = 0;
};

}  // namespace shardtrain::ops
