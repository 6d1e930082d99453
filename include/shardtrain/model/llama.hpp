// LlamaForCausalLM forward and backward over a (batch, seq) micro-batch, on any ops backend.
// The model owns activations (ActivationPlan, one arena per shape) but never parameters: they come through
// ParamBinding, which a driver fills, possibly from ModuleHooks callbacks at module boundaries.
//
// Usage (one process):
//   LlamaModel model(config, *ops);                  DenseParams params(model.spec());
//   params.initialize(); params.bind(model.binding()); params.zero_grads();
//   LossResult r = model.forward_backward(batch);    // gradients accumulate into the bound grad views
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/model/binding.hpp"
#include "shardtrain/model/hooks.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/ops/ops.hpp"

namespace shardtrain::model {

// q, k, v as one GEMM with [Wq; Wk; Wv] and gate, up as one with [Wg; Wu], wherever their parameters (and, in
// backward, their gradients) are bound adjacent in memory (ParamBinding::params_adjacent: DenseParams and the
// FSDP units lay them out so, unless a wrap policy puts them in different units); or always one GEMM per
// projection (Never: the reference the fused path is tested against).
enum class ProjectionFusion { WhereAdjacent, Never };

struct ModelOptions {
  DType activation_dtype = DType::F32;  // F32 or BF16 (storage; math in fp32); F64 on the CPU for checks
  Checkpointing checkpointing = Checkpointing::None;
  int32_t ignore_index = -100;    // targets equal to this add no loss (the seed uses the pad id)
  int64_t loss_chunk_tokens = 0;  // tokens per lm_head + loss chunk; 0 = about 16M logits per chunk
  ProjectionFusion projection_fusion = ProjectionFusion::WhereAdjacent;
};

// How a decoder layer ran a group of projections the last time: not yet, one GEMM for the group, or one each.
enum class ProjectionPath : uint8_t { NotRun, Fused, Separate };
struct LayerProjections {
  ProjectionPath qkv_forward = ProjectionPath::NotRun, qkv_backward = ProjectionPath::NotRun;
  ProjectionPath gate_up_forward = ProjectionPath::NotRun, gate_up_backward = ProjectionPath::NotRun;
};

struct Batch {
  ops::Tensor input_ids;      // (B, S) I32
  ops::Tensor targets;        // (B, S) I32; ignore_index where no loss is wanted
  ops::Tensor document_ids;   // optional (B, S) I32: packed documents attend only within themselves, and
                              // their positions restart at 0
  int32_t pad_token_id = -1;  // >= 0: positions whose input is this id attend to nothing and are not attended
  // With document_ids: the number of runs of one document in the batch's rows (each row's runs counted
  // apart), or an upper bound; 0 = not known. A hint for choosing the attention kernel (ops::AttentionMask).
  int64_t document_runs = 0;
};

struct StepOptions {
  // Gradients are of loss_scale * (sum of token losses). 0 = 1 / (tokens counted in this micro-batch), the
  // mean. With gradient accumulation or several ranks, pass 1 / (tokens of the whole global batch).
  double loss_scale = 0;
};

struct LossResult {
  double loss_sum = 0;  // sum of -log p(target) over counted tokens
  int64_t tokens = 0;   // targets not equal to ignore_index
  double mean() const { return tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0; }
};

class LlamaModel {
 public:
  LlamaModel(const LlamaConfig& config, ops::Ops& ops, const ModelOptions& options = {});
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const ModelOptions& options() const { return options_; }
  ParamBinding& binding() { return binding_; }
  void set_hooks(ModuleHooks* hooks);  // nullptr: none. Not owned.

  // Loss and gradients (accumulated into the bound gradient views).
  LossResult forward_backward(const Batch& batch, const StepOptions& step = {});
  // Loss only (evaluation): no gradient views needed.
  LossResult forward(const Batch& batch);
  // Generation: the logits of each row's last position, logits (B, V) F32 on the host, from input_ids
  // (B, S) I32. Forward hooks are called as in forward().
  void last_logits(const ops::Tensor& input_ids, const ops::Tensor& logits);
  // Activation buffers for this shape: planned and allocated on first use, reused while the shape repeats.
  const ActivationPlan& prepare(int64_t batch, int64_t seq);
  // Where the current plan's arena starts (null before the first prepare): ActivationPlan::freed_in_backward's
  // offsets are from here. The FSDP engine keeps gradient shards there once backward is done with them.
  void* arena_base() const;
  // How layer `layer` ran its q/k/v and gate/up projections last (fused or not: ProjectionFusion).
  const LayerProjections& projections(int layer) const { return projections_.at(static_cast<size_t>(layer)); }

 private:
  enum class Mode { Forward, ForwardBackward, LastLogits };
  LossResult run(const Batch& batch, const StepOptions& step, Mode mode, const ops::Tensor* logits = nullptr);

  ModelSpec spec_;
  ops::Ops* ops_;
  ModelOptions options_;
  ParamBinding binding_;
  ModuleHooks no_hooks_;
  ModuleHooks* hooks_ = &no_hooks_;
  std::unique_ptr<ActivationPlan> plan_;
  std::vector<LayerProjections> projections_;  // per layer
  ops::HostBuffer arena_;                      // the activations on the CPU backend
  DeviceBuffer device_arena_;                  // and on a GPU backend
};

}  // namespace shardtrain::model
