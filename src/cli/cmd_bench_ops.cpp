// `shardtrain bench ops`: every op a Llama training step runs, timed alone at the model's shapes on the
// current backend (CudaOps on a GPU, the CPU backend otherwise), against two rates measured in the same
// process: a large matmul (FLOP/s), the ceiling of FLOP rows ("% ceil", raised to the fastest FLOP row where one
// outran it, as MFU's peak is: never above 100 %), and a large main-memory copy (bytes read + written per second),
// which byte rows are printed as a ratio to ("2.3x copy"): a row whose data stays in cache runs faster than that
// copy, so it is no ceiling of theirs (audit I5: "% ceil" read 117-527 %).
//
// Work counted (N = batch * seq tokens, D hidden, H heads, Hkv KV heads, Dh head dim, F intermediate, V vocab):
//   GEMMs: 2 * M * N * K per call (a linear y = x W^T, its dx = dy W and its dW += dy^T x).
//   attention: forward 4 * B * H * S^2 * Dh / 2 (q k^T and p v, causal: half of the full S x S), backward
//     twice the forward (dv, dp, dq, dk; the recompute of p is not counted).
//   linear_cross_entropy: 2 * N * D * V for the logits, twice more with the gradient (dh and dW).
//   memory-bound ops: the bytes of every tensor argument read once and written once (an accumulated output
//     is read and written), at its dtype; nothing for caches or re-reads.
// Each row's calls per micro-batch are what the model's forward_backward runs (no checkpointing, q/k/v and
// gate/up fused as their adjacent parameters allow: decoder_layer.cpp); --check-calls runs the model once through
// a recorder of op calls and fails unless every row's count is the model's. --json writes, with each row, the calls
// its timed function makes (key, FLOPs, bytes: ops/op_calls.hpp), so that a profile maps op calls to seconds
// (op_profile.hpp; `shardtrain predict`).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cmd_bench.hpp"
#include "op_rows.hpp"
#include "shardtrain/model/config.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timer.hpp"
#include "shardtrain/train/config_io.hpp"

