// The formulas of docs/fsdp.md, unit by unit.
#include "shardtrain/fsdp/plan.hpp"

#include <algorithm>

#include "shardtrain/model/activation_plan.hpp"

namespace shardtrain::fsdp {

ops::CudaScratchBytes op_scratch_bytes(const model::ModelSpec& spec, DType param_dtype, int64_t micro_batch, int64_t seq) {
  const model::LlamaConfig& c = spec.config();
  ops::CudaScratchShape shape;
  shape.batch = micro_batch;
  shape.seq = seq;
  shape.hidden = c.hidden_size;
  shape.heads = c.num_attention_heads;
  shape.vocab = c.vocab_size;
  shape.param_dtype = param_dtype;
  shape.lm_head_grad_dtype = DType::F32;  // the unsharded gradient buffers are fp32
  shape.head_dim = c.head_dim();
  shape.cudnn_attention = param_dtype == DType::BF16;  // cuDNN's flash attention takes bf16 (docs/gpu.md)
  return ops::cuda_scratch_bytes(shape);
}

MemoryEstimate estimate_memory(const model::ModelSpec& spec, const FsdpConfig& config, const FsdpPlan& plan, int64_t micro_batch,
                               int64_t seq) {
  MemoryEstimate m;
  const model::ActivationPlan act(spec.config(), micro_batch, seq, config.param_dtype,
                                  config.activation_checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None);
  m.activations = static_cast<double>(act.bytes());
  m.op_scratch = static_cast<double>(op_scratch_bytes(spec, config.param_dtype, micro_batch, seq).total());
  m.state = static_cast<double>(plan.sharded_state_bytes);
  m.buffers = static_cast<double>(plan.unsharded_param_bytes + plan.unsharded_grad_bytes + plan.comm_scratch_bytes);
  if (config.offload_params) {
    m.buffers += static_cast<double>(plan.offload_upload_bytes);
    m.host = m.state + static_cast<double>(plan.offload_stage_bytes);
  }
  m.device = (config.offload_params ? 0.0 : m.state) + m.buffers + m.activations + m.op_scratch;
  return m;
}

FsdpPlan plan_fsdp(const model::ModelSpec& spec, const FsdpConfig& config, int world_size, int ranks_per_node) {
  config.validate();
  FsdpPlan p;
  p.mesh = make_mesh_layout({config.strategy, config.shard_size}, world_size, ranks_per_node);
  const int S = p.mesh.shard_size, R = p.mesh.replicate_size;
  const auto bp = static_cast<int64_t>(dtype_size(config.param_dtype));
  const auto br = static_cast<uint64_t>(dtype_size(config.reduce_dtype));
  const bool raf = config.reshards_after_forward();
  int64_t max_unit = 0, root = 0, all_units = 0, max_grad = 0, root_grad = 0, all_grads = 0, max_shard = 0, root_shard = 0,
          max_n = 0;
  for (const UnitSpec& u : plan_units(spec, config.wrap)) {
    if (u.params.empty()) continue;
    UnitPlan up{u, make_flat_layout(spec, u.params, S)};
    const int64_t N = up.layout.padded_numel;
    p.sharded_param_bytes += 4 * (N / S);
    p.sharded_state_bytes += 16 * (N / S);
    all_grads += 4 * N;
    if (u.is_root) root_grad = 4 * N;
    else max_grad = std::max(max_grad, 4 * N);
    all_units += N * bp;
    if (u.is_root) root = N * bp;
    else max_unit = std::max(max_unit, N * bp);
    max_n = std::max(max_n, N);
    if (u.is_root) root_shard = 4 * (N / S);
    else max_shard = std::max(max_shard, 4 * (N / S));
    if (S > 1) {
      p.shard_all_gather_bytes += static_cast<uint64_t>((u.is_root || !raf ? 1 : 2) * N * bp);
      p.shard_reduce_scatter_bytes += static_cast<uint64_t>(N) * br;
    }
    if (R > 1) p.replicate_all_reduce_bytes += static_cast<uint64_t>(N / S) * br;
    p.units.push_back(std::move(up));
  }
  const int64_t depth = std::max(config.forward_prefetch, config.backward_prefetch);
  p.unsharded_param_bytes = raf ? std::min(all_units, (1 + depth) * max_unit + root) : all_units;
  p.offload_upload_bytes = std::min(p.sharded_param_bytes, (1 + depth) * max_shard + root_shard);
  // The root's backward spans the whole backward (lm_head first, the embedding last).
  if (grads_live_in_shards(config, S, R)) p.unsharded_grad_bytes = 0;
  else p.unsharded_grad_bytes = config.accumulation == GradAccumulation::NoSync ? all_grads : root_grad + max_grad;
  // The engine's scratch buffers (engine.cpp, constructor), each sized for the largest unit.
  const bool f32_reduce = config.reduce_dtype == DType::F32;
  const int64_t max_any_shard = std::max(max_shard, root_shard);
  if (S > 1) p.comm_scratch_bytes += max_any_shard;
  if (!f32_reduce || (config.offload_params && R > 1)) p.comm_scratch_bytes += max_any_shard;
  if (!f32_reduce) p.comm_scratch_bytes += max_n * static_cast<int64_t>(br);
  if (config.offload_params) p.offload_stage_bytes = max_any_shard;
  return p;
}

}  // namespace shardtrain::fsdp
