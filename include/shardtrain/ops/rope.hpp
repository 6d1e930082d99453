// RoPE's frequencies, the same for every backend and for Hugging Face's LlamaRotaryEmbedding: for pair
// i < Dh/2, inv_freq[i] = theta^(-2i/Dh), formed in fp32 as transformers forms it, then optionally rescaled as
// its rope types "linear" (every frequency / factor) and "llama3" do. llama3 (Llama 3.1 and later) keeps the
// pairs whose wavelength 2 pi / inv_freq is below original_max_position / high_freq_factor, divides those
// above original_max_position / low_freq_factor by factor, and blends the band between:
//   s = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor),
//   inv_freq' = (1 - s) * inv_freq / factor + s * inv_freq.
// A token at position p rotates pair i by the angle p * inv_freq[i].
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace shardtrain::ops {

enum class RopeScaling { None, Linear, Llama3 };

const char* rope_scaling_name(RopeScaling s);           // "default", "linear", "llama3" (Hugging Face's rope_type)
RopeScaling parse_rope_scaling(std::string_view name);  // throws ConfigError naming the accepted names

struct RopeFrequencies {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::None;
  double factor = 1.0;                    // Linear, Llama3
  double low_freq_factor = 1.0;           // Llama3
  double high_freq_factor = 4.0;          // Llama3
  double original_max_position = 8192.0;  // Llama3: the original_max_position_embeddings of the pretraining
  bool operator==(const RopeFrequencies&) const = default;
};

// inv_freq[i] for i < head_dim / 2, in T: float as transformers (every step rounded to fp32), double for the CPU
// backend's f64 gradient checks. head_dim must be even and positive.
template <typename T>
std::vector<T> rope_inv_freq(const RopeFrequencies& f, int64_t head_dim);

}  // namespace shardtrain::ops
