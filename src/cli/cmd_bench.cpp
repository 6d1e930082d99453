// `shardtrain bench`: the subcommands' registration, the helpers they share, and `bench model`: forward+backward
// time of a Llama model on the CPU backend, in tokens/s and as a fraction of this machine's measured sgemm rate.
// FLOPs per step: train::flops_per_token (the rule of docs/training.md, "MFU": 6 * (parameters - input embedding)
// + 12 * layers * hidden * seq) times the tokens. The recompute of activation checkpointing is not counted as work.
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <vector>

#include "cmd_bench.hpp"

#include "command.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/address_space.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "shardtrain/train/metrics.hpp"

namespace shardtrain::cli {
namespace {

struct BenchModelOptions {
  int64_t layers = 4, hidden = 256, seq = 256, batch = 4, heads = 4, kv_heads = 0, vocab = 32000, intermediate = 0;
  int iters = 10, warmup = 2, threads = 0;
  bool checkpointing = false;
};

int run_bench_model(const BenchModelOptions& o) {
  const int threads = o.threads > 0 ? o.threads : usable_cores();
  require_threads_start(threads, "--threads");
  model::LlamaConfig c;
  c.num_hidden_layers = o.layers;
  c.hidden_size = o.hidden;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  c.intermediate_size = o.intermediate > 0 ? o.intermediate : 4 * o.hidden;
  c.vocab_size = o.vocab;
  c.max_position_embeddings = std::max<int64_t>(o.seq, 2048);
  c.validate();
  // f32 weights and gradients, refused before anything is allocated (a model past the host's memory failed as
  // std::bad_alloc, an "internal error"); the activations come on top.
  const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double state = 8.0 * static_cast<double>(model::ModelSpec(c).num_params());
  if (state > host)
    throw ConfigError(
        fmt::format("bench model: {:.3g} parameters need {:.3g} GiB of f32 weights and gradients, more than "
                    "this host's {:.3g} GiB",
                    state / 8, state / (1ull << 30), host / (1ull << 30)));

  fmt::print("measuring the sgemm rate (2048^3, median of 5) on {} threads...\n", threads);
  const ops::SgemmRate rate = ops::measure_cpu_sgemm(threads);
  auto backend = ops::make_cpu_ops(ops::CpuOpsOptions{threads});
  model::ModelOptions mo;
  mo.checkpointing = o.checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None;
  model::LlamaModel llama(c, *backend, mo);
  model::DenseParams params(llama.spec());
  params.initialize();
  params.bind(llama.binding());

  std::vector<int32_t> ids(static_cast<size_t>(o.batch * o.seq)), targets(ids.size());
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < ids.size(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ids[i] = static_cast<int32_t>(x % static_cast<uint64_t>(o.vocab));
    targets[i] = static_cast<int32_t>((x >> 20) % static_cast<uint64_t>(o.vocab));
  }
  model::Batch batch;
  batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {o.batch, o.seq});
  batch.targets = ops::make_tensor(targets.data(), DType::I32, {o.batch, o.seq});
  std::vector<double> seconds;
  double loss = 0;
  for (int i = 0; i < o.warmup + o.iters; ++i) {
    params.zero_grads();
    const auto t0 = std::chrono::steady_clock::now();
    loss = llama.forward_backward(batch).mean();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= o.warmup) seconds.push_back(s);
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double tokens = static_cast<double>(o.batch * o.seq);
  const double flops = train::flops_per_token(llama.spec(), o.seq) * tokens;
  const double gflops = flops / median * 1e-9;
  fmt::print(
      "model: layers {} hidden {} heads {}/{} (kv) intermediate {} vocab {} | batch {} x seq {} | "
      "checkpointing {} | threads {}\n",
      c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size,
      o.batch, o.seq, o.checkpointing ? "per-layer" : "off", threads);
  fmt::print("parameters {:.2f} M, activations {:.1f} MiB, loss {:.4f} (ln V = {:.4f})\n",
             static_cast<double>(llama.spec().num_params()) * 1e-6,
             static_cast<double>(llama.prepare(o.batch, o.seq).bytes()) / (1 << 20), loss,
             std::log(static_cast<double>(o.vocab)));
  fmt::print("{:<34} {:>12}\n", "sgemm 2048^3, OpenBLAS threads", fmt::format("{:.1f} GFLOP/s", rate.openblas_gflops));
  fmt::print("{:<34} {:>12}\n", "sgemm 2048^3, backend split", fmt::format("{:.1f} GFLOP/s", rate.backend_gflops));
  fmt::print("{:<34} {:>12}\n", "fwd+bwd median (min, max)",
             fmt::format("{:.1f} ms ({:.1f}, {:.1f})", median * 1e3, seconds.front() * 1e3, seconds.back() * 1e3));
  fmt::print("{:<34} {:>12.0f}\n", "tokens/s", tokens / median);
  fmt::print("{:<34} {:>12}\n", "model FLOP rate", fmt::format("{:.1f} GFLOP/s", gflops));
  fmt::print("{:<34} {:>12}\n", "fraction of measured sgemm peak",
             fmt::format("{:.1f} %", 100.0 * gflops / rate.peak_gflops()));
  return 0;
}

}  // namespace

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw IoError(fmt::format("{}: cannot write the benchmark's JSON", path));
}

