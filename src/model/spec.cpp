// Builds the parameter registry and module tree of LlamaForCausalLM (see spec.hpp for the layout).
#include "shardtrain/model/spec.hpp"

#include <fmt/format.h>

#include <cmath>

#include "shardtrain/model/init.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

const char* module_class_name(ModuleClass c) {
  switch (c) {
    case ModuleClass::Embedding: return "Embedding";
    case ModuleClass::LlamaDecoderLayer: return "LlamaDecoderLayer";
    case ModuleClass::LlamaAttention: return "LlamaAttention";
    case ModuleClass::LlamaMLP: return "LlamaMLP";
    case ModuleClass::RMSNorm: return "RMSNorm";
    case ModuleClass::Linear: return "Linear";
  }
  return "?";
}

ModuleClass parse_module_class(std::string_view name) {
  for (ModuleClass c : {ModuleClass::Embedding, ModuleClass::LlamaDecoderLayer, ModuleClass::LlamaAttention,
                        ModuleClass::LlamaMLP, ModuleClass::RMSNorm, ModuleClass::Linear}) {
    if (name == module_class_name(c)) return c;
  }
  // transformers' own names of the same modules: its norm's class, and the attention classes of its releases before
  // 4.48 (one per kernel). A config written for LlamaForCausalLM names them; "not a Llama module class" dropped them.
  if (name == "LlamaRMSNorm") return ModuleClass::RMSNorm;
  if (name == "LlamaSdpaAttention" || name == "LlamaFlashAttention2") return ModuleClass::LlamaAttention;
  throw ConfigError(
      fmt::format("module class '{}' is not one of Embedding, LlamaDecoderLayer, LlamaAttention, "
                  "LlamaMLP, RMSNorm, Linear",
                  name));
}

int ModelSpec::add_module(std::string name, ModuleClass cls, int parent, int layer) {
  ModuleInfo m;
  m.index = static_cast<int>(modules_.size());
  m.name = std::move(name);
  m.cls = cls;
  m.parent = parent;
  m.layer = layer;
  modules_.push_back(std::move(m));
  if (parent >= 0) modules_[static_cast<size_t>(parent)].children.push_back(modules_.back().index);
  return modules_.back().index;
}

int ModelSpec::add_param(int module, std::string name, std::vector<int64_t> shape, InitKind init, double scale) {
  ParamInfo p;
  p.index = static_cast<int>(params_.size());
  p.stable_id = stable_param_id(name);
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= d;
  p.module = module;
  p.init = init;
  p.init_scale = scale;
  total_numel_ += p.numel;
  for (int m = module; m >= 0; m = modules_[static_cast<size_t>(m)].parent)
    modules_[static_cast<size_t>(m)].subtree_numel += p.numel;
  modules_[static_cast<size_t>(module)].params.push_back(p.index);
  modules_[static_cast<size_t>(module)].uses.push_back(p.index);
  params_.push_back(std::move(p));
  return params_.back().index;
}

