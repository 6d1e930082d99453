// Shared by the AdamW tests: a model spec whose parameters give decayed and exempt ranges, host shard sets
// with odd sizes and padding, the per-range update loop the chunked one replaced (the bit-exact reference),
// and a communicator stand-in whose all-reduce adds `size` equal contributions (replicas of this rank).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/optim/adamw.hpp"

namespace shardtrain::testing_optim {

inline model::LlamaConfig small_config() {
  model::LlamaConfig c;
  c.vocab_size = 53;
  c.max_position_embeddings = 64;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  return c;
}

// A parameter of the given module class (Linear: decayed; RMSNorm, Embedding: exempt under
// ExemptNormsAndEmbeddings).
inline int param_of_class(const model::ModelSpec& spec, model::ModuleClass cls) {
  for (const model::ParamInfo& p : spec.params()) {
    if (spec.module(p.module).cls == cls) return p.index;
  }
  return -1;
}

struct RangeSpec {
  int64_t begin, end;
  model::ModuleClass cls;
};
struct ShardSpec {
  int64_t numel;
  std::vector<RangeSpec> ranges;
};

// Odd sizes, gaps (padding) between and after ranges, a range longer than two device chunks (32768),
// ranges starting at every residue mod 4, a shard that is all padding and an empty one.
inline std::vector<ShardSpec> odd_shard_specs() {
  using C = model::ModuleClass;
  return {
      {37, {{0, 5, C::Linear}, {5, 13, C::RMSNorm}, {16, 33, C::Linear}}},
      {70001, {{3, 40000, C::Linear}, {40000, 40003, C::RMSNorm}, {40011, 69990, C::Embedding}}},
      {1029, {}},
      {0, {}},
      {4099, {{1, 2, C::RMSNorm}, {2, 4097, C::Linear}}},
      {33, {{0, 33, C::Embedding}}},
  };
}

// Host memory for a shard set: params and grads, padding holding `pad` (nothing may change it).
struct HostShards {
  std::vector<std::vector<float>> param, grad;
  std::vector<fsdp::ShardView> views;
};

inline bool in_ranges(const ShardSpec& s, int64_t k) {
  return std::any_of(s.ranges.begin(), s.ranges.end(), [&](const RangeSpec& r) { return k >= r.begin && k < r.end; });
}

inline HostShards make_host_shards(const model::ModelSpec& spec, const std::vector<ShardSpec>& specs, uint32_t seed,
                                   float pad) {
  HostShards h;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < specs.size(); ++i) {
    const ShardSpec& s = specs[i];
    h.param.emplace_back(static_cast<size_t>(s.numel));
    h.grad.emplace_back(static_cast<size_t>(s.numel));
    for (int64_t k = 0; k < s.numel; ++k) {
      h.param[i][static_cast<size_t>(k)] = in_ranges(s, k) ? u(rng) : pad;
      h.grad[i][static_cast<size_t>(k)] = in_ranges(s, k) ? u(rng) : pad;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    fsdp::ShardView v;
    v.unit = static_cast<int>(i);
    v.param = h.param[i].data();
    v.grad = h.grad[i].data();
    v.numel = specs[i].numel;
    for (const RangeSpec& r : specs[i].ranges) v.ranges.push_back({param_of_class(spec, r.cls), r.begin, r.end, 0});
    h.views.push_back(std::move(v));
  }
  return h;
}

// New gradients for step `step`, the same for every shard set built from the same specs; ranges only.
inline void fill_grads(std::vector<std::vector<float>>& grad, const std::vector<ShardSpec>& specs, int step) {
  std::mt19937 rng(1000u + static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const RangeSpec& r : specs[i].ranges) {
      for (int64_t k = r.begin; k < r.end; ++k) grad[i][static_cast<size_t>(k)] = u(rng) * (step % 2 ? 1e-3f : 1.0f);
    }
  }
}

// The update as it was before the chunked loop: one parallel region per range, the same element arithmetic.
struct PerRangeAdamW {
  optim::AdamWConfig config;
  std::vector<std::vector<float>> m, v;
  std::vector<std::vector<optim::DecayRange>> ranges;
  int64_t steps = 0;
  PerRangeAdamW(const optim::AdamW& built, const std::vector<fsdp::ShardView>& shards) : config(built.config()) {
    for (size_t i = 0; i < shards.size(); ++i) {
      m.emplace_back(static_cast<size_t>(shards[i].numel), 0.0f);
      v.emplace_back(static_cast<size_t>(shards[i].numel), 0.0f);
      ranges.push_back(built.ranges(i));
    }
  }
  void step(const std::vector<fsdp::ShardView>& shards, double lr, double grad_scale) {
    ++steps;
    const double bc1 = 1.0 - std::pow(config.beta1, static_cast<double>(steps));
    const double bc2 = 1.0 - std::pow(config.beta2, static_cast<double>(steps));
    const float b1 = static_cast<float>(config.beta1), b2 = static_cast<float>(config.beta2);
    const float step_size = static_cast<float>(lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    const float eps = static_cast<float>(config.eps);
    const float gs = static_cast<float>(grad_scale);
    for (size_t i = 0; i < shards.size(); ++i) {
      float* __restrict p = shards[i].param;
      const float* __restrict g = shards[i].grad;
      float* __restrict mm = m[i].data();
      float* __restrict vv = v[i].data();
      for (const optim::DecayRange& r : ranges[i]) {
        const float decay = r.decay ? static_cast<float>(1.0 - lr * config.weight_decay) : 1.0f;
#pragma omp parallel for simd schedule(static) if (r.end - r.begin > 32768)
        for (int64_t k = r.begin; k < r.end; ++k) {
          const float gk = g[k] * gs;
          mm[k] = b1 * mm[k] + (1.0f - b1) * gk;
          vv[k] = b2 * vv[k] + (1.0f - b2) * gk * gk;
          const float denom = std::sqrt(vv[k]) * inv_sqrt_bc2 + eps;
          p[k] = p[k] * decay - step_size * mm[k] / denom;
        }
      }
    }
  }
};

// A one-process stand-in for an axis of `size` ranks holding equal shards: all-reduce (sum) multiplies by
// size. Host space only here; the GPU test derives a device-space one.
class ReplicaComm : public Communicator {
 public:
  ReplicaComm(int size, MemorySpace space) : Communicator(MeshAxis::Shard, 0, size, space) {}
  CommBackend backend() const override { return CommBackend::Mpi; }

 protected:
  void do_all_gather(const void*, void*, size_t, DType, StreamRef) override { unsupported(); }
  void do_reduce_scatter(const void*, void*, size_t, DType, ReduceOp, StreamRef) override { unsupported(); }
  void do_all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, StreamRef) override {
    if (dtype != DType::F64 || op != ReduceOp::Sum) unsupported();
    for (size_t k = 0; k < count; ++k) static_cast<double*>(recv)[k] = static_cast<const double*>(send)[k] * size();
  }
  void do_broadcast(void*, size_t, DType, int, StreamRef) override { unsupported(); }
  void do_barrier() override {}
  [[noreturn]] static void unsupported() { throw InternalError("ReplicaComm: only an f64 sum all-reduce is simulated"); }
};

}  // namespace shardtrain::testing_optim
