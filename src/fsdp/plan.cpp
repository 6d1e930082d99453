// The formulas of docs/fsdp.md, unit by unit.
#include "shardtrain/fsdp/plan.hpp"

#include <algorithm>

#include "shardtrain/fsdp/grad_placement.hpp"
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
  shape.deterministic_attention = ops::deterministic_attention_from_env();
  return ops::cuda_scratch_bytes(shape);
}

GradShardMemory place_grad_shards(const model::ModelSpec& spec, const FsdpConfig& config, const FsdpPlan& plan,
                                  const model::ActivationPlan& act) {
  GradShardMemory g;
  const int S = plan.mesh.shard_size;
  for (const UnitPlan& u : plan.units) g.own += 4 * u.layout.shard_numel();
  if (!config.places_grads_in_activations()) return g;
  // The engine's decisions (engine.cpp: place_or_stage, place_grad, forward_backward's end), replayed in the
  // hooks' backward order: lm_head, the final norm, the layers last-first (a layer done once its children are),
  // the embedding. One rank: a unit's shard is needed when its first module runs backward, and that module's
  // gradients may wait on the stage; several: at the unit's reduction, when its first module's backward ends.
  const bool in_shard = grads_live_in_shards(config, S, plan.mesh.replicate_size);
  GradPlacer placer(GradPlacer::stage_capacity(spec));
  placer.begin_pass(act.freed_in_backward());
  std::vector<int> unit_of(spec.params().size(), -1);
  for (size_t i = 0; i < plan.units.size(); ++i)
    for (int p : plan.units[i].spec.params) unit_of[static_cast<size_t>(p)] = static_cast<int>(i);
  std::vector<bool> placed(plan.units.size(), false);
  std::vector<std::vector<int>> staged(plan.units.size());
  bool stage_used = false;
  int64_t in_arena = 0;
  auto place = [&](size_t i) {
    const auto bytes = static_cast<size_t>(4 * plan.units[i].layout.shard_numel());
    if (placer.place(bytes)) in_arena += static_cast<int64_t>(bytes);
    placed[i] = true;
  };
  const auto& modules = spec.modules();
  for (auto m = modules.rbegin(); m != modules.rend(); ++m) {
    if (m->cls == model::ModuleClass::LlamaDecoderLayer) placer.layer_done(m->layer);
    if (!in_shard) {
      for (size_t i = 0; i < plan.units.size(); ++i)
        if (plan.units[i].spec.first_use == m->index && !placed[i]) place(i);
      continue;
    }
    for (int p : m->uses) {
      const auto i = static_cast<size_t>(unit_of[static_cast<size_t>(p)]);
      if (placed[i]) continue;
      const auto bytes = static_cast<size_t>(4 * plan.units[i].layout.shard_numel());
      if (placer.place(bytes)) {
        in_arena += static_cast<int64_t>(bytes);
        placed[i] = true;
        continue;
      }
      const auto request = placer.stage_request(plan.units[i].layout, *m, staged[i]);
      if (!request) {
        placed[i] = true;  // its own memory
        continue;
      }
      for (const FlatEntry* e : *request) {
        placer.stage(static_cast<size_t>(e->numel) * 4);
        staged[i].push_back(e->param);
      }
      stage_used = true;
    }
  }
  for (size_t i = 0; i < plan.units.size(); ++i)
    if (!placed[i]) place(i);
  g.in_activations = in_arena;
  g.own -= in_arena;
  if (stage_used) g.stage = static_cast<int64_t>(placer.stage_capacity());
  return g;
}

MemoryEstimate estimate_memory(const model::ModelSpec& spec, const FsdpConfig& config, const FsdpPlan& plan,
                               int64_t micro_batch, int64_t seq) {
  MemoryEstimate m;
  const model::ActivationPlan act(
      spec.config(), micro_batch, seq, config.param_dtype,
      config.activation_checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None);
  m.activations = static_cast<double>(act.bytes());
  m.op_scratch = static_cast<double>(op_scratch_bytes(spec, config.param_dtype, micro_batch, seq).total());
  const GradShardMemory g = place_grad_shards(spec, config, plan, act);
  m.grads_in_activations = static_cast<double>(g.in_activations);
  m.state = static_cast<double>(plan.sharded_state_bytes - g.in_activations + g.stage);
  m.buffers = static_cast<double>(plan.unsharded_param_bytes + plan.unsharded_grad_bytes + plan.comm_scratch_bytes);
  if (config.offload_params) {
    m.buffers += static_cast<double>(plan.offload_upload_bytes);
    m.host = m.state + static_cast<double>(plan.offload_stage_bytes);
  }
  m.device = (config.offload_params ? 0.0 : m.state) + m.buffers + m.activations + m.op_scratch;
  return m;
}

