// Times the host AdamW step (one parallel region per step) against the per-range loop it replaced, on the
// shard sets of real models: the seed model (12 layers, hidden 768) on 1 rank and as shard 0 of 8, and the
// tiny CPU model, transformer-wrapped as the configs do. Prints the median of timed steps after warm-up,
// and the effective bandwidth (20 bytes moved per element: p, m, v read and written, g read). Then the
// host gradient norm (optim::host_sum_of_squares: fixed blocks, eight lanes) against the loop it replaced
// (one running double per thread, an OpenMP reduction per shard), 4 bytes read per element. Last, the
// update on its worker thread (AdamW::step_async): when the call returns, when the root's and the first
// layer's shards are ready (what CPU offload's next forward waits for), when all are, against step().
//   optim_adamw_bench [--steps N] [--threads T]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"
#include "shardtrain/fsdp/units.hpp"

namespace shardtrain::testing_optim {
namespace {

struct Model {
  const char* name;
  model::LlamaConfig config;
  int shards;  // the FSDP shard count; rank 0's shards are timed
};

model::LlamaConfig seed_config() {
  model::LlamaConfig c;
  c.vocab_size = 50000;
  c.hidden_size = 768;
  c.intermediate_size = 3072;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 3;
  c.tie_word_embeddings = false;
  return c;
}

model::LlamaConfig tiny_cpu_config() {
  model::LlamaConfig c;
  c.vocab_size = 4096;
  c.hidden_size = 192;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  return c;
}

struct Shards {
  std::vector<std::vector<float>> param, grad;
  std::vector<fsdp::ShardView> views;
  int64_t elements = 0;  // inside ranges
};

Shards rank0_shards(const model::ModelSpec& spec, int shard_count) {
  Shards s;
  const std::vector<fsdp::UnitSpec> units = fsdp::plan_units(spec, fsdp::WrapConfig{});
  for (const fsdp::UnitSpec& u : units) {
    const fsdp::FlatLayout layout = fsdp::make_flat_layout(spec, u.params, shard_count);
    const int64_t n = layout.shard_numel();
    s.param.emplace_back(static_cast<size_t>(n), 0.01f);
    s.grad.emplace_back(static_cast<size_t>(n), 0.001f);
    fsdp::ShardView v;
    v.unit = u.index;
    v.numel = n;
    v.ranges = layout.ranges(0, n);
    for (fsdp::ParamRange& r : v.ranges) s.elements += r.end - r.begin;
    s.views.push_back(std::move(v));
  }
  for (size_t i = 0; i < s.views.size(); ++i) {
    s.views[i].param = s.param[i].data();
    s.views[i].grad = s.grad[i].data();
  }
  return s;
}

// The gradient norm's former host loop: per shard, one dependent chain of double adds per thread.
double one_chain_sum_of_squares(const std::vector<fsdp::ShardView>& shards) {
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

template <typename F>
double median_ms(int steps, F&& f) {
  for (int w = 0; w < 2; ++w) f();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace
}  // namespace shardtrain::testing_optim

int main(int argc, char** argv) {
  using namespace shardtrain;
  using namespace shardtrain::testing_optim;
  int steps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) omp_set_num_threads(std::atoi(argv[i + 1]));
  }
  std::printf("threads %d, median of %d steps after 2 warm-up steps\n", omp_get_max_threads(), steps);
  std::printf("%-22s %7s %8s %10s | %-22s | %-22s | %s\n", "shard set", "shards", "ranges", "elements", "per-range loop",
              "one region", "speed-up");
  const Model models[] = {{"seed 12L, 1 rank", seed_config(), 1},
                          {"seed 12L, shard 0 of 8", seed_config(), 8},
                          {"tiny-cpu, 1 rank", tiny_cpu_config(), 1},
                          {"tiny-cpu, shard 0 of 4", tiny_cpu_config(), 4}};
  for (const Model& m : models) {
    const model::ModelSpec spec(m.config);
    Shards s = rank0_shards(spec, m.shards);
    optim::AdamW adamw(s.views, spec, optim::AdamWConfig{}, nullptr);
    PerRangeAdamW old(adamw, s.views);
    size_t ranges = 0;
    for (const fsdp::ShardView& v : s.views) ranges += v.ranges.size();
    const double t_old = median_ms(steps, [&] { old.step(s.views, 1e-4, 1.0); });
    const double t_new = median_ms(steps, [&] { adamw.step(s.views, 1e-4, 1.0); });
    const double gb = static_cast<double>(s.elements) * 20 / 1e9;
    std::printf("%-22s %7zu %8zu %10lld | %8.3f ms %6.1f GB/s | %8.3f ms %6.1f GB/s | %.2fx\n", m.name, s.views.size(),
                ranges, static_cast<long long>(s.elements), t_old, gb / (t_old / 1e3), t_new, gb / (t_new / 1e3),
                t_old / t_new);
  }
  std::printf("\n%-22s %10s | %-22s | %-22s | %s\n", "gradient norm", "elements", "one chain per thread", "blocks x 8 lanes",
              "speed-up");
  for (const Model& m : models) {
    const model::ModelSpec spec(m.config);
    Shards s = rank0_shards(spec, m.shards);
    int64_t n = 0;
    for (const fsdp::ShardView& v : s.views) n += v.numel;
    double a = 0, b = 0;
    const double t_old = median_ms(steps, [&] { a = one_chain_sum_of_squares(s.views); });
    const double t_new = median_ms(steps, [&] { b = optim::host_sum_of_squares(s.views); });
    const double gb = static_cast<double>(n) * 4 / 1e9;
    std::printf("%-22s %10lld | %8.3f ms %6.1f GB/s | %8.3f ms %6.1f GB/s | %.2fx  (relative difference %.1e)\n", m.name,
                static_cast<long long>(n), t_old, gb / (t_old / 1e3), t_new, gb / (t_new / 1e3), t_old / t_new,
                std::abs(a - b) / b);
  }
  // step_async (CPU offload on a GPU): how soon the next forward may start uploading. The root unit (embedding,
  // final norm, lm_head) is shard 0 and comes first; each decoder layer's shard follows in forward order.
  std::printf("\n%-22s | %-10s | %-18s | %-18s | %-12s | %s\n", "step_async", "returns", "root ready", "first layer ready",
              "all ready", "step()");
  for (const Model& m : models) {
    const model::ModelSpec spec(m.config);
    Shards s = rank0_shards(spec, m.shards);
    optim::AdamW adamw(s.views, spec, optim::AdamWConfig{}, nullptr);
    const double t_sync = median_ms(steps, [&] { adamw.step(s.views, 1e-4, 1.0); });
    std::vector<double> ret, root, first, all;
    for (int i = 0; i < steps + 2; ++i) {
      using Clock = std::chrono::steady_clock;
      const auto ms = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      const auto t0 = Clock::now();
      adamw.step_async(s.views, 1e-4, 1.0);
      const auto t1 = Clock::now();
      adamw.wait_shard(0);
      const auto t2 = Clock::now();
      adamw.wait_shard(1);
      const auto t3 = Clock::now();
      adamw.wait();
      const auto t4 = Clock::now();
      if (i < 2) continue;  // warm-up
      ret.push_back(ms(t0, t1));
      root.push_back(ms(t0, t2));
      first.push_back(ms(t0, t3));
      all.push_back(ms(t0, t4));
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double t_all = median(all);
    std::printf("%-22s | %7.3f ms | %7.2f ms (%3.0f%%) | %7.2f ms (%3.0f%%) | %9.2f ms | %.2f ms\n", m.name, median(ret),
                median(root), 100 * median(root) / t_all, median(first), 100 * median(first) / t_all, t_all, t_sync);
  }
  return 0;
}
