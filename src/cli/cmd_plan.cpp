// `shardtrain plan`: the FSDP unit layout of a model on a mesh, and what each rank holds and sends per
// step, without running anything (offline; no MPI). The figures are the formulas of docs/fsdp.md, the
// same ones the engine's accounting is tested against.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/fsdp/config.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/model/spec.hpp"

namespace shardtrain::cli {
namespace {

struct PlanOptions {
  model::LlamaConfig model;
  int nodes = 1;
  int gpus_per_node = 1;
  std::string strategy = "FULL_SHARD";
  int shard_size = 0;
  std::string wrap = "TRANSFORMER_BASED_WRAP";
  std::vector<std::string> wrap_cls = {"LlamaDecoderLayer"};
  int64_t min_num_params = 100'000'000;
  std::string param_dtype = "bf16", reduce_dtype = "fp32";
  int forward_prefetch = 0, backward_prefetch = 1;
  bool json = false;
};

std::string gib(double bytes) { return fmt::format("{:.3f} GiB", bytes / (1ull << 30)); }

int run_plan(const PlanOptions& o) {
  fsdp::FsdpConfig f;
  f.strategy = parse_sharding_strategy(o.strategy);
  f.shard_size = o.shard_size;
  f.wrap.policy = fsdp::parse_wrap_policy(o.wrap);
  f.wrap.transformer_layer_cls.clear();
  for (const auto& c : o.wrap_cls) f.wrap.transformer_layer_cls.push_back(model::parse_module_class(c));
  f.wrap.min_num_params = o.min_num_params;
  f.param_dtype = parse_dtype(o.param_dtype);
  f.reduce_dtype = parse_dtype(o.reduce_dtype);
  f.forward_prefetch = o.forward_prefetch;
  f.backward_prefetch = o.backward_prefetch;
  f.validate();
  const model::ModelSpec spec(o.model);
  const int world = o.nodes * o.gpus_per_node;
  const fsdp::FsdpPlan plan = fsdp::plan_fsdp(spec, f, world, o.gpus_per_node);
  const MeshLayout& mesh = plan.mesh;
  const int R = mesh.replicate_size;
  const bool raf = f.reshards_after_forward();

  nlohmann::json j;
  j["mesh"] = {{"replicate", R}, {"shard", mesh.shard_size}, {"strategy", sharding_strategy_name(f.strategy)}};
  j["params"] = spec.num_params();
  std::string table = fmt::format("{:>4}  {:<28} {:>6} {:>12} {:>8} {:>12}\n", "unit", "first module", "params", "N (padded)",
                                  "padding", "N/S per rank");
  for (const fsdp::UnitPlan& up : plan.units) {
    const fsdp::UnitSpec& u = up.spec;
    const fsdp::FlatLayout& l = up.layout;
    table += fmt::format("{:>4}  {:<28} {:>6} {:>12} {:>8} {:>12}\n", u.index, u.is_root ? "root" : u.name, u.params.size(),
                         l.padded_numel, l.padded_numel - l.used, l.shard_numel());
    j["units"].push_back({{"index", u.index}, {"name", u.name}, {"root", u.is_root}, {"params", u.params.size()},
                          {"padded_numel", l.padded_numel}, {"padding", l.padded_numel - l.used}, {"shard_numel", l.shard_numel()}});
  }
  const double depth = std::max(f.forward_prefetch, f.backward_prefetch);
  const auto sharded = static_cast<double>(plan.sharded_state_bytes);
  const auto unsharded = static_cast<double>(plan.unsharded_param_bytes);
  const auto grad_unit = static_cast<double>(plan.unsharded_grad_bytes);
  const auto gather = static_cast<double>(plan.shard_all_gather_bytes);
  const auto reduce_scatter = static_cast<double>(plan.shard_reduce_scatter_bytes);
  const auto all_reduce = static_cast<double>(plan.replicate_all_reduce_bytes);
  j["memory_per_rank_bytes"] = {{"sharded_state", sharded}, {"unsharded_params", unsharded}, {"unsharded_grads", grad_unit}};
  j["traffic_per_micro_batch_bytes"] = {{"all_gather_shard", gather}, {"reduce_scatter_shard", reduce_scatter},
                                        {"all_reduce_replicate", all_reduce}};
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::string out = fmt::format("model: {} parameters, {} layers; mesh {} for {} on {} ranks; wrap {}\n", spec.num_params(),
                                spec.num_layers(), mesh.describe(), sharding_strategy_name(f.strategy), world,
                                fsdp::wrap_policy_name(f.wrap.policy));
  out += table;
  out += fmt::format("per rank: sharded state (fp32 param, grad, exp_avg, exp_avg_sq) {}, unsharded params ({}) {}, "
                     "full fp32 gradient buffers {} (+ activations)\n",
                     gib(sharded), raf ? fmt::format("{} prefetch + root", depth) : std::string("all units kept"), gib(unsharded),
                     gib(grad_unit));
  out += fmt::format("traffic per micro-batch per rank: all-gather {} and reduce-scatter {} on the shard axis, all-reduce {} "
                     "on the replicate axis\n",
                     gib(gather), gib(reduce_scatter), gib(all_reduce));
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& parent) {
  auto o = std::make_shared<PlanOptions>();
  Command c;
  c.app = parent.add_subcommand("plan", "print the FSDP unit layout, per-rank memory and traffic of a model on a mesh");
  c.app->add_option("--vocab", o->model.vocab_size, "vocab_size")->capture_default_str();
  c.app->add_option("--hidden", o->model.hidden_size, "hidden_size")->capture_default_str();
  c.app->add_option("--intermediate", o->model.intermediate_size, "intermediate_size")->capture_default_str();
  c.app->add_option("--layers", o->model.num_hidden_layers, "num_hidden_layers")->capture_default_str();
  c.app->add_option("--heads", o->model.num_attention_heads, "num_attention_heads")->capture_default_str();
  c.app->add_option("--kv-heads", o->model.num_key_value_heads, "num_key_value_heads")->capture_default_str();
  c.app->add_flag("--tie-word-embeddings", o->model.tie_word_embeddings, "share embed_tokens and lm_head");
  c.app->add_option("--nodes", o->nodes, "nodes")->capture_default_str()->check(CLI::PositiveNumber);
  c.app->add_option("--gpus-per-node", o->gpus_per_node, "ranks per node (one per GPU)")->capture_default_str()->check(CLI::PositiveNumber);
  c.app->add_option("--strategy", o->strategy, "sharding strategy")->capture_default_str();
  c.app->add_option("--shard-size", o->shard_size, "hybrid: ranks per shard group");
  c.app->add_option("--wrap", o->wrap, "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")->capture_default_str();
  c.app->add_option("--wrap-cls", o->wrap_cls, "transformer_layer_cls_to_wrap")->capture_default_str();
  c.app->add_option("--min-num-params", o->min_num_params, "SIZE_BASED_WRAP threshold")->capture_default_str();
  c.app->add_option("--param-dtype", o->param_dtype, "fp32 or bf16")->capture_default_str();
  c.app->add_option("--reduce-dtype", o->reduce_dtype, "fp32 or bf16")->capture_default_str();
  c.app->add_option("--forward-prefetch", o->forward_prefetch)->capture_default_str();
  c.app->add_option("--backward-prefetch", o->backward_prefetch)->capture_default_str();
  c.app->add_flag("--json", o->json, "one JSON object");
  c.launch = Launch::Offline;
  c.run = [o](Runtime*) { return run_plan(*o); };
  return c;
}

}  // namespace shardtrain::cli
