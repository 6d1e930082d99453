// The model architecture as JSON inside checkpoints (our field names: those of LlamaConfig).
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::checkpoint {

std::string model_config_to_json(const model::LlamaConfig& c) {
  return nlohmann::json{{"vocab_size", c.vocab_size},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_attention_heads", c.num_attention_heads},
                        {"num_key_value_heads", c.num_key_value_heads},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"rope_theta", c.rope_theta},
                        {"rope_scaling", ops::rope_scaling_name(c.rope_scaling)},
                        {"rope_factor", c.rope_factor},
                        {"rope_low_freq_factor", c.rope_low_freq_factor},
                        {"rope_high_freq_factor", c.rope_high_freq_factor},
                        {"rope_original_max_position_embeddings", c.rope_original_max_position_embeddings},
                        {"tie_word_embeddings", c.tie_word_embeddings},
                        {"init_seed", c.init_seed},
                        {"init_scheme", model::init_scheme_name(c.init_scheme)},
                        {"init_std", c.init_std}}
      .dump();
}

model::LlamaConfig model_config_from_json(const std::string& text, const std::string& origin) {
  model::LlamaConfig c;
  try {
    const auto j = nlohmann::json::parse(text);
    c.vocab_size = j.at("vocab_size");
    c.max_position_embeddings = j.at("max_position_embeddings");
    c.hidden_size = j.at("hidden_size");
    c.intermediate_size = j.at("intermediate_size");
    c.num_hidden_layers = j.at("num_hidden_layers");
    c.num_attention_heads = j.at("num_attention_heads");
    c.num_key_value_heads = j.at("num_key_value_heads");
    c.rms_norm_eps = j.at("rms_norm_eps");
    c.rope_theta = j.at("rope_theta");
    // Checkpoints written before RoPE scaling existed hold none of these: plain RoPE.
    c.rope_scaling = ops::parse_rope_scaling(j.value("rope_scaling", std::string("default")));
    c.rope_factor = j.value("rope_factor", c.rope_factor);
    c.rope_low_freq_factor = j.value("rope_low_freq_factor", c.rope_low_freq_factor);
    c.rope_high_freq_factor = j.value("rope_high_freq_factor", c.rope_high_freq_factor);
    c.rope_original_max_position_embeddings =
        j.value("rope_original_max_position_embeddings", c.rope_original_max_position_embeddings);
    c.tie_word_embeddings = j.at("tie_word_embeddings");
    c.init_seed = j.value("init_seed", uint64_t{0});
    c.init_scheme = model::parse_init_scheme(j.value("init_scheme", std::string("reset_parameters")));
    c.init_std = j.value("init_std", 0.02);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: model_config: {}", origin, e.what()));
  } catch (const ConfigError& e) {
    throw CheckpointError(fmt::format("{}: model_config: {}", origin, e.what()));
  }
  return c;
}

namespace {

std::string describe_rope(const model::LlamaConfig& c) {
  switch (c.rope_scaling) {
    case ops::RopeScaling::None: return fmt::format("rope_theta {}", c.rope_theta);
    case ops::RopeScaling::Linear: return fmt::format("rope_theta {}, linear scaling by {}", c.rope_theta, c.rope_factor);
    case ops::RopeScaling::Llama3:
      return fmt::format(
          "rope_theta {}, llama3 scaling (factor {}, low_freq_factor {}, high_freq_factor {}, "
          "original_max_position_embeddings {})",
          c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
          c.rope_original_max_position_embeddings);
  }
  return "?";
}

}  // namespace

void check_same_model(const model::LlamaConfig& s, const model::LlamaConfig& c, const std::string& origin) {
  auto differ = [&](const char* field, auto a, auto b) {
    if (a != b) {
      throw CheckpointError(
          fmt::format("{}: the checkpoint's model has {} = {}, the configured model {} (model.{} must match "
                      "to load it)",
                      origin, field, a, b, field));
    }
  };
  differ("vocab_size", s.vocab_size, c.vocab_size);
  differ("hidden_size", s.hidden_size, c.hidden_size);
  differ("intermediate_size", s.intermediate_size, c.intermediate_size);
  differ("num_hidden_layers", s.num_hidden_layers, c.num_hidden_layers);
  differ("num_attention_heads", s.num_attention_heads, c.num_attention_heads);
  differ("num_key_value_heads", s.num_key_value_heads, c.num_key_value_heads);
  differ("tie_word_embeddings", s.tie_word_embeddings, c.tie_word_embeddings);
  // What changes the function but not the shapes may be meant (a longer context's RoPE base, say): the
  // configured values are used, and said once, on rank 0.
  std::vector<std::string> notes;
  if (s.rms_norm_eps != c.rms_norm_eps)
    notes.push_back(fmt::format("rms_norm_eps {} (configured: {})", s.rms_norm_eps, c.rms_norm_eps));
  if (s.rope_frequencies() != c.rope_frequencies())
    notes.push_back(fmt::format("{} (configured: {})", describe_rope(s), describe_rope(c)));
  if (!notes.empty() && log::config().rank == 0)
    log::warn(
        "{}: the checkpoint's model has {}; the configured values are used (set model.* to the checkpoint's to keep "
        "them)",
        origin, fmt::join(notes, "; "));
}

}  // namespace shardtrain::checkpoint
