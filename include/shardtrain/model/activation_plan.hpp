// The activation memory of one (batch, seq) micro-batch, planned once per shape and placed in one arena.
// Without checkpointing every decoder layer keeps its own saved tensors; with per-layer checkpointing only
// the layer inputs (hidden[l]) are kept and all layers share one set, refilled by the recompute in backward.
// Shapes: N = batch * seq tokens, D hidden, Dkv = kv heads * head_dim, F intermediate, H heads.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shardtrain/model/config.hpp"
#include "shardtrain/ops/tensor.hpp"

namespace shardtrain::model {

enum class Checkpointing { None, PerLayer };

// Activation memory that backward is done with: from the end of decoder layer `layer`'s backward (its
// after_backward hook) until the next forward writes it again. Bytes from the arena's start.
struct FreedInBackward {
  int layer = 0;
  size_t offset = 0, bytes = 0;
};

// What a decoder layer saves for its backward.
struct LayerActivations {
  ops::Tensor n1, rstd1;     // input_layernorm output (N, D) and 1/rms (N)
  ops::Tensor q, k, v;       // after RoPE: (N, D), (N, Dkv), (N, Dkv)
  ops::Tensor attn, lse;     // attention output before o_proj (N, D); log-sum-exp (B, H, S)
  ops::Tensor h, n2, rstd2;  // x + attention (N, D); post_attention_layernorm output (N, D); (N)
  // gate and up, 2 N F elements: (N, 2F) rows of [gate | up] when one GEMM with [Wg; Wu] wrote them, else (2, N, F)
  // (ops::GateUpLayout; the layer's forward decides, decoder_layer.cpp); backward overwrites them with their gradients
  ops::Tensor gate_up;
  ops::Tensor act;  // silu(gate) * up (N, F): down_proj's input, kept for its weight gradient
};

// Temporaries reused by every layer.
struct Workspace {
  ops::Tensor attn_out;        // o_proj output (N, D)
  ops::Tensor grad_hidden[2];  // gradient of the residual stream, ping-pong (N, D)
  ops::Tensor dh, dn, dattn;   // (N, D)
  ops::Tensor dq, dk, dv;      // (N, D), (N, Dkv), (N, Dkv)
  ops::Tensor dact;            // (N, F)
  // (N, D + 2 Dkv): the fused q/k/v projection's output in forward (rows of [q | k | v], before RoPE), its gradient
  // in backward. It shares dact's memory: dact lives only inside the MLP's backward, qkv never across it.
  ops::Tensor qkv;
};

class ActivationPlan {
 public:
  ActivationPlan(const LlamaConfig& config, int64_t batch, int64_t seq, DType dtype, Checkpointing checkpointing);
  ActivationPlan(const ActivationPlan&) = delete;
  ActivationPlan& operator=(const ActivationPlan&) = delete;

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  size_t bytes() const { return bytes_; }
  // Every buffer starts at a multiple of this: 256 bytes, what cuBLASLt's fastest kernels want.
  static constexpr size_t kAlignment = 256;
  // Points every view into base (bytes() long, kAlignment-aligned) in the memory of `device`.
  void place(void* base, DeviceKind device = DeviceKind::Cpu);
  std::string describe() const;  // one line per buffer: name, dtype, shape, bytes
  // The layers' inputs and outputs (hidden[l + 1] once layer l's backward is done, hidden[0] with layer 0's); and
  // without checkpointing each layer's saved tensors (one span per layer, adjacent in layer order), with per-layer
  // checkpointing the one recomputed set, free once layer 0's backward is done.
  const std::vector<FreedInBackward>& freed_in_backward() const { return freed_; }

  std::vector<ops::Tensor> hidden;  // (N, D) x L+1: hidden[l] is layer l's input, hidden[L] the last output
  std::vector<LayerActivations> layers;
  ops::Tensor segments, positions;     // (B, S) I32
  ops::Tensor final_norm, final_rstd;  // model.norm output (N, D) and (N)
  Workspace work;

 private:
  struct Entry {
    std::string name;
    ops::Tensor* view;
    size_t offset;
  };
  // reserve: at least this many bytes (for a view that shares the entry).
  void add(std::string name, ops::Tensor* view, DType dtype, ops::Shape shape, size_t reserve = 0);
  // view starts where the last entry added starts (it fits in that entry's bytes).
  void share_last(std::string name, ops::Tensor* view, DType dtype, ops::Shape shape);
  void add_layer(const std::string& prefix, LayerActivations& a, DType dtype, DType stats);

  int64_t batch_, seq_;
  Checkpointing checkpointing_;
  ops::Shape token_shape_, kv_shape_, mlp_shape_, lse_shape_, row_shape_;  // (N, D), (N, Dkv), (N, F), (B, H, S), (N)
  LayerActivations shared_;
  std::vector<Entry> entries_;
  std::vector<Entry> shared_views_;  // offset: that of the entry they share
  std::vector<FreedInBackward> freed_;
  size_t bytes_ = 0;
};

}  // namespace shardtrain::model