namespace {

// The engine's full gradient buffers through one backward (engine.cpp: begin_unit_backward takes one from the
// pool when a unit's backward begins, reduce_gradients holds it back until the next reduction, and then it goes
// back to the pool, FlatPool's rules): the most bytes allocated at once, as the ledger measures them.
int64_t grad_buffer_peak(const model::ModelSpec& spec, const std::vector<UnitSpec>& units,
                         const std::vector<int64_t>& bytes) {
  std::vector<int> unit_of(spec.params().size(), -1);
  for (const UnitSpec& u : units)
    for (int p : u.params) unit_of[p] = u.index;
  std::vector<bool> started(units.size(), false);
  std::vector<int64_t> free_sizes;
  int64_t live = 0, peak = 0, held = 0;
  auto acquire = [&](int64_t b) {
    size_t best = free_sizes.size();
    for (size_t i = 0; i < free_sizes.size(); ++i)
      if (free_sizes[i] >= b && (best == free_sizes.size() || free_sizes[i] < free_sizes[best])) best = i;
    if (best < free_sizes.size()) {
      const int64_t got = free_sizes[best];
      free_sizes.erase(free_sizes.begin() + static_cast<long>(best));
      return got;
    }
    if (!free_sizes.empty()) {  // nothing fits: the largest free buffer is given back first
      const auto largest = std::max_element(free_sizes.begin(), free_sizes.end());
      live -= *largest;
      free_sizes.erase(largest);
    }
    live += b;
    peak = std::max(peak, live);
    return b;
  };
  std::vector<int64_t> buffer(units.size(), 0);
  const auto& modules = spec.modules();
  for (auto m = modules.rbegin(); m != modules.rend(); ++m) {
    for (int p : m->uses) {
      const int u = unit_of[p];
      if (started[u] || bytes[u] == 0) continue;
      started[u] = true;
      buffer[u] = acquire(bytes[u]);
    }
    for (const UnitSpec& u : units) {
      if (u.first_use != m->index || buffer[u.index] == 0) continue;
      if (held > 0) free_sizes.push_back(held);
      held = buffer[u.index];
      buffer[u.index] = 0;
    }
  }
  return peak;
}

}  // namespace

FsdpPlan plan_fsdp(const model::ModelSpec& spec, const FsdpConfig& config, int world_size, int ranks_per_node) {
  config.validate();
  FsdpPlan p;
  p.mesh = make_mesh_layout({config.strategy, config.shard_size}, world_size, ranks_per_node);
  const int S = p.mesh.shard_size, R = p.mesh.replicate_size;
  const auto bp = static_cast<int64_t>(dtype_size(config.param_dtype));
  const auto br = static_cast<uint64_t>(dtype_size(config.reduce_dtype));
  const bool raf = config.reshards_after_forward();
  int64_t max_unit = 0, root = 0, spanning = 0, all_units = 0, all_grads = 0, max_shard = 0, root_shard = 0, max_n = 0;
  const std::vector<UnitSpec> units = plan_units(spec, config.wrap);
  std::vector<int64_t> grad_bytes(units.size(), 0);
  for (const UnitSpec& u : units) {
    if (u.params.empty()) continue;
    UnitPlan up{u, make_flat_layout(spec, u.params, S)};
    const int64_t N = up.layout.padded_numel;
    p.sharded_param_bytes += 4 * (N / S);
    p.sharded_state_bytes += 16 * (N / S);
    all_grads += 4 * N;
    grad_bytes[u.index] = 4 * N;
    all_units += N * bp;
    // A unit whose uses span another unit's (the base model's embedding and final norm around the layers) stays
    // gathered through them: counted on top, like the root.
    const bool spans = std::any_of(units.begin(), units.end(), [&](const UnitSpec& o) {
      return o.index != u.index && !o.params.empty() && o.first_use > u.first_use && o.first_use < u.last_use;
    });
    if (u.is_root) root = N * bp;
    else if (spans) spanning += N * bp;
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
  p.unsharded_param_bytes = raf ? std::min(all_units, (1 + depth) * max_unit + spanning + root) : all_units;
  p.offload_upload_bytes = std::max(max_shard, root_shard);
  // The root's backward spans the whole backward (lm_head first, the embedding last); each other unit's buffer
  // lives through its backward and, held back, through the next unit's reduction being issued.
  if (grads_live_in_shards(config, S, R)) p.unsharded_grad_bytes = 0;
  else
    p.unsharded_grad_bytes =
        config.accumulation == GradAccumulation::NoSync ? all_grads : grad_buffer_peak(spec, units, grad_bytes);
  // The engine's scratch buffers (engine.cpp, constructor), each sized for the largest unit.
  const bool f32_reduce = config.reduce_dtype == DType::F32;
  const int64_t max_any_shard = std::max(max_shard, root_shard);
  if (S > 1) p.comm_scratch_bytes += (R > 1 ? 2 : 1) * max_any_shard;  // two reduce-scatter outputs with replicas
  if (!f32_reduce || (config.offload_params && R > 1)) p.comm_scratch_bytes += max_any_shard;
  if (!f32_reduce) p.comm_scratch_bytes += max_n * static_cast<int64_t>(br);
  if (config.offload_params) p.offload_stage_bytes = max_any_shard;
  return p;
}

}  // namespace shardtrain::fsdp
