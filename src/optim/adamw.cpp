// AdamW and gradient norms on host shards, parallel over all cores, vectorized inner loops.
#include "shardtrain/optim/adamw.hpp"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::optim {

DecayScope parse_decay_scope(std::string_view t) {
  if (t == "all") return DecayScope::All;
  if (t == "exempt_norms_and_embeddings") return DecayScope::ExemptNormsAndEmbeddings;
  throw ConfigError(fmt::format("optim.decay: unknown scope '{}' (expected all or exempt_norms_and_embeddings)", t));
}

void AdamWConfig::validate() const {
  if (!(lr > 0)) throw ConfigError(fmt::format("optim.lr: {} (expected a positive learning rate)", lr));
  if (!(beta1 >= 0 && beta1 < 1)) throw ConfigError(fmt::format("optim.beta1: {} (expected 0 <= beta1 < 1)", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw ConfigError(fmt::format("optim.beta2: {} (expected 0 <= beta2 < 1)", beta2));
  if (!(eps > 0)) throw ConfigError(fmt::format("optim.eps: {} (expected a positive epsilon)", eps));
  if (!(weight_decay >= 0)) throw ConfigError(fmt::format("optim.weight_decay: {} (expected 0 or more)", weight_decay));
}

AdamW::AdamW(const fsdp::FsdpEngine& engine, const AdamWConfig& config, MemoryLedger* ledger)
    : config_(config), ledger_(ledger) {
  config_.validate();
  const model::ModelSpec& spec = engine.model_spec();
  for (const fsdp::ShardView& v : engine.shards()) {
    if (v.device != DeviceKind::Cpu) {
      throw InternalError("AdamW on the host needs host shards: enable offload_params on the CUDA backend, or use the fused device AdamW");
    }
    State s;
    s.numel = v.numel;
    s.exp_avg = ops::HostBuffer(static_cast<size_t>(v.numel) * 4);
    s.exp_avg_sq = ops::HostBuffer(static_cast<size_t>(v.numel) * 4);
    std::memset(s.exp_avg.data(), 0, s.exp_avg.size());
    std::memset(s.exp_avg_sq.data(), 0, s.exp_avg_sq.size());
    for (const fsdp::ParamRange& r : v.ranges) {
      const model::ModuleClass cls = spec.module(spec.param(r.param).module).cls;
      const bool exempt = config_.decay == DecayScope::ExemptNormsAndEmbeddings &&
                          (cls == model::ModuleClass::RMSNorm || cls == model::ModuleClass::Embedding);
      s.ranges.push_back({r.begin, r.end, !exempt});
    }
    state_bytes_ += static_cast<int64_t>(s.exp_avg.size() + s.exp_avg_sq.size());
    states_.push_back(std::move(s));
  }
  if (ledger_) ledger_->add(MemoryCategory::OptimizerStates, state_bytes_);
}

void AdamW::step(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale) {
  ++steps_;
  const double bc1 = 1.0 - std::pow(config_.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(config_.beta2, static_cast<double>(steps_));
  const float b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  const float step_size = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(config_.eps);
  const float gs = static_cast<float>(grad_scale);
  for (size_t i = 0; i < shards.size(); ++i) {
    float* __restrict p = shards[i].param;
    const float* __restrict g = shards[i].grad;
    float* __restrict m = states_[i].exp_avg.as<float>();
    float* __restrict v = states_[i].exp_avg_sq.as<float>();
    for (const DecayRange& r : states_[i].ranges) {
      const float decay = r.decay ? static_cast<float>(1.0 - lr * config_.weight_decay) : 1.0f;
#pragma omp parallel for simd schedule(static) if (r.end - r.begin > 32768)
      for (int64_t k = r.begin; k < r.end; ++k) {
        const float gk = g[k] * gs;
        m[k] = b1 * m[k] + (1.0f - b1) * gk;
        v[k] = b2 * v[k] + (1.0f - b2) * gk * gk;
        const float denom = std::sqrt(v[k]) * inv_sqrt_bc2 + eps;
        p[k] = p[k] * decay - step_size * m[k] / denom;
      }
    }
  }
}

double grad_sq_sum_local(const std::vector<fsdp::ShardView>& shards) {
  double total = 0;
  for (const fsdp::ShardView& s : shards) {
    const float* g = s.grad;
    double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (s.numel > 32768)
    for (int64_t k = 0; k < s.numel; ++k) sum += static_cast<double>(g[k]) * g[k];
    total += sum;
  }
  return total;
}

double grad_norm_global(const std::vector<fsdp::ShardView>& shards, Communicator& shard_axis) {
  double sq = grad_sq_sum_local(shards);
  if (shard_axis.size() > 1) shard_axis.all_reduce(std::span<double>(&sq, 1), ReduceOp::Sum);
  return std::sqrt(sq);
}

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(grad_norm)) return 1.0;
  return grad_norm > max_norm ? max_norm / (grad_norm + 1e-6) : 1.0;
}

}  // namespace shardtrain::optim
