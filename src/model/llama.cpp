// LlamaForCausalLM: embedding, decoder layers, final norm, fused lm_head + loss; then the same in reverse.
// Per-layer activation checkpointing keeps only each layer's input and recomputes the layer in backward
// with the same ops on the same inputs, so gradients are bit-identical to the run without it.
#include "shardtrain/model/llama.hpp"

#include <vector>

#include <fmt/format.h>

#include "layer_exec.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

using ops::Tensor;

namespace {

// The segments and what the batch says of them (ops::SegmentsHint).
ops::AttentionMask attention_mask(const Batch& batch, const Tensor& segments) {
  ops::AttentionMask mask{segments};
  if (batch.pad_token_id >= 0) return mask;  // padding may sit anywhere: Unknown
  if (!batch.document_ids.defined()) {
    mask.hint = ops::SegmentsHint::Causal;
  } else if (batch.document_runs > 0) {
    mask.hint = ops::SegmentsHint::Documents;
    mask.runs = batch.document_runs;
  }
  return mask;
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& config, ops::Ops& ops, const ModelOptions& options)
    : spec_(config), ops_(&ops), options_(options), binding_(spec_), projections_(static_cast<size_t>(spec_.num_layers())) {
  if (!dtype_is_float(options.activation_dtype))
    throw ConfigError(fmt::format("model activation dtype {} is not a float type", dtype_name(options.activation_dtype)));
}

void LlamaModel::set_hooks(ModuleHooks* hooks) { hooks_ = hooks ? hooks : &no_hooks_; }

const ActivationPlan& LlamaModel::prepare(int64_t batch, int64_t seq) {
  if (batch <= 0 || seq <= 0) throw DataError(fmt::format("micro-batch shape ({}, {}) is empty", batch, seq));
  if (seq > spec_.config().max_position_embeddings)
    throw DataError(
        fmt::format("sequence length {} exceeds max_position_embeddings {}", seq, spec_.config().max_position_embeddings));
  if (!plan_ || plan_->batch() != batch || plan_->seq() != seq) {
    plan_ = std::make_unique<ActivationPlan>(spec_.config(), batch, seq, options_.activation_dtype, options_.checkpointing);
    if (ops_->device() == DeviceKind::Cuda) {
      if (device_arena_.size() < plan_->bytes()) {
        device_arena_ = DeviceBuffer();  // free the old arena before asking for the larger one
        device_arena_ = DeviceBuffer(plan_->bytes());
      }
      plan_->place(device_arena_.data(), DeviceKind::Cuda);
    } else {
      arena_.reserve(plan_->bytes());
      plan_->place(arena_.data());
    }
  }
  return *plan_;
}

void* LlamaModel::arena_base() const {
  if (!plan_) return nullptr;
  return ops_->device() == DeviceKind::Cuda ? device_arena_.data() : arena_.data();
}

LossResult LlamaModel::forward_backward(const Batch& batch, const StepOptions& step) {
  return run(batch, step, Mode::ForwardBackward);
}

LossResult LlamaModel::forward(const Batch& batch) { return run(batch, StepOptions{}, Mode::Forward); }

void LlamaModel::last_logits(const Tensor& input_ids, const Tensor& logits) {
  const int64_t b = input_ids.shape[0], v = spec_.config().vocab_size;
  if (logits.dtype != DType::F32 || logits.shape.rank != 2 || logits.shape[0] != b || logits.shape[1] != v)
    throw InternalError(fmt::format("last_logits: logits must be ({}, {}) f32, got {}", b, v, logits.describe()));
  std::vector<int32_t> unused(static_cast<size_t>(input_ids.numel()), options_.ignore_index);
  Batch batch;
  batch.input_ids = input_ids;
  batch.targets = ops::make_tensor(unused.data(), DType::I32, input_ids.shape);
  run(batch, StepOptions{}, Mode::LastLogits, &logits);
}

LossResult LlamaModel::run(const Batch& batch, const StepOptions& step, Mode mode, const Tensor* logits) {
  const Tensor& ids = batch.input_ids;
  if (ids.dtype != DType::I32 || ids.shape.rank != 2)
    throw DataError(fmt::format("input_ids must be (batch, seq) i32, got {}", ids.describe()));
  if (batch.targets.dtype != DType::I32 || !(batch.targets.shape == ids.shape))
    throw DataError(fmt::format("targets {} must match input_ids {}", batch.targets.describe(), ids.describe()));
  const int64_t b = ids.shape[0], s = ids.shape[1], n = b * s;
  const ActivationPlan& plan = prepare(b, s);
  const LlamaConfig& c = spec_.config();
  ops::Ops& ops = *ops_;
  const bool grads = mode == Mode::ForwardBackward;
  const bool ckpt = options_.checkpointing == Checkpointing::PerLayer;
  const auto layers = static_cast<int>(c.num_hidden_layers);

  ops.attention_segments(ids, batch.pad_token_id, batch.document_ids, plan.segments, plan.positions);
  detail::Exec e{ops,
                 spec_,
                 binding_,
                 *hooks_,
                 ops::AttentionShape{b, s, c.num_attention_heads, c.num_key_value_heads, c.head_dim()},
                 attention_mask(batch, plan.segments),
                 plan.positions.reshaped({n}),
                 options_.projection_fusion,
                 projections_};
  const Tensor flat_ids = ids.reshaped({n});
  const Tensor flat_targets = batch.targets.reshaped({n});

  // ---- forward
  {
    detail::Scope sc(e, spec_.embed_module(), ForwardPhase::Normal);
    ops.embedding_forward(flat_ids, binding_.param(spec_.embed_param()), plan.hidden[0]);
  }
  for (int l = 0; l < layers; ++l) {
    const auto li = static_cast<size_t>(l);
    detail::decoder_layer_forward(e, l, plan.layers[li], plan.work, plan.hidden[li], plan.hidden[li + 1],
                                  ForwardPhase::Normal);
  }
  {
    detail::Scope sc(e, spec_.norm_module(), ForwardPhase::Normal);
    ops.rmsnorm_forward(plan.hidden[static_cast<size_t>(layers)], Tensor{}, binding_.param(spec_.norm_param()),
                        c.rms_norm_eps, Tensor{}, plan.final_norm, plan.final_rstd);
  }
  const int head = spec_.lm_head_module();
  if (mode == Mode::LastLogits) {  // lm_head on each row's last position only: (1, D) x (V, D)^T
    detail::Scope sc(e, head, ForwardPhase::Normal);
    for (int64_t r = 0; r < b; ++r) {
      ops.matmul(ops::Transpose::No, ops::Transpose::Yes, 1.0, plan.final_norm.row_slice(r * s + s - 1, 1),
                 binding_.param(spec_.lm_head_param()), 0.0, logits->row_slice(r, 1));
    }
    return {};
  }
  if (!grads) {
    detail::Scope sc(e, head, ForwardPhase::Normal);
    const ops::LossSums sums =
        ops.linear_cross_entropy(plan.final_norm, binding_.param(spec_.lm_head_param()), flat_targets, options_.ignore_index,
                                 0.0, options_.loss_chunk_tokens, Tensor{}, Tensor{}, 1.0);
    return LossResult{sums.loss_sum, sums.tokens};
  }

  // ---- fused lm_head + loss + its backward (see hooks.hpp for the hook order)
  const Workspace& w = plan.work;
  ops::LossSums sums;
  {
    hooks_->before_forward(head, ForwardPhase::Normal);
    hooks_->before_backward(head);
    int64_t counted = 0;
    const int32_t* t = flat_targets.as<const int32_t>();
    if (step.loss_scale == 0.0 && flat_targets.device != DeviceKind::Cpu)
      throw InternalError("forward_backward: targets in device memory need an explicit StepOptions::loss_scale");
    if (step.loss_scale == 0.0)
      for (int64_t i = 0; i < n; ++i) counted += t[i] != options_.ignore_index;
    const double scale = step.loss_scale != 0.0 ? step.loss_scale : (counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0);
    sums = ops.linear_cross_entropy(plan.final_norm, binding_.param(spec_.lm_head_param()), flat_targets,
                                    options_.ignore_index, scale, options_.loss_chunk_tokens, w.dn,
                                    binding_.grad(spec_.lm_head_param()), binding_.take_grad_beta(spec_.lm_head_param()));
    hooks_->after_forward(head, ForwardPhase::Normal);
    hooks_->after_backward(head);
  }
  // ---- backward
  int cur = 0;  // grad_hidden[cur] holds the gradient at the current residual-stream point
  {
    detail::BackwardScope sc(e, spec_.norm_module());
    ops.rmsnorm_backward(w.dn, plan.hidden[static_cast<size_t>(layers)], binding_.param(spec_.norm_param()), plan.final_rstd,
                         Tensor{}, w.grad_hidden[cur], binding_.grad(spec_.norm_param()));
  }
  for (int l = layers - 1; l >= 0; --l) {
    const auto li = static_cast<size_t>(l);
    detail::BackwardScope sc(e, spec_.layer(l).modules.layer);
    if (ckpt)
      detail::decoder_layer_forward(e, l, plan.layers[li], w, plan.hidden[li], plan.hidden[li + 1], ForwardPhase::Recompute);
    detail::decoder_layer_backward(e, l, plan.layers[li], w, plan.hidden[li], w.grad_hidden[cur], w.grad_hidden[1 - cur]);
    cur = 1 - cur;
  }
  {
    detail::BackwardScope sc(e, spec_.embed_module());
    ops.embedding_backward(flat_ids, w.grad_hidden[cur], binding_.grad(spec_.embed_param()));
  }
  return LossResult{sums.loss_sum, sums.tokens};
}

}  // namespace shardtrain::model