namespace shardtrain::cli {
namespace {

struct BenchOpsOptions {
  std::string config;
  int64_t layers = 0, hidden = 0, seq = 0, batch = 0, heads = 0, kv_heads = 0, vocab = 0, intermediate = 0;
  int ranks = 1;
  std::string dtype;  // "" = bf16 on CUDA, f32 on the CPU
  int iters = 20, warmup = 3, threads = 0;
  std::string json;
  bool check_calls = false;
};

BenchShape resolve_shape(const BenchOpsOptions& o) {
  BenchShape s;
  if (!o.config.empty()) {
    train::TrainConfig c = train::load_train_config(o.config);
    s.model = c.model;
    s.seq = c.data.seq_len;
    // The micro-batch the trainer would run on --ranks ranks, refused as train, plan, check and predict refuse it (16
    // sequences over 3 ranks timed micro-batches of 5), unless --batch gives it (as plan's --micro-batch). The ranks
    // given, not the config's fsdp.num_processes: as plan.
    if (o.batch == 0) {
      c.fsdp.num_processes = 0;
      c.fsdp.num_machines = 0;
      try {
        c.validate_for_world(o.ranks, 1);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("{}: {} (--ranks {}; or give --batch)", o.config, e.what(), o.ranks));
      }
      s.batch = c.micro_batch_size_for(o.ranks);
    }
    s.source = o.config;
  } else {  // `bench model`'s defaults
    s.model.num_hidden_layers = 4, s.model.hidden_size = 256, s.model.num_attention_heads = 4,
    s.model.num_key_value_heads = 4;
    s.model.intermediate_size = 1024, s.model.vocab_size = 32000;
    s.seq = 256, s.batch = 4;
    s.source = "options";
  }
  auto over = [](int64_t v, auto& field) {
    if (v > 0) field = v;
  };
  over(o.layers, s.model.num_hidden_layers);
  over(o.hidden, s.model.hidden_size);
  over(o.heads, s.model.num_attention_heads);
  over(o.kv_heads, s.model.num_key_value_heads);
  over(o.vocab, s.model.vocab_size);
  over(o.seq, s.seq);
  over(o.batch, s.batch);
  if (o.intermediate > 0) s.model.intermediate_size = o.intermediate;
  else if (o.hidden > 0 && o.config.empty()) s.model.intermediate_size = 4 * o.hidden;
  if (o.heads > 0 && o.kv_heads == 0 && o.config.empty()) s.model.num_key_value_heads = o.heads;
  s.model.max_position_embeddings = std::max<int64_t>(s.model.max_position_embeddings, s.seq);
  s.model.validate();
  return s;
}

// --check-calls: each key of op call the rows time, times the rows' calls per micro-batch, against the calls of
// one forward_backward of the model (the bench's config and dtypes, DenseParams, no checkpointing) at batch 1 x
// seq min(seq, 16), where the same rows are recorded; nothing is computed. Throws InternalError listing every
// call whose counts differ.
void check_calls(const BenchShape& shape, DType dt) {
  BenchShape small = shape;
  small.batch = 1;
  small.seq = std::min<int64_t>(shape.seq, 16);
  std::map<std::string, int64_t> want;
  std::map<std::string, std::string> row_names;
  for (const RecordedRow& r : record_rows(small, dt, DeviceKind::Cpu)) {
    for (const ops::OpCall& call : r.calls) {
      want[call.key] += r.row.calls;
      row_names[call.key] += (row_names[call.key].empty() ? "" : ", ") + r.row.op;
    }
  }
  CallRecorder model_calls;
  model::LlamaModel model(small.model, model_calls, model::ModelOptions{.activation_dtype = dt});
  model::DenseParams params(model.spec(), dt, DType::F32);
  params.bind(model.binding());
  std::vector<int32_t> ids(static_cast<size_t>(small.seq), 1), targets(static_cast<size_t>(small.seq), 1);
  model::Batch batch;
  batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {1, small.seq});
  batch.targets = ops::make_tensor(targets.data(), DType::I32, {1, small.seq});
  model.forward_backward(batch, model::StepOptions{.loss_scale = 1.0});
  std::map<std::string, int64_t> got;
  for (const ops::OpCall& call : model_calls.calls) ++got[call.key];
  std::string mismatches;
  for (const auto& [key, n] : got) {
    const auto it = want.find(key);
    if (it == want.end()) mismatches += fmt::format("\n  {}: {} per micro-batch in the model, no row times it", key, n);
    else if (it->second != n)
      mismatches +=
          fmt::format("\n  {} ({}): {} per micro-batch in the rows, {} in the model", key, row_names[key], it->second, n);
  }
  for (const auto& [key, n] : want)
    if (n != 0 && !got.count(key))
      mismatches += fmt::format("\n  {} ({}): {} per micro-batch in the rows, none in the model", key, row_names[key], n);
  if (!mismatches.empty())
    throw InternalError("bench ops: the rows' calls per micro-batch are not the model's" + mismatches);
  log::info("bench ops: every row's calls per micro-batch are the model's ({} op calls at batch 1 x seq {})",
            model_calls.calls.size(), small.seq);
}

std::string format_work(const OpRow& r) {
  if (r.kind == WorkKind::Flops)
    return r.work >= 1e12 ? fmt::format("{:.2f} TFLOP", r.work * 1e-12) : fmt::format("{:.3g} GFLOP", r.work * 1e-9);
  return r.work >= 1e9 ? fmt::format("{:.2f} GB", r.work * 1e-9) : fmt::format("{:.3g} MB", r.work * 1e-6);
}

std::string format_rate(const OpRow& r) {
  return r.kind == WorkKind::Flops ? format_flops(r.rate()) : fmt::format("{:.3g} GB/s", r.rate() * 1e-9);
}

