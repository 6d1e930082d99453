// The parameter registry and module tree: Hugging Face names, shapes, classes, order, validation.
#include <gtest/gtest.h>

#include <cmath>

#include "model_test_util.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model::test {
namespace {

TEST(ModelSpec, NamesShapesAndExecutionOrder) {
  LlamaConfig c = tiny_config();
  const ModelSpec spec(c);
  const std::vector<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
  };
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(spec.param(static_cast<int>(i)).name, expected[i]);
  EXPECT_EQ(spec.params().size(), 1u + 9u * 2u + 2u);
  EXPECT_EQ(spec.params()[spec.params().size() - 2].name, "model.norm.weight");
  EXPECT_EQ(spec.params().back().name, "lm_head.weight");
  const auto shape = [&](const char* n) { return spec.param(spec.find_param(n)).shape; };
  EXPECT_EQ(shape("model.embed_tokens.weight"), (std::vector<int64_t>{19, 16}));
  EXPECT_EQ(shape("model.layers.1.self_attn.q_proj.weight"), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(shape("model.layers.1.self_attn.k_proj.weight"), (std::vector<int64_t>{8, 16}));  // 2 kv heads x 4
  EXPECT_EQ(shape("model.layers.1.mlp.down_proj.weight"), (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(shape("model.norm.weight"), (std::vector<int64_t>{16}));
  const int64_t per_layer = 2 * 16 + 16 * 16 * 2 + 8 * 16 * 2 + 3 * 16 * 24;
  EXPECT_EQ(spec.num_params(), 19 * 16 * 2 + 16 + 2 * per_layer);
}

TEST(ModelSpec, ModuleTreeForWrapPolicies) {
  const ModelSpec spec(tiny_config());
  std::vector<std::string> top;
  for (int m : spec.top_level_modules()) top.push_back(spec.module(m).name);
  EXPECT_EQ(top,
            (std::vector<std::string>{"model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"}));
  const ModuleInfo& layer = spec.module(spec.find_module("model.layers.1"));
  EXPECT_EQ(layer.cls, ModuleClass::LlamaDecoderLayer);
  EXPECT_EQ(layer.layer, 1);
  ASSERT_EQ(layer.children.size(), 4u);
  EXPECT_EQ(spec.module(layer.children[0]).cls, ModuleClass::RMSNorm);
  EXPECT_EQ(spec.module(layer.children[1]).cls, ModuleClass::LlamaAttention);
  EXPECT_EQ(spec.module(layer.children[2]).name, "model.layers.1.post_attention_layernorm");
  EXPECT_EQ(spec.module(layer.children[3]).cls, ModuleClass::LlamaMLP);
  const ModuleInfo& attn = spec.module(layer.children[1]);
  ASSERT_EQ(attn.children.size(), 4u);
  EXPECT_EQ(spec.module(attn.children[3]).name, "model.layers.1.self_attn.o_proj");
  EXPECT_EQ(spec.module(attn.children[3]).cls, ModuleClass::Linear);
  EXPECT_TRUE(attn.params.empty());
  EXPECT_EQ(attn.subtree_numel, 16 * 16 * 2 + 8 * 16 * 2);
  EXPECT_EQ(layer.subtree_numel, 2 * 16 + 16 * 16 * 2 + 8 * 16 * 2 + 3 * 16 * 24);
  EXPECT_EQ(spec.module(spec.embed_module()).cls, ModuleClass::Embedding);
  EXPECT_EQ(spec.module(spec.lm_head_module()).uses, std::vector<int>{spec.lm_head_param()});
  EXPECT_EQ(parse_module_class("LlamaDecoderLayer"), ModuleClass::LlamaDecoderLayer);
  // transformers' class names of the same modules (a config for LlamaForCausalLM names them)
  EXPECT_EQ(parse_module_class("LlamaRMSNorm"), ModuleClass::RMSNorm);
  EXPECT_EQ(parse_module_class("LlamaSdpaAttention"), ModuleClass::LlamaAttention);
  EXPECT_EQ(parse_module_class("LlamaFlashAttention2"), ModuleClass::LlamaAttention);
  EXPECT_THROW(parse_module_class("Llama"), ConfigError);
}

TEST(ModelSpec, TiedEmbeddingsRegisterOnce) {
  LlamaConfig c = tiny_config();
  c.tie_word_embeddings = true;
  const ModelSpec spec(c);
  EXPECT_EQ(spec.find_param("lm_head.weight"), -1);
  EXPECT_EQ(spec.lm_head_param(), spec.embed_param());
  const ModuleInfo& head = spec.module(spec.lm_head_module());
  EXPECT_TRUE(head.params.empty());
  EXPECT_EQ(head.uses, std::vector<int>{spec.embed_param()});
  EXPECT_EQ(head.subtree_numel, 0);
  // reset_parameters: the shared matrix takes the lm_head's Linear init (PyTorch's last), not the embedding's N(0, 1).
  const ParamInfo& shared = spec.param(spec.embed_param());
  EXPECT_EQ(shared.init, InitKind::Uniform);
  EXPECT_DOUBLE_EQ(shared.init_scale, 1.0 / std::sqrt(static_cast<double>(c.hidden_size)));
  c.init_scheme = InitScheme::Scaled;
  EXPECT_EQ(ModelSpec(c).param(ModelSpec(c).embed_param()).init, InitKind::Normal);
}

TEST(ModelSpec, ValidationNamesTheField) {
  const auto expect_error = [](LlamaConfig c, const char* field) {
    try {
      c.validate();
      ADD_FAILURE() << "no error for " << field;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  LlamaConfig c = tiny_config();
  c.num_attention_heads = 5;  // does not divide 16
  expect_error(c, "num_attention_heads");
  c = tiny_config();
  c.num_key_value_heads = 3;  // does not divide 4
  expect_error(c, "num_key_value_heads");
  c = tiny_config();
  c.hidden_size = 12;
  c.num_attention_heads = 4;  // head_dim 3 is odd
  c.num_key_value_heads = 1;
  expect_error(c, "head_dim");
  c = tiny_config();
  c.vocab_size = 0;
  expect_error(c, "vocab_size");
  c = tiny_config();
  c.intermediate_size = -1;
  expect_error(c, "intermediate_size");
  c = tiny_config();
  c.rms_norm_eps = 0;
  expect_error(c, "rms_norm_eps");
  EXPECT_NO_THROW(tiny_config().validate());
  EXPECT_EQ(parse_init_scheme("scaled"), InitScheme::Scaled);
  EXPECT_THROW(parse_init_scheme("xavier"), ConfigError);
}

}  // namespace
}  // namespace shardtrain::model::test
