// One position at a time through the Llama stack, with the ops of the training path for every
// projection, norm, RoPE and SwiGLU, and a host loop for attention over the cache.
#include "shardtrain/model/kv_decoder.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {

using ops::Tensor;
using ops::Transpose;

KvCacheDecoder::KvCacheDecoder(const ModelSpec& spec, const ParamBinding& params, ops::Ops& ops, int64_t max_len)
    : spec_(&spec), params_(&params), ops_(&ops) {
  const LlamaConfig& c = spec.config();
  max_len_ = std::min(max_len, c.max_position_embeddings);
  D_ = c.hidden_size, H_ = c.num_attention_heads, Hkv_ = c.num_key_value_heads, Dh_ = c.head_dim();
  F_ = c.intermediate_size, V_ = c.vocab_size;
  const auto layers = static_cast<size_t>(c.num_hidden_layers);
  k_cache_.assign(layers, std::vector<float>(static_cast<size_t>(max_len_ * Hkv_ * Dh_)));
  v_cache_.assign(layers, std::vector<float>(static_cast<size_t>(max_len_ * Hkv_ * Dh_)));
  x_.resize(D_), h_.resize(D_), n_.resize(D_), rstd_.resize(1), q_.resize(H_ * Dh_), k_.resize(Hkv_ * Dh_);
  v_.resize(Hkv_ * Dh_), attn_.resize(H_ * Dh_), o_.resize(D_), gate_up_.resize(2 * F_), act_.resize(F_);
  down_.resize(D_), logits_.resize(V_), scores_.resize(max_len_);
  position_.resize(1), token_.resize(1);
}

Tensor KvCacheDecoder::t(std::vector<float>& v, ops::Shape s) const { return ops::make_tensor(v.data(), DType::F32, s); }

void KvCacheDecoder::attend(int layer) {
  const int64_t T = length_ + 1, group = H_ / Hkv_;
  const float* kc = k_cache_[static_cast<size_t>(layer)].data();
  const float* vc = v_cache_[static_cast<size_t>(layer)].data();
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh_));
  for (int64_t h = 0; h < H_; ++h) {
    const int64_t g = h / group;  // query head h reads key/value head h / (H / Hkv)
    const float* q = q_.data() + h * Dh_;
    double max_score = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
      const float* k = kc + (j * Hkv_ + g) * Dh_;
      double s = 0;
      for (int64_t d = 0; d < Dh_; ++d) s += static_cast<double>(q[d]) * k[d];
      scores_[static_cast<size_t>(j)] = static_cast<float>(s * scale);
      max_score = std::max(max_score, s * scale);
    }
    double sum = 0;
    for (int64_t j = 0; j < T; ++j) sum += std::exp(scores_[static_cast<size_t>(j)] - max_score);
    float* out = attn_.data() + h * Dh_;
    std::fill(out, out + Dh_, 0.0f);
    for (int64_t j = 0; j < T; ++j) {
      const auto p = static_cast<float>(std::exp(scores_[static_cast<size_t>(j)] - max_score) / sum);
      const float* v = vc + (j * Hkv_ + g) * Dh_;
      for (int64_t d = 0; d < Dh_; ++d) out[d] += p * v[d];
    }
  }
}

std::span<const float> KvCacheDecoder::step(int32_t token) {
  if (length_ >= max_len_) throw DataError(fmt::format("the key/value cache is full ({} positions)", max_len_));
  if (token < 0 || token >= V_) throw DataError(fmt::format("token {} is outside the vocabulary [0, {})", token, V_));
  const LlamaConfig& c = spec_->config();
  const ParamBinding& p = *params_;
  ops::Ops& ops = *ops_;
  const double eps = c.rms_norm_eps;
  token_[0] = token;
  position_[0] = static_cast<int32_t>(length_);
  const Tensor pos = ops::make_tensor(position_.data(), DType::I32, {1});
  ops.embedding_forward(ops::make_tensor(token_.data(), DType::I32, {1}), p.param(spec_->embed_param()), t(x_, {1, D_}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerIndex::Params& w = spec_->layer(l).params;
    ops.rmsnorm_forward(t(x_, {1, D_}), Tensor{}, p.param(w.input_layernorm), eps, Tensor{}, t(n_, {1, D_}), t(rstd_, {1}));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(w.q_proj), 0.0, t(q_, {1, H_ * Dh_}));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(w.k_proj), 0.0, t(k_, {1, Hkv_ * Dh_}));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(w.v_proj), 0.0, t(v_, {1, Hkv_ * Dh_}));
    ops.rope(t(q_, {1, H_, Dh_}), pos, c.rope_frequencies(), ops::RopeDirection::Forward);
    ops.rope(t(k_, {1, Hkv_, Dh_}), pos, c.rope_frequencies(), ops::RopeDirection::Forward);
    const auto li = static_cast<size_t>(l);
    std::copy(k_.begin(), k_.end(), k_cache_[li].begin() + length_ * Hkv_ * Dh_);
    std::copy(v_.begin(), v_.end(), v_cache_[li].begin() + length_ * Hkv_ * Dh_);
    attend(static_cast<int>(l));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(attn_, {1, H_ * Dh_}), p.param(w.o_proj), 0.0, t(o_, {1, D_}));
    // h = x + attention output; n = RMSNorm(h) (the residual add fused, as in training)
    ops.rmsnorm_forward(t(o_, {1, D_}), t(x_, {1, D_}), p.param(w.post_attention_layernorm), eps, t(h_, {1, D_}),
                        t(n_, {1, D_}), t(rstd_, {1}));
    // gate then up: for one token the (2, 1, F) halves and the (1, 2F) row are the same memory
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(w.gate_proj), 0.0, t(gate_up_, {1, F_}));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(w.up_proj), 0.0,
               ops::make_tensor(gate_up_.data() + F_, DType::F32, {1, F_}));
    ops.swiglu_forward(t(gate_up_, {2, 1, F_}), ops::GateUpLayout::Halves, t(act_, {1, F_}));
    ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(act_, {1, F_}), p.param(w.down_proj), 0.0, t(down_, {1, D_}));
    for (int64_t d = 0; d < D_; ++d) x_[static_cast<size_t>(d)] = h_[static_cast<size_t>(d)] + down_[static_cast<size_t>(d)];
  }
  ops.rmsnorm_forward(t(x_, {1, D_}), Tensor{}, p.param(spec_->norm_param()), eps, Tensor{}, t(n_, {1, D_}), t(rstd_, {1}));
  ops.matmul(Transpose::No, Transpose::Yes, 1.0, t(n_, {1, D_}), p.param(spec_->lm_head_param()), 0.0, t(logits_, {1, V_}));
  ++length_;
  return logits_;
}

}  // namespace shardtrain::model