int run_bench_ops(const BenchOpsOptions& o, Runtime* rt) {
  if (rt->topology().world_size > 1)
    throw UsageError("bench ops: runs on one rank (start it without mpirun, or with -np 1)");
  if (o.ranks < 1) throw UsageError(fmt::format("bench ops: --ranks {}: expected 1 or more", o.ranks));
  const BenchShape shape = resolve_shape(o);
  const Device& device = rt->device();
  const bool cuda = device.is_cuda();
  const DType dt = o.dtype.empty() ? (cuda ? DType::BF16 : DType::F32) : parse_dtype(o.dtype);  // float_dtype_check

  const int threads = o.threads > 0 ? o.threads : rt->host_threads();
  if (!cuda) require_threads_start(threads, "--threads");
  std::unique_ptr<CudaStream> stream;
  std::unique_ptr<ops::Ops> backend;
  if (cuda) {
    backend = ops::make_cuda_ops();
    stream = std::make_unique<CudaStream>();
    backend->set_stream(stream->ref());
  } else {
    backend = ops::make_cpu_ops(ops::CpuOpsOptions{threads});
  }
  const StreamRef sref = stream ? stream->ref() : StreamRef{};
  if (o.check_calls) check_calls(shape, dt);

  // Ceilings: bf16 8192^3 on a GPU (f32 when --dtype f32), f32 2048^3 on the CPU; copies of 1 GiB / 256 MiB.
  const int64_t peak_n = cuda ? 8192 : 2048;
  const size_t copy_bytes = cuda ? (size_t{1} << 30) : (size_t{256} << 20);
  log::info("bench ops: measuring the ceilings ({} {}^3 matmul, {} copy) on {}", dtype_name(dt), peak_n,
            format_bytes(copy_bytes), device.describe());
  const double peak_flops = ops::measure_matmul_flops(*backend, dt, peak_n, cuda ? 20 : 5, sref);
  const double copy_bw = ops::measure_copy_bandwidth(*backend, copy_bytes, cuda ? 20 : 5, sref);

  OpsBench bench(*backend, sref, o.warmup, o.iters);
  const std::vector<OpRow> rows = run_rows(bench, shape, dt);

  const model::LlamaConfig& c = shape.model;
  const int64_t tokens = shape.batch * shape.seq;
  double model_seconds = 0;
  for (const OpRow& r : rows) model_seconds += r.seconds * static_cast<double>(r.calls);

  fmt::print("bench ops on {} ({} backend{}), {} storage, median of {} calls after {} warm-up\n", device.describe(),
             cuda ? "CUDA" : "CPU", cuda ? std::string() : fmt::format(", {} threads", threads), dtype_name(dt), o.iters,
             o.warmup);
  fmt::print(
      "model ({}): layers {} hidden {} heads {}/{} (kv) head_dim {} intermediate {} vocab {} | micro-batch {} x seq {} = {} tokens\n",
      shape.source, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim(),
      c.intermediate_size, c.vocab_size, shape.batch, shape.seq, tokens);
  fmt::print("ceilings: matmul {} {}^3 {}; copy {:.3g} GB/s (read + write)\n", dtype_name(dt), peak_n,
             format_flops(peak_flops), copy_bw * 1e-9);
  fmt::print(
      "work: GEMMs 2*M*N*K; attention fwd 2*B*H*S^2*Dh (causal half of 4*B*H*S^2*Dh), bwd 2x fwd; "
      "linear_cross_entropy 2*N*D*V (+4*N*D*V with the gradient); memory-bound ops: bytes of each tensor read once + written once\n\n");
  // No utilisation above 100 %: a FLOP row faster than the matmul measured (a disturbed measurement, or a shape
  // the backend runs better) raises the ceiling to that row's rate, and the table says so.
  double flops_ceiling = peak_flops;
  const OpRow* outran = nullptr;
  for (const OpRow& r : rows)
    if (r.kind == WorkKind::Flops && r.rate() > flops_ceiling) flops_ceiling = r.rate(), outran = &r;
  fmt::print("{:<31} {:<38} {:>10} {:>12} {:>15} {:>10} {:>6}\n", "op", "shapes", "median", "work", "rate", "vs ceiling",
             "calls");
  for (const OpRow& r : rows) {
    const std::string versus = r.kind == WorkKind::Flops ? fmt::format("{:.1f} %", 100.0 * r.rate() / flops_ceiling)
                                                         : fmt::format("{:.2f}x copy", r.rate() / copy_bw);
    fmt::print("{:<31} {:<38} {:>10} {:>12} {:>15} {:>10} {:>6}\n", r.op, r.shapes, format_seconds(r.seconds),
               format_work(r), format_rate(r), versus, r.calls);
  }
  fmt::print(
      "\nvs ceiling: FLOP rows in % of the matmul ceiling{}; byte rows as a ratio to the {} main-memory copy's rate "
      "(not a ceiling: a row whose data stays in cache runs faster than it).\n",
      outran ? fmt::format(", raised from the {} measured to {}, the rate of '{}', which outran it",
                           format_flops(peak_flops), format_flops(flops_ceiling), outran->op)
             : std::string(),
      format_bytes(copy_bytes));
  fmt::print("sum of medians x calls (one micro-batch's forward+backward ops, no FSDP, no optimizer): {}, {:.0f} tokens/s\n",
             format_seconds(model_seconds), static_cast<double>(tokens) / model_seconds);

  if (!o.json.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device.describe();
    j["backend"] = cuda ? "cuda" : "cpu";
    j["threads"] = cuda ? 0 : threads;
    j["dtype"] = dtype_name(dt);
    j["iters"] = o.iters;
    j["warmup"] = o.warmup;
    j["model"] = model_json(shape);
    j["batch"] = shape.batch;
    j["seq"] = shape.seq;
    j["tokens"] = tokens;
    // matmul_flops_per_s is the rate measured (a profile's rate for calls it lacks: op_profile.cpp); FLOP rows'
    // fractions are of flops_ceiling, that rate or the fastest FLOP row's where one outran it.
    j["ceilings"] = {{"matmul_flops_per_s", peak_flops},
                     {"matmul_n", peak_n},
                     {"flops_ceiling", flops_ceiling},
                     {"copy_bytes_per_s", copy_bw},
                     {"copy_bytes", copy_bytes}};
    // The calls each row's function makes, from a run in record mode on this backend (the same rows, in order).
    const std::vector<RecordedRow> recorded = record_rows(shape, dt, backend->device());
    if (recorded.size() != rows.size())
      throw InternalError(fmt::format("bench ops: {} rows timed but {} recorded", rows.size(), recorded.size()));
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = 0; i < rows.size(); ++i) {
      const OpRow& r = rows[i];
      if (recorded[i].row.op != r.op)
        throw InternalError(
            fmt::format("bench ops: row {} timed as '{}' but recorded as '{}'", i, r.op, recorded[i].row.op));
      nlohmann::ordered_json calls = nlohmann::ordered_json::array();
      for (const ops::OpCall& call : recorded[i].calls)
        calls.push_back({{"key", call.key}, {"flops", call.flops}, {"bytes", call.bytes}});
      nlohmann::ordered_json row = {
          {"op", r.op},     {"shapes", r.shapes},   {"kind", r.kind == WorkKind::Flops ? "flops" : "bytes"},
          {"work", r.work}, {"seconds", r.seconds}, {"rate", r.rate()}};
      // FLOP rows: a fraction of a ceiling, at most 1; byte rows: a ratio to the main-memory copy, no ceiling.
      if (r.kind == WorkKind::Flops) row["fraction_of_ceiling"] = r.rate() / flops_ceiling;
      else row["ratio_to_copy"] = r.rate() / copy_bw;
      row["calls_per_microbatch"] = r.calls;
      row["calls"] = calls;
      list.push_back(row);
    }
    j["rows"] = list;
    j["model_op_seconds_per_microbatch"] = model_seconds;
    write_text_file(o.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

BenchSubcommand add_bench_ops_command(CLI::App& bench) {
  auto o = std::make_shared<BenchOpsOptions>();
  CLI::App* a = bench.add_subcommand("ops",
                                     "time every op of a training step at a model's shapes on the current backend "
                                     "(CUDA on a GPU, else the CPU), against a measured matmul and copy ceiling");
  a->add_option("--config,-c", o->config,
                "take the model and micro-batch from a training config (TOML); options below override it");
  a->add_option("--ranks", o->ranks,
                "with --config: the data-parallel ranks the micro-batch is derived for "
                "(data.micro_batch_size, or global_batch_size / ranks)")
      ->capture_default_str();
  // A size given must be one: 0 and below stand for "not given" inside, so they are refused here.
  a->add_option("--layers", o->layers, "decoder layers (default: the config's, or 4)")->check(count_range());
  a->add_option("--hidden", o->hidden, "hidden size (default: the config's, or 256)")->check(count_range());
  a->add_option("--seq", o->seq, "sequence length (default: the config's, or 256)")->check(count_range());
  a->add_option("--batch", o->batch, "sequences per micro-batch (default: the config's, or 4)")->check(count_range());
  a->add_option("--heads", o->heads, "attention heads (default: the config's, or 4)")->check(count_range());
  a->add_option("--kv-heads", o->kv_heads, "key/value heads (default: the config's, or --heads)")->check(count_range());
  a->add_option("--vocab", o->vocab, "vocabulary size (default: the config's, or 32000)")->check(count_range());
  a->add_option("--intermediate", o->intermediate, "MLP size (default: the config's, or 4 * hidden)")->check(count_range());
  a->add_option("--dtype", o->dtype, "activation and parameter storage: f32 or bf16 (default bf16 on CUDA, f32 on the CPU)")
      ->check(float_dtype_check());
  a->add_option("--iters", o->iters, "timed calls per op")->capture_default_str()->check(CLI::Range(1, 100000));
  a->add_option("--warmup", o->warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 100000));
  a->add_option("--threads", o->threads, "CPU backend threads (0 = the rank's cores, at most 1024)")
      ->capture_default_str()
      ->check(cpu_threads_range());
  a->add_option("--json", o->json, "also write every row as JSON to this file")->check(output_file_check());
  a->add_flag("--check-calls", o->check_calls,
              "first run the model once (batch 1, no math) through a recorder of op "
              "calls and fail unless each row's calls per micro-batch are the model's");
  return {a, [o](Runtime* rt) { return run_bench_ops(*o, rt); }};
}

}  // namespace shardtrain::cli
