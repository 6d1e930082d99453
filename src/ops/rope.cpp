// RoPE's frequencies (rope.hpp): one host computation that the CPU backend uses directly and the CUDA backend
// passes to its kernel, so the two rotate by the same angles.
#include "shardtrain/ops/rope.hpp"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::None: return "default";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
  }
  return "?";
}

RopeScaling parse_rope_scaling(std::string_view name) {
  for (RopeScaling s : {RopeScaling::None, RopeScaling::Linear, RopeScaling::Llama3})
    if (name == rope_scaling_name(s)) return s;
  throw ConfigError(fmt::format("rope scaling '{}': expected default, linear or llama3 (Hugging Face's rope_type)", name));
}

template <typename T>
std::vector<T> rope_inv_freq(const RopeFrequencies& f, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    throw InternalError(fmt::format("rope_inv_freq: head_dim {} is not even", head_dim));
  const int64_t half = head_dim / 2;
  std::vector<T> inv(static_cast<size_t>(half));
  const T theta = static_cast<T>(f.theta), factor = static_cast<T>(f.factor);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), each operation in fp32.
    T v = T(1) / std::pow(theta, static_cast<T>(2 * i) / static_cast<T>(head_dim));
    if (f.scaling == RopeScaling::Linear) v = v / factor;
    if (f.scaling == RopeScaling::Llama3) {
      // The same operations in the same order as transformers' _compute_llama3_parameters, on fp32 values.
      const T old_len = static_cast<T>(f.original_max_position), low = static_cast<T>(f.low_freq_factor);
      const T low_wavelen = static_cast<T>(f.original_max_position / f.low_freq_factor);
      const T high_wavelen = static_cast<T>(f.original_max_position / f.high_freq_factor);
      const T wavelen = static_cast<T>(2 * std::numbers::pi) / v;
      const T scaled = wavelen > low_wavelen ? v / factor : v;
      const T smooth = (old_len / wavelen - low) / static_cast<T>(f.high_freq_factor - f.low_freq_factor);
      const T smoothed = (T(1) - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      v = medium ? smoothed : scaled;
    }
    inv[static_cast<size_t>(i)] = v;
  }
  return inv;
}

template std::vector<float> rope_inv_freq<float>(const RopeFrequencies&, int64_t);
template std::vector<double> rope_inv_freq<double>(const RopeFrequencies&, int64_t);

}  // namespace shardtrain::ops
