// LlamaConfig validation and init scheme names.
#include "shardtrain/model/config.hpp"

#include <fmt/format.h>

#include <cmath>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

const char* init_scheme_name(InitScheme s) { return s == InitScheme::ResetParameters ? "reset_parameters" : "scaled"; }

InitScheme parse_init_scheme(std::string_view name) {
  if (name == "reset_parameters") return InitScheme::ResetParameters;
  if (name == "scaled") return InitScheme::Scaled;
  throw ConfigError(fmt::format("model.init_scheme: '{}' is not one of reset_parameters, scaled", name));
}

ops::RopeFrequencies LlamaConfig::rope_frequencies() const {
  return {.theta = rope_theta,
          .scaling = rope_scaling,
          .factor = rope_factor,
          .low_freq_factor = rope_low_freq_factor,
          .high_freq_factor = rope_high_freq_factor,
          .original_max_position = static_cast<double>(rope_original_max_position_embeddings)};
}

void LlamaConfig::validate() const {
  const auto positive = [](const char* field, int64_t v) {
    if (v <= 0) throw ConfigError(fmt::format("model.{}: must be positive, got {}", field, v));
  };
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  if (vocab_size > (int64_t{1} << 31) - 1)
    throw ConfigError(fmt::format("model.vocab_size: {} does not fit the int32 token ids", vocab_size));
  if (hidden_size % num_attention_heads != 0)
    throw ConfigError(
        fmt::format("model.num_attention_heads: {} does not divide hidden_size {}", num_attention_heads, hidden_size));
  if (num_attention_heads % num_key_value_heads != 0)
    throw ConfigError(fmt::format("model.num_key_value_heads: {} does not divide num_attention_heads {}",
                                  num_key_value_heads, num_attention_heads));
  if (head_dim() % 2 != 0)
    throw ConfigError(
        fmt::format("model.num_attention_heads: head_dim = hidden_size / num_attention_heads = {} is odd; "
                    "rotary embeddings need an even head_dim",
                    head_dim()));
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    throw ConfigError(fmt::format("model.rms_norm_eps: must be a positive number, got {}", rms_norm_eps));
  if (!(rope_theta > 1) || !std::isfinite(rope_theta))
    throw ConfigError(fmt::format("model.rope_theta: must be a number above 1, got {}", rope_theta));
  if (rope_scaling != ops::RopeScaling::None && (!(rope_factor >= 1) || !std::isfinite(rope_factor)))
    throw ConfigError(fmt::format("model.rope_factor: the {} scaling needs a factor of 1 or more, got {}",
                                  ops::rope_scaling_name(rope_scaling), rope_factor));
  if (rope_scaling == ops::RopeScaling::Llama3) {
    if (!(rope_low_freq_factor > 0) || !(rope_high_freq_factor > rope_low_freq_factor) ||
        !std::isfinite(rope_high_freq_factor))
      throw ConfigError(
          fmt::format("model.rope_high_freq_factor: llama3 scaling needs 0 < rope_low_freq_factor < "
                      "rope_high_freq_factor, got {} and {}",
                      rope_low_freq_factor, rope_high_freq_factor));
    if (rope_original_max_position_embeddings <= 0)
      throw ConfigError(fmt::format("model.rope_original_max_position_embeddings: must be positive, got {}",
                                    rope_original_max_position_embeddings));
  }
  if (init_scheme == InitScheme::Scaled && (!(init_std > 0) || !std::isfinite(init_std)))
    throw ConfigError(fmt::format("model.init_std: must be positive, got {}", init_std));
}

}  // namespace shardtrain::model