ModelSpec::ModelSpec(const LlamaConfig& config) : config_(config) {
  config_.validate();
  const LlamaConfig& c = config_;
  const bool scaled = c.init_scheme == InitScheme::Scaled;
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
  // nn.Linear's reset_parameters: kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)).
  const auto linear = [&](int module, const std::string& name, int64_t out, int64_t in, bool residual_out) {
    if (scaled) return add_param(module, name, {out, in}, InitKind::Normal, residual_out ? residual_std : c.init_std);
    return add_param(module, name, {out, in}, InitKind::Uniform, 1.0 / std::sqrt(static_cast<double>(in)));
  };
  const auto linear_module = [&](int parent, int layer, const std::string& name, int64_t out, int64_t in,
                                 bool residual_out) {
    const int m = add_module(name, ModuleClass::Linear, parent, layer);
    return std::pair{m, linear(m, name + ".weight", out, in, residual_out)};
  };
  const auto norm_module = [&](int parent, int layer, const std::string& name) {
    const int m = add_module(name, ModuleClass::RMSNorm, parent, layer);
    return std::pair{m, add_param(m, name + ".weight", {c.hidden_size}, InitKind::Ones, 1.0)};
  };

  embed_module_ = add_module("model.embed_tokens", ModuleClass::Embedding, -1, -1);
  embed_param_ = add_param(embed_module_, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, InitKind::Normal,
                           scaled ? c.init_std : 1.0);
  const int64_t d = c.hidden_size, kv = c.kv_dim(), f = c.intermediate_size;
  for (int i = 0; i < static_cast<int>(c.num_hidden_layers); ++i) {
    const std::string base = fmt::format("model.layers.{}", i);
    LayerIndex li{};
    li.modules.layer = add_module(base, ModuleClass::LlamaDecoderLayer, -1, i);
    std::tie(li.modules.input_layernorm, li.params.input_layernorm) =
        norm_module(li.modules.layer, i, base + ".input_layernorm");
    li.modules.self_attn = add_module(base + ".self_attn", ModuleClass::LlamaAttention, li.modules.layer, i);
    const int a = li.modules.self_attn;
    std::tie(li.modules.q_proj, li.params.q_proj) = linear_module(a, i, base + ".self_attn.q_proj", d, d, false);
    std::tie(li.modules.k_proj, li.params.k_proj) = linear_module(a, i, base + ".self_attn.k_proj", kv, d, false);
    std::tie(li.modules.v_proj, li.params.v_proj) = linear_module(a, i, base + ".self_attn.v_proj", kv, d, false);
    std::tie(li.modules.o_proj, li.params.o_proj) = linear_module(a, i, base + ".self_attn.o_proj", d, d, true);
    std::tie(li.modules.post_attention_layernorm, li.params.post_attention_layernorm) =
        norm_module(li.modules.layer, i, base + ".post_attention_layernorm");
    li.modules.mlp = add_module(base + ".mlp", ModuleClass::LlamaMLP, li.modules.layer, i);
    const int m = li.modules.mlp;
    std::tie(li.modules.gate_proj, li.params.gate_proj) = linear_module(m, i, base + ".mlp.gate_proj", f, d, false);
    std::tie(li.modules.up_proj, li.params.up_proj) = linear_module(m, i, base + ".mlp.up_proj", f, d, false);
    std::tie(li.modules.down_proj, li.params.down_proj) = linear_module(m, i, base + ".mlp.down_proj", d, f, true);
    layers_.push_back(li);
  }
  std::tie(norm_module_, norm_param_) = norm_module(-1, -1, "model.norm");
  lm_head_module_ = add_module("lm_head", ModuleClass::Linear, -1, -1);
  if (c.tie_word_embeddings) {
    lm_head_param_ = embed_param_;
    modules_[static_cast<size_t>(lm_head_module_)].uses.push_back(embed_param_);
    // The shared matrix is the lm_head's too. Under reset_parameters PyTorch initializes it last, as the Linear
    // (U(+-1/sqrt(D))): the embedding's N(0, 1) made each token's logit about D for itself, a first loss of 63
    // for ln(V) = 6.2 at D = 64 and 249 at D = 256, trained from there without a word.
    if (!scaled) {
      ParamInfo& shared = params_[static_cast<size_t>(embed_param_)];
      shared.init = InitKind::Uniform;
      shared.init_scale = 1.0 / std::sqrt(static_cast<double>(d));
    }
  } else {
    lm_head_param_ = linear(lm_head_module_, "lm_head.weight", c.vocab_size, d, false);
  }
}

int ModelSpec::find_param(std::string_view name) const {
  for (const ParamInfo& p : params_)
    if (p.name == name) return p.index;
  return -1;
}

int ModelSpec::find_module(std::string_view name) const {
  for (const ModuleInfo& m : modules_)
    if (m.name == name) return m.index;
  return -1;
}

std::vector<int> ModelSpec::top_level_modules() const {
  std::vector<int> out;
  for (const ModuleInfo& m : modules_)
    if (m.parent < 0) out.push_back(m.index);
  return out;
}

}  // namespace shardtrain::model
