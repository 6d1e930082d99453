// `shardtrain plan`: the FSDP unit layout of a model on a mesh, and what each rank holds and sends per
// step, without running anything (offline; no MPI). The figures are the formulas of docs/fsdp.md, the
// same ones the engine's accounting is tested against. The model, FSDP options, sequence length and
// micro-batch come from the options, or from a training config (--config) under the options given.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "config_args.hpp"
#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/hf_configs.hpp"
#include "shardtrain/train/metrics.hpp"

namespace shardtrain::cli {

std::optional<NumberWithUnit> split_number_unit(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  if (digits == 0) return std::nullopt;
  NumberWithUnit n;
  n.unit = text.substr(digits);
  std::transform(n.unit.begin(), n.unit.end(), n.unit.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  size_t used = 0;
  try {
    n.value = std::stod(text.substr(0, digits), &used);
  } catch (const std::logic_error&) {
    return std::nullopt;
  }
  if (used != digits) return std::nullopt;
  return n;
}

double parse_gpu_memory(const std::string& text) {
  const std::optional<NumberWithUnit> n = split_number_unit(text);
  const double scale = !n                                    ? 0
                       : n->unit.empty() || n->unit == "gib" ? static_cast<double>(1ull << 30)
                       : n->unit == "gb"                     ? 1e9
                                                             : 0;
  if (scale == 0 || !std::isfinite(n->value) || n->value <= 0)
    throw UsageError(
        fmt::format("--gpu-memory: '{}' is not a memory size; expected a positive number of GiB (80), or one with a unit: "
                    "80GiB (2^30 bytes each) or 80GB (10^9 bytes each)",
                    text));
  return std::round(n->value * scale);  // whole bytes
}

namespace {

struct PlanOptions {
  ConfigArgs run;  // a training run's files and --section.key overrides, as `shardtrain train` reads them
  model::LlamaConfig model;
  int nodes = 1;
  int gpus_per_node = 1;
  std::string strategy = "FULL_SHARD";
  int shard_size = 0;
  std::string wrap = "TRANSFORMER_BASED_WRAP";
  std::vector<std::string> wrap_cls = {"LlamaDecoderLayer"};
  int64_t min_num_params = 100'000'000;
  std::string param_dtype = "bf16", reduce_dtype = "fp32";
  int forward_prefetch = 1, backward_prefetch = 1;
  std::string grad_accumulation = "reduce_each";
  bool json = false;
  // The step-time estimate: stated rates, not measurements.
  int seq = 2048, micro_batch = 1;
  int accumulation = 1;  // micro-batches a step (with --config: global_batch_size / (micro-batch x ranks), else 1)
  bool activation_checkpointing = false, offload = false;
  std::string gpu_memory = "80GiB";
  double gpu_memory_bytes = 80.0 * (1ull << 30);  // parsed from gpu_memory
  double gpu_tflops = 790, mfu = 0.5, intra_gbps = 360, inter_gbps = 50;
};

// One strategy on this model and cluster: device memory per rank, and a step-time estimate from the
// stated FLOP rate and link bandwidths (ring collectives: (n-1)/n of the counted bytes cross each
// rank's link, twice for an all-reduce; an axis within one node uses the intra-node bandwidth). A step is
// o.accumulation micro-batches: each computes and gathers its units again (the engine reshards after each
// backward); the reductions follow fsdp.grad_accumulation (docs/architecture.md): reduce_each reduce-scatters and
// all-reduces every micro-batch, no_sync both once, all_reduce_last reduce-scatters every micro-batch and
// all-reduces over replicas once.
struct StrategyEstimate {
  ShardingStrategy strategy;
  double device_bytes = 0, host_bytes = 0, activations = 0, op_scratch = 0;
  double compute_s = 0, comm_s = 0;
  bool fits = false;
  int shard = 0, replicate = 0;  // the row's mesh
};

// The configured strategy's row is the plan's own (its reshard_after_forward too), so that it agrees with `check` and
// `predict`; another strategy takes its defaults. A hybrid row keeps the configured shard size (fsdp.shard_size,
// --shard-size; 0: ranks per node): the 70B config's groups of 32 were priced as groups of 8.
StrategyEstimate estimate(const PlanOptions& o, const model::ModelSpec& spec, fsdp::FsdpConfig f, ShardingStrategy s) {
  if (s != f.strategy) f.reshard_after_forward.reset();
  f.strategy = s;
  if (!strategy_is_hybrid(s)) f.shard_size = 0;
  const int world = world_size_of(o.nodes, o.gpus_per_node);
  const fsdp::FsdpPlan plan = fsdp::plan_fsdp(spec, f, world, o.gpus_per_node);
  StrategyEstimate e{s};
  e.shard = plan.mesh.shard_size;
  e.replicate = plan.mesh.replicate_size;
  const fsdp::MemoryEstimate m =
      fsdp::estimate_memory(spec, f, plan, o.micro_batch, o.seq);  // f carries o's checkpointing, offload
  e.activations = m.activations;
  e.op_scratch = m.op_scratch;
  e.device_bytes = m.device;
  e.host_bytes = m.host;
  e.fits = e.device_bytes <= o.gpu_memory_bytes;
  // FLOPs per token by the rule every MFU figure uses (train::flops_per_token), for the step's every micro-batch;
  // recompute adds a forward.
  const double A = o.accumulation;
  double flops = train::flops_per_token(spec, o.seq) * static_cast<double>(o.micro_batch * o.seq) * A;
  if (o.activation_checkpointing) flops *= 4.0 / 3.0;
  e.compute_s = flops / (o.gpu_tflops * 1e12 * o.mfu);
  const int S = plan.mesh.shard_size, R = plan.mesh.replicate_size;
  const double shard_bw = (S <= o.gpus_per_node ? o.intra_gbps : o.inter_gbps) * 1e9;
  const double rep_bw = (o.nodes == 1 ? o.intra_gbps : o.inter_gbps) * 1e9;
  const double reduce_scatters = f.accumulation == fsdp::GradAccumulation::NoSync ? 1 : A;
  const double all_reduces = f.accumulation == fsdp::GradAccumulation::ReduceEachMicroBatch ? A : 1;
  if (S > 1) {
    e.comm_s += (S - 1.0) / S *
                (A * static_cast<double>(plan.shard_all_gather_bytes) +
                 reduce_scatters * static_cast<double>(plan.shard_reduce_scatter_bytes)) /
                shard_bw;
  }
  if (R > 1) e.comm_s += 2.0 * (R - 1.0) / R * all_reduces * static_cast<double>(plan.replicate_all_reduce_bytes) / rep_bw;
  return e;
}

std::string estimate_table(const PlanOptions& o, const model::ModelSpec& spec, const fsdp::FsdpConfig& f,
                           nlohmann::json& j) {
  // --mfu is a fraction of --gpu-tflops (a measured GEMM peak by default), not MFU, whose denominator is the spec
  // peak (metrics.hpp): 50 % of 790 TFLOP/s is 39.9 % of the H100's and H200's 989.
  const double rate = o.gpu_tflops * 1e12 * o.mfu;
  const double spec_peak = ops::gpu_spec_peak("H100").flops_per_s;
  std::string out = fmt::format(
      "\nevery strategy on {} node(s) x {} GPUs, micro-batch {} x seq {}, {} micro-batch(es) a step ({}){}{}; {:.4g} GiB "
      "per GPU; {:.0f} TFLOP/s a GPU ({:.0f}% of a {:.0f} TFLOP/s GEMM peak = {:.1f}% MFU of the H100/H200's {:.0f} "
      "TFLOP/s dense bf16 spec peak), links {:.0f} GB/s in a node and {:.0f} GB/s between nodes (stated, not measured); "
      "times are an ESTIMATE for the whole step:\n",
      o.nodes, o.gpus_per_node, o.micro_batch, o.seq, o.accumulation, fsdp::grad_accumulation_name(f.accumulation),
      o.activation_checkpointing ? ", activation checkpointing" : "", o.offload ? ", CPU offload" : "",
      o.gpu_memory_bytes / (1ull << 30), rate / 1e12, 100 * o.mfu, o.gpu_tflops, 100 * rate / spec_peak, spec_peak / 1e12,
      o.intra_gbps, o.inter_gbps);
  j["estimate"] = true;  // the step times: stated rates, not measured (as predict's JSON carries "prediction": true)
  j["step_estimate"] = {
      {"accumulation_steps", o.accumulation}, {"grad_accumulation", fsdp::grad_accumulation_name(f.accumulation)},
      {"gpu_tflops", o.gpu_tflops},           {"fraction_of_gpu_tflops", o.mfu},
      {"flops_per_s_per_gpu", rate},          {"spec_peak_flops", spec_peak},
      {"mfu_of_spec_peak", rate / spec_peak}};
  out += fmt::format("{:<20} {:>12} {:>12} {:>10} {:>11} {:>9} {:>10}  {}\n", "strategy", "device GiB", "activations",
                     "host GiB", "compute ms", "comm ms", "step ms", "fits");
  const StrategyEstimate* best = nullptr;
  std::vector<StrategyEstimate> all;
  for (int s = 1; s <= 5; ++s) {
    try {
      all.push_back(estimate(o, spec, f, static_cast<ShardingStrategy>(s)));
    } catch (const ConfigError&) {
      continue;  // a mesh that does not fit this cluster
    }
  }
  for (const StrategyEstimate& e : all) {
    const double step = std::max(e.compute_s, e.comm_s);  // communication overlapped with compute
    out += fmt::format("{:<20} {:>12.2f} {:>12.2f} {:>10.2f} {:>11.1f} {:>9.1f} {:>10.1f}  {}\n",
                       sharding_strategy_name(e.strategy), e.device_bytes / (1ull << 30), e.activations / (1ull << 30),
                       e.host_bytes / (1ull << 30), 1e3 * e.compute_s, 1e3 * e.comm_s, 1e3 * step, e.fits ? "yes" : "no");
    j["strategies"].push_back({{"strategy", sharding_strategy_name(e.strategy)},
                               {"device_bytes", e.device_bytes},
                               {"activation_bytes", e.activations},
                               {"op_scratch_bytes", e.op_scratch},
                               {"host_bytes", e.host_bytes},
                               {"compute_s", e.compute_s},
                               {"comm_s", e.comm_s},
                               {"step_s", step},
                               {"fits", e.fits},
                               {"mesh", {{"replicate", e.replicate}, {"shard", e.shard}}}});
    if (e.fits && (!best || step < std::max(best->compute_s, best->comm_s))) best = &e;
  }
  const auto hybrid =
      std::find_if(all.begin(), all.end(), [](const StrategyEstimate& e) { return strategy_is_hybrid(e.strategy); });
  if (hybrid != all.end())
    out += fmt::format("hybrid rows: mesh {} (replicate) x {} (shard), {}\n", hybrid->replicate, hybrid->shard,
                       f.shard_size > 0 ? "shard groups of fsdp.shard_size (--shard-size)"
                                        : "a node a shard group (no fsdp.shard_size given)");
  if (best) {
    out += fmt::format(
        "recommended: {} (the fastest estimate that fits; `shardtrain predict` runs the engine's own "
        "schedule for the step time and what it exposes: docs/predict.md)\n",
        sharding_strategy_name(best->strategy));
    j["recommended"] = sharding_strategy_name(best->strategy);
  } else {
    out += "recommended: none fits: try activation checkpointing, CPU offload, a smaller micro-batch or more GPUs\n";
    j["recommended"] = nullptr;
  }
  return out;
}

std::string gib(double bytes) { return fmt::format("{:.3f} GiB", bytes / (1ull << 30)); }

bool given(const CLI::App& app, const char* option) { return app.get_option(option)->count() > 0; }

// What the plan is made of: the options, over the training config's values when --config is given
// (an option given explicitly wins; one left out takes the config's value, not the option's default).
struct Resolved {
  PlanOptions o;
  fsdp::FsdpConfig f;
  nlohmann::json config;  // null without --config
};

Resolved resolve(const PlanOptions& cli, const CLI::App& app) {
  Resolved r{cli, {}, nullptr};
  PlanOptions& o = r.o;
  fsdp::FsdpConfig& f = r.f;
  o.gpu_memory_bytes = parse_gpu_memory(cli.gpu_memory);
  std::optional<train::TrainConfig> cfg;
  std::string source;
  if (!cli.run.config.empty()) {
    // The same files and overrides, in the same order, as `shardtrain train`: a job's TRAIN_ARGS plan as they train.
    std::vector<std::string> notes;
    cfg = cli.run.resolve(notes, source);
    for (const auto& n : notes) log::info("plan: {}", n);
    f = cfg->fsdp.engine;
    o.model = cfg->model;
  } else if (!cli.run.fsdp_config.empty() || !cli.run.accelerate_config.empty() ||
             std::any_of(cli.run.override_options.begin(), cli.run.override_options.end(),
                         [](const CLI::Option* opt) { return opt->count() > 0; })) {
    throw UsageError(
        "--fsdp-config, --accelerate-config and --section.key options adjust a training config: give it with --config "
        "FILE");
  }
  auto take = [&](const char* option) { return !cfg || given(app, option); };
  if (take("--strategy")) f.strategy = parse_sharding_strategy(cli.strategy);
  if (take("--shard-size")) f.shard_size = cli.shard_size;
  if (take("--wrap")) f.wrap.policy = fsdp::parse_wrap_policy(cli.wrap);
  if (take("--wrap-cls")) {
    f.wrap.transformer_layer_cls.clear();
    for (const auto& c : cli.wrap_cls) f.wrap.transformer_layer_cls.push_back(model::parse_module_class(c));
  }
  if (take("--min-num-params")) f.wrap.min_num_params = cli.min_num_params;
  if (take("--param-dtype")) f.param_dtype = parse_dtype(cli.param_dtype);
  if (take("--reduce-dtype")) f.reduce_dtype = parse_dtype(cli.reduce_dtype);
  if (take("--forward-prefetch")) f.forward_prefetch = cli.forward_prefetch;
  if (take("--backward-prefetch")) f.backward_prefetch = cli.backward_prefetch;
  if (take("--grad-accumulation")) f.accumulation = fsdp::parse_grad_accumulation(cli.grad_accumulation);
  if (cfg) {
    if (!given(app, "--activation-checkpointing")) o.activation_checkpointing = f.activation_checkpointing;
    if (!given(app, "--offload")) o.offload = f.offload_params;
    if (given(app, "--vocab")) o.model.vocab_size = cli.model.vocab_size;
    if (given(app, "--hidden")) o.model.hidden_size = cli.model.hidden_size;
    if (given(app, "--intermediate")) o.model.intermediate_size = cli.model.intermediate_size;
    if (given(app, "--layers")) o.model.num_hidden_layers = cli.model.num_hidden_layers;
    if (given(app, "--heads")) o.model.num_attention_heads = cli.model.num_attention_heads;
    if (given(app, "--kv-heads")) o.model.num_key_value_heads = cli.model.num_key_value_heads;
    if (given(app, "--tie-word-embeddings")) o.model.tie_word_embeddings = true;
    if (!given(app, "--seq")) o.seq = cfg->data.seq_len;
    // The world an Accelerate config names (num_processes over num_machines), unless the cluster is given.
    if (!given(app, "--nodes") && !given(app, "--gpus-per-node") && cfg->fsdp.num_processes > 0) {
      o.nodes = std::max(1, cfg->fsdp.num_machines);
      if (cfg->fsdp.num_processes % o.nodes != 0)
        throw ConfigError(fmt::format("{}: fsdp.num_processes {} is not a multiple of fsdp.num_machines {}", source,
                                      cfg->fsdp.num_processes, o.nodes));
      o.gpus_per_node = cfg->fsdp.num_processes / o.nodes;
    }
  }
  f.activation_checkpointing = o.activation_checkpointing;
  f.offload_params = o.offload;
  o.model.validate();
  train::validate_model_size(o.model);  // before the spec is built, layer by layer
  f.validate();
  if (cfg) {
    // The per-rank micro-batch as the trainer derives it, on the planned world (which may differ from
    // the one the config was written for: num_processes and num_machines are not checked against it).
    const int world = world_size_of(o.nodes, o.gpus_per_node);
    train::TrainConfig c = *cfg;
    c.fsdp.num_processes = 0;
    c.fsdp.num_machines = 0;
    if (!given(app, "--micro-batch")) {
      try {
        c.validate_for_world(world, o.nodes);
      } catch (const ConfigError& e) {
        throw ConfigError(
            fmt::format("{}: {} (planning {} node(s) x {} GPUs); give --micro-batch or another --nodes/--gpus-per-node",
                        source, e.what(), o.nodes, o.gpus_per_node));
      }
      o.micro_batch = c.micro_batch_size_for(world);
    }
    const int per_step = o.micro_batch * world;
    const int accumulation =
        per_step > 0 && cfg->data.global_batch_size % per_step == 0 ? cfg->data.global_batch_size / per_step : 0;
    // A global batch that is no whole number of micro-batches (--micro-batch given): the estimate is one micro-batch's.
    o.accumulation = std::max(1, accumulation);
    r.config = {
        {"source", source}, {"global_batch_size", cfg->data.global_batch_size}, {"accumulation_steps", accumulation}};
    // As train::engine_config: gradients stay out of activation memory when a step has several micro-batches.
    if (accumulation != 1) f.grads_in_activation_memory = false;
  }
  return r;
}

nlohmann::json inputs_json(const PlanOptions& o, const fsdp::FsdpConfig& f) {
  nlohmann::json cls = nlohmann::json::array();
  for (auto c : f.wrap.transformer_layer_cls) cls.push_back(model::module_class_name(c));
  const model::LlamaConfig& m = o.model;
  return {{"nodes", o.nodes},
          {"gpus_per_node", o.gpus_per_node},
          {"model",
           {{"vocab_size", m.vocab_size},
            {"hidden_size", m.hidden_size},
            {"intermediate_size", m.intermediate_size},
            {"num_hidden_layers", m.num_hidden_layers},
            {"num_attention_heads", m.num_attention_heads},
            {"num_key_value_heads", m.num_key_value_heads},
            {"tie_word_embeddings", m.tie_word_embeddings}}},
          {"fsdp",
           {{"strategy", sharding_strategy_name(f.strategy)},
            {"shard_size", f.shard_size},
            {"wrap", fsdp::wrap_policy_name(f.wrap.policy)},
            {"wrap_cls", cls},
            {"min_num_params", f.wrap.min_num_params},
            {"param_dtype", dtype_name(f.param_dtype)},
            {"reduce_dtype", dtype_name(f.reduce_dtype)},
            {"forward_prefetch", f.forward_prefetch},
            {"backward_prefetch", f.backward_prefetch},
            {"grad_accumulation", fsdp::grad_accumulation_name(f.accumulation)},
            {"activation_checkpointing", o.activation_checkpointing},
            {"offload", o.offload}}},
          {"seq", o.seq},
          {"micro_batch", o.micro_batch},
          {"gpu_memory_bytes", static_cast<int64_t>(o.gpu_memory_bytes)}};
}

int run_plan(const PlanOptions& cli, const CLI::App& app) {
  const Resolved resolved = resolve(cli, app);
  const PlanOptions& o = resolved.o;
  const fsdp::FsdpConfig& f = resolved.f;
  const model::ModelSpec spec(o.model);
  const int world = world_size_of(o.nodes, o.gpus_per_node);
  const fsdp::FsdpPlan plan = fsdp::plan_fsdp(spec, f, world, o.gpus_per_node);
  const MeshLayout& mesh = plan.mesh;
  const int R = mesh.replicate_size;
  const bool raf = f.reshards_after_forward();

  nlohmann::json j;
  j["inputs"] = inputs_json(o, f);
  if (!resolved.config.is_null()) j["config"] = resolved.config;
  j["mesh"] = {{"replicate", R}, {"shard", mesh.shard_size}, {"strategy", sharding_strategy_name(f.strategy)}};
  j["params"] = spec.num_params();
  std::string table = fmt::format("{:>4}  {:<28} {:>6} {:>12} {:>8} {:>12}\n", "unit", "first module", "params",
                                  "N (padded)", "padding", "N/S per rank");
  for (const fsdp::UnitPlan& up : plan.units) {
    const fsdp::UnitSpec& u = up.spec;
    const fsdp::FlatLayout& l = up.layout;
    table += fmt::format("{:>4}  {:<28} {:>6} {:>12} {:>8} {:>12}\n", u.index, u.is_root ? "root" : u.name, u.params.size(),
                         l.padded_numel, l.padded_numel - l.used, l.shard_numel());
    j["units"].push_back({{"index", u.index},
                          {"name", u.name},
                          {"root", u.is_root},
                          {"params", u.params.size()},
                          {"padded_numel", l.padded_numel},
                          {"padding", l.padded_numel - l.used},
                          {"shard_numel", l.shard_numel()}});
  }
  const double depth = std::max(f.forward_prefetch, f.backward_prefetch);
  const auto sharded = static_cast<double>(plan.sharded_state_bytes);
  const auto unsharded = static_cast<double>(plan.unsharded_param_bytes);
  const auto grad_unit = static_cast<double>(plan.unsharded_grad_bytes);
  const auto gather = static_cast<double>(plan.shard_all_gather_bytes);
  const auto reduce_scatter = static_cast<double>(plan.shard_reduce_scatter_bytes);
  const auto all_reduce = static_cast<double>(plan.replicate_all_reduce_bytes);
  const ops::CudaScratchBytes scratch = fsdp::op_scratch_bytes(spec, f.param_dtype, o.micro_batch, o.seq);
  j["memory_per_rank_bytes"] = {{"sharded_state", sharded},
                                {"unsharded_params", unsharded},
                                {"unsharded_grads", grad_unit},
                                {"comm_scratch", static_cast<double>(plan.comm_scratch_bytes)},
                                {"op_scratch", static_cast<double>(scratch.total())},
                                {"cudnn_attention_workspace", static_cast<double>(scratch.cudnn_attention)}};
  const fsdp::MemoryEstimate memory = fsdp::estimate_memory(spec, f, plan, o.micro_batch, o.seq);
  j["memory_per_rank_bytes"]["grads_in_activation_memory"] = memory.grads_in_activations;
  j["traffic_per_micro_batch_bytes"] = {
      {"all_gather_shard", gather}, {"reduce_scatter_shard", reduce_scatter}, {"all_reduce_replicate", all_reduce}};
  const std::string estimates = estimate_table(o, spec, f, j);
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::string out;
  if (!resolved.config.is_null())
    out += fmt::format("config: {} (model, fsdp, seq_len {}, micro-batch {} per rank{}); options given override it\n",
                       resolved.config["source"].get<std::string>(), o.seq, o.micro_batch,
                       resolved.config["accumulation_steps"].get<int>() > 0
                           ? fmt::format(" = global batch {} / {} ranks / {} accumulation step(s)",
                                         resolved.config["global_batch_size"].get<int>(), world,
                                         resolved.config["accumulation_steps"].get<int>())
                           : std::string());
  out += fmt::format("model: {} parameters, {} layers; mesh {} for {} on {} ranks; wrap {}\n", spec.num_params(),
                     spec.num_layers(), mesh.describe(), sharding_strategy_name(f.strategy), world,
                     fsdp::wrap_policy_name(f.wrap.policy));
  out += table;
  out += fmt::format(
      "per rank: sharded state (fp32 param, grad, exp_avg, exp_avg_sq) {}, unsharded params ({}) {}, "
      "full fp32 gradient buffers {}{}, communication scratch {} (+ activations and op scratch)\n",
      gib(sharded), raf ? fmt::format("{} prefetch + root", depth) : std::string("all units kept"), gib(unsharded),
      gib(grad_unit),
      fsdp::grads_live_in_shards(f, plan.mesh.shard_size, plan.mesh.replicate_size)
          ? " (one rank: backward writes the gradient shards)"
          : "",
      gib(static_cast<double>(plan.comm_scratch_bytes)));
  if (f.places_grads_in_activations())
    out += fmt::format(
        "gradient shards: {} of the {} in activation memory that backward is done with (fsdp.grads_in_activation_memory; "
        "micro-batch {} x {}), the rest in memory of their own\n",
        gib(memory.grads_in_activations), gib(sharded / 4), o.micro_batch, o.seq);
  else
    out +=
        "gradient shards: in memory of their own (fsdp.grads_in_activation_memory off, or several micro-batches a step)\n";
  out += fmt::format(
      "traffic per micro-batch per rank: all-gather {} and reduce-scatter {} on the shard axis, all-reduce {} "
      "on the replicate axis\n",
      gib(gather), gib(reduce_scatter), gib(all_reduce));
  out += fmt::format(
      "op scratch on a GPU: {} (fused loss chunk {}, largest kernel workspace {}, cuDNN attention "
      "workspace {}{}, cuBLASLt workspace {})\n",
      gib(static_cast<double>(scratch.total())), gib(static_cast<double>(scratch.loss)),
      gib(static_cast<double>(scratch.op_workspace)), gib(static_cast<double>(scratch.cudnn_attention)),
      scratch.cudnn_attention == 0              ? ""
      : ops::deterministic_attention_from_env() ? " (deterministic backward's dP; the two share one buffer)"
                                                : " (backward's dQ accumulator; the two share one buffer)",
      gib(static_cast<double>(scratch.gemm_workspace)));
  out += estimates;
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto o = std::make_shared<PlanOptions>();
  Command c;
  c.app = parent.add_subcommand("plan", "print the FSDP unit layout, per-rank memory and traffic of a model on a mesh");
  o->run.add_to(c.app, ConfigArgs::Use::Plan);
  c.app->get_option("--config")
      ->description(
          "a training config (TOML, as `shardtrain train` reads it, with its --section.key overrides): the model, fsdp, "
          "seq_len and micro-batch come from it; options given explicitly override it");
  c.app->get_option("--accelerate-config")
      ->description(
          "an Accelerate config YAML applied over --config (its num_processes/num_machines give the cluster unless "
          "--nodes or --gpus-per-node is given)");
  c.app->add_option("--vocab", o->model.vocab_size, "vocab_size")->capture_default_str();
  c.app->add_option("--hidden", o->model.hidden_size, "hidden_size")->capture_default_str();
  c.app->add_option("--intermediate", o->model.intermediate_size, "intermediate_size")->capture_default_str();
  c.app->add_option("--layers", o->model.num_hidden_layers, "num_hidden_layers")->capture_default_str();
  c.app->add_option("--heads", o->model.num_attention_heads, "num_attention_heads")->capture_default_str();
  c.app->add_option("--kv-heads", o->model.num_key_value_heads, "num_key_value_heads")->capture_default_str();
  c.app->add_flag("--tie-word-embeddings", o->model.tie_word_embeddings, "share embed_tokens and lm_head");
  c.app->add_option("--nodes", o->nodes, "nodes")->capture_default_str()->check(count_range());
  c.app->add_option("--gpus-per-node", o->gpus_per_node, "ranks per node (one per GPU)")
      ->capture_default_str()
      ->check(count_range(1, kMaxRanksPerNode));
  c.app->add_option("--strategy", o->strategy, "sharding strategy")->capture_default_str();
  c.app->add_option("--shard-size", o->shard_size, "hybrid: ranks per shard group");
  c.app->add_option("--wrap", o->wrap, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")->capture_default_str();
  c.app->add_option("--wrap-cls", o->wrap_cls, "transformer_layer_cls_to_wrap (space- or comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  c.app->add_option("--min-num-params", o->min_num_params, "SIZE_BASED_WRAP threshold")->capture_default_str();
  c.app->add_option("--param-dtype", o->param_dtype, "fp32 or bf16")->check(float_dtype_check())->capture_default_str();
  c.app->add_option("--reduce-dtype", o->reduce_dtype, "fp32 or bf16")->check(float_dtype_check())->capture_default_str();
  c.app->add_option("--forward-prefetch", o->forward_prefetch)->capture_default_str();
  c.app->add_option("--backward-prefetch", o->backward_prefetch)->capture_default_str();
  c.app
      ->add_option(
          "--grad-accumulation", o->grad_accumulation,
          "reduce_each, no_sync (unsharded gradients of every unit kept until the last micro-batch) or all_reduce_last")
      ->capture_default_str();
  c.app->add_flag("--json", o->json, "one JSON object");
  c.app->add_option("--seq", o->seq, "sequence length (activations, FLOPs)")->capture_default_str()->check(count_range());
  c.app
      ->add_option("--micro-batch", o->micro_batch,
                   "sequences per rank per micro-batch (with --config: data.micro_batch_size, or global_batch_size / ranks)")
      ->capture_default_str()
      ->check(count_range());
  c.app->add_flag("--activation-checkpointing", o->activation_checkpointing, "per decoder layer");
  c.app->add_flag("--offload", o->offload, "CPU offload: sharded state in host memory");
  c.app->add_option("--gpu-memory", o->gpu_memory, "memory per GPU: 80GiB or 80 (GiB), 80GB (10^9 bytes)")
      ->capture_default_str();
  c.app
      ->add_option("--gpu-tflops", o->gpu_tflops,
                   "dense bf16 TFLOP/s per GPU that --mfu is a fraction of: a measured GEMM peak (the H100/H200's spec "
                   "peak, MFU's denominator, is 989)")
      ->capture_default_str()
      ->check(positive_up_to(1e6, 1e-3));
  c.app
      ->add_option("--mfu", o->mfu,
                   "fraction of --gpu-tflops the step reaches; MFU only when --gpu-tflops is the spec peak (0.5 of 790 "
                   "is 39.9 % MFU of the 989 spec peak)")
      ->capture_default_str()
      ->check(positive_up_to(1, 1e-3));
  c.app->add_option("--intra-gbps", o->intra_gbps, "GB/s per GPU inside a node (NVLink bus bandwidth)")
      ->capture_default_str()
      ->check(positive_up_to(1e6, 1e-3));
  c.app->add_option("--inter-gbps", o->inter_gbps, "GB/s per GPU between nodes (network)")
      ->capture_default_str()
      ->check(positive_up_to(1e6, 1e-3));
  c.launch = Launch::Offline;
  c.app->footer("With --config, an option left out takes the config's value rather than its default shown here.");
  c.run = [o, app = c.app](Runtime*) { return run_plan(*o, *app); };
  return c;
}

}  // namespace shardtrain::cli
