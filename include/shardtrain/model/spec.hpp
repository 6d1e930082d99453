// The parameter registry and module tree of LlamaForCausalLM, in execution order, with Hugging Face names.
// Wrap policies (fsdp) cut the module sequence into units from this; checkpoints store the names and shapes.
//
// Module sequence (pre-order = execution order of forward):
//   model.embed_tokens                     Embedding
//   model.layers.{i}                       LlamaDecoderLayer
//     model.layers.{i}.input_layernorm     RMSNorm
//     model.layers.{i}.self_attn           LlamaAttention
//       .q_proj .k_proj .v_proj .o_proj    Linear
//     model.layers.{i}.post_attention_layernorm  RMSNorm
//     model.layers.{i}.mlp                 LlamaMLP
//       .gate_proj .up_proj .down_proj     Linear
//   model.norm                             RMSNorm
//   lm_head                                Linear (owns no parameter when embeddings are tied)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/model/config.hpp"

namespace shardtrain::model {

enum class ModuleClass : uint8_t { Embedding, LlamaDecoderLayer, LlamaAttention, LlamaMLP, RMSNorm, Linear };
const char* module_class_name(ModuleClass c);           // the PyTorch class name: "LlamaDecoderLayer", ...
ModuleClass parse_module_class(std::string_view name);  // throws ConfigError listing the accepted names

enum class InitKind : uint8_t {
  Uniform,  // U(-scale, +scale)
  Normal,   // N(0, scale^2)
  Ones,
};

struct ParamInfo {
  int index = 0;
  std::string name;            // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // (out, in) for linears, (V, D) for the embedding, (D) for norms
  int64_t numel = 0;
  int module = 0;          // the module that owns it
  uint64_t stable_id = 0;  // hash of the name: keys the init RNG, independent of slicing and units
  InitKind init = InitKind::Ones;
  double init_scale = 0;
};

struct ModuleInfo {
  int index = 0;
  std::string name;  // "model.layers.3.mlp"
  ModuleClass cls = ModuleClass::Linear;
  int parent = -1;            // -1: a top-level module
  int layer = -1;             // decoder layer index, -1 outside the layers
  std::vector<int> children;  // in execution order
  std::vector<int> params;    // parameters this module owns directly
  std::vector<int> uses;      // parameters its forward reads (owned, plus the tied embedding for lm_head)
  int64_t subtree_numel = 0;  // elements owned by this module and its descendants
};

// Indices of one decoder layer's modules and parameters.
struct LayerIndex {
  struct Modules {
    int layer, input_layernorm, self_attn, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, mlp, gate_proj, up_proj,
        down_proj;
  } modules;
  struct Params {
    int input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj;
  } params;
};

class ModelSpec {
 public:
  explicit ModelSpec(const LlamaConfig& config);  // validates the config

  const LlamaConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<ModuleInfo>& modules() const { return modules_; }
  const ParamInfo& param(int i) const { return params_.at(static_cast<size_t>(i)); }
  const ModuleInfo& module(int i) const { return modules_.at(static_cast<size_t>(i)); }
  int find_param(std::string_view name) const;   // -1 when absent
  int find_module(std::string_view name) const;  // -1 when absent
  std::vector<int> top_level_modules() const;    // parent == -1, in execution order

  int64_t num_params() const { return total_numel_; }  // elements, tied weights counted once
  int64_t num_layers() const { return config_.num_hidden_layers; }
  const LayerIndex& layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
  int embed_module() const { return embed_module_; }
  int norm_module() const { return norm_module_; }
  int lm_head_module() const { return lm_head_module_; }
  int embed_param() const { return embed_param_; }
  int norm_param() const { return norm_param_; }
  int lm_head_param() const { return lm_head_param_; }  // == embed_param() when tied

 private:
  int add_module(std::string name, ModuleClass cls, int parent, int layer);
  int add_param(int module, std::string name, std::vector<int64_t> shape, InitKind init, double scale);

  LlamaConfig config_;
  std::vector<ParamInfo> params_;
  std::vector<ModuleInfo> modules_;
  std::vector<LayerIndex> layers_;
  int64_t total_numel_ = 0;
  int embed_module_ = -1, norm_module_ = -1, lm_head_module_ = -1;
  int embed_param_ = -1, norm_param_ = -1, lm_head_param_ = -1;
};

}  // namespace shardtrain::model