std::string format_seconds(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

std::string format_flops(double flops_per_s) {
  return flops_per_s >= 1e12 ? fmt::format("{:.1f} TFLOP/s", flops_per_s * 1e-12)
                             : fmt::format("{:.3g} GFLOP/s", flops_per_s * 1e-9);
}

// `bench` is an MPI command because `bench step` trains on the world and `bench comm` times its collectives;
// `bench model` and `bench ops` run on one rank (without mpirun, MPI starts a singleton).
Command add_bench_command(CLI::App& parent) {
  Command c;
  c.app = parent.add_subcommand("bench",
                                "benchmarks: model (CPU forward+backward), ops (every op at a model's shapes), "
                                "step (the whole training step), comm (collectives over the mesh axes)");
  c.app->require_subcommand(1);
  c.launch = Launch::Mpi;
  auto opts = std::make_shared<BenchModelOptions>();
  CLI::App* m = c.app->add_subcommand("model", "time forward+backward of a Llama model on the CPU backend");
  m->add_option("--layers", opts->layers, "decoder layers")->capture_default_str()->check(count_range());
  m->add_option("--hidden", opts->hidden, "hidden size")->capture_default_str()->check(count_range());
  m->add_option("--seq", opts->seq, "sequence length")->capture_default_str()->check(count_range());
  m->add_option("--batch", opts->batch, "sequences per micro-batch")->capture_default_str()->check(count_range());
  m->add_option("--heads", opts->heads, "attention heads")->capture_default_str()->check(count_range());
  m->add_option("--kv-heads", opts->kv_heads, "key/value heads (0 = heads)")
      ->capture_default_str()
      ->check(count_range(0, int64_t{1} << 30));
  m->add_option("--vocab", opts->vocab, "vocabulary size")->capture_default_str()->check(count_range());
  m->add_option("--intermediate", opts->intermediate, "MLP size (0 = 4 * hidden, as in the seed)")
      ->capture_default_str()
      ->check(count_range(0, int64_t{1} << 30));
  m->add_option("--iters", opts->iters, "timed iterations")->capture_default_str()->check(count_range());
  m->add_option("--warmup", opts->warmup, "untimed iterations first")->capture_default_str()->check(count_range(0, 100000));
  m->add_option("--threads", opts->threads, "CPU threads (0 = hardware cores, at most 1024)")
      ->capture_default_str()
      ->check(cpu_threads_range());
  m->add_flag("--checkpointing", opts->checkpointing, "per-layer activation checkpointing");
  const BenchSubcommand ops = add_bench_ops_command(*c.app);
  const BenchSubcommand step = add_bench_step_command(*c.app);
  const BenchSubcommand attention = add_bench_attention_command(*c.app);
  const BenchSubcommand comm = add_bench_comm_command(*c.app);
  c.run = [opts, ops, step, attention, comm](Runtime* rt) {
    // Every bench but comm runs GEMMs: on the CPU, an address-space limit too tight for OpenBLAS's buffers is refused
    // here rather than met as a hang in the first one.
    if (!comm.app->parsed() && !rt->device().is_cuda()) check_address_space(rt->host_threads(), "bench");
    if (ops.app->parsed()) return ops.run(rt);
    if (attention.app->parsed()) return attention.run(rt);
    if (step.app->parsed()) return step.run(rt);
    if (comm.app->parsed()) return comm.run(rt);
    if (rt->topology().world_size > 1)
      throw UsageError("bench model: runs on one rank (start it without mpirun, or with -np 1)");
    return run_bench_model(*opts);
  };
  return c;
}

}  // namespace shardtrain::cli
