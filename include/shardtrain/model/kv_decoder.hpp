// Token-by-token decoding with a key/value cache, for `shardtrain generate`: each new token costs one
// position of every layer, with attention over the cached keys and values of all earlier positions.
// Weights come through a ParamBinding of f32 host views (DenseParams); the cache lives in host memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardtrain/model/binding.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/ops.hpp"

namespace shardtrain::model {

class KvCacheDecoder {
 public:
  // max_len: the most positions this decoder will hold (at most max_position_embeddings).
  KvCacheDecoder(const ModelSpec& spec, const ParamBinding& params, ops::Ops& ops, int64_t max_len);

  // Feeds `token` at the next position; returns the logits (V) for the token after it, valid until the
  // next call. Throws DataError when the cache is full or the token is outside the vocabulary.
  std::span<const float> step(int32_t token);
  int64_t length() const { return length_; }
  int64_t capacity() const { return max_len_; }
  void reset() { length_ = 0; }

 private:
  ops::Tensor t(std::vector<float>& v, ops::Shape s) const;
  void attend(int layer);  // attn_ = softmax(q k^T / sqrt(Dh)) v over positions [0, length_]

  const ModelSpec* spec_;
  const ParamBinding* params_;
  ops::Ops* ops_;
  int64_t max_len_ = 0, length_ = 0;
  int64_t D_ = 0, H_ = 0, Hkv_ = 0, Dh_ = 0, F_ = 0, V_ = 0;
  std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: (max_len, Hkv, Dh), after RoPE
  std::vector<float> x_, h_, n_, rstd_, q_, k_, v_, attn_, o_, gate_up_, act_, down_, logits_, scores_;
  std::vector<int32_t> position_, token_;
};

}  // namespace shardtrain::model
