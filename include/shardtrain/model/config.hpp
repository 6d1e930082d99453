// The Llama architecture: the seed's LlamaConfig fields (Hugging Face names) plus norm epsilon, RoPE base,
// weight tying and how parameters are initialized. validate() is the one place sizes are checked.
#pragma once

#include <cstdint>
#include <string_view>

#include "shardtrain/ops/rope.hpp"

namespace shardtrain::model {

// ResetParameters: the seed's reset_parameters (nn.Linear uniform +-1/sqrt(fan_in), nn.Embedding N(0, 1),
// RMSNorm ones). Scaled: N(0, init_std) for linears and the embedding, with the residual-output projections
// (o_proj, down_proj) scaled by 1/sqrt(2 * num_hidden_layers) (GPT-2 style); RMSNorm ones.
enum class InitScheme { ResetParameters, Scaled };

const char* init_scheme_name(InitScheme s);
InitScheme parse_init_scheme(std::string_view name);  // "reset_parameters" | "scaled"; throws ConfigError

struct LlamaConfig {
  int64_t vocab_size = 50000;
  int64_t max_position_embeddings = 2048;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 4 * 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t num_key_value_heads = 3;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // RoPE frequency scaling: Hugging Face's rope_type and its parameters (ops/rope.hpp). None for the seed and
  // for pretraining from scratch; "llama3" is what Llama 3.1 and later checkpoints use.
  ops::RopeScaling rope_scaling = ops::RopeScaling::None;
  double rope_factor = 1.0;                              // linear, llama3
  double rope_low_freq_factor = 1.0;                     // llama3
  double rope_high_freq_factor = 4.0;                    // llama3
  int64_t rope_original_max_position_embeddings = 8192;  // llama3
  bool tie_word_embeddings = false;                      // a Hugging Face config field, kept under its name
  uint64_t init_seed = 0;
  InitScheme init_scheme = InitScheme::ResetParameters;
  double init_std = 0.02;  // InitScheme::Scaled only

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim(); }
  ops::RopeFrequencies rope_frequencies() const;
  // Throws ConfigError naming the field and what was expected.
  void validate() const;
};

}  // namespace shardtrain::model
