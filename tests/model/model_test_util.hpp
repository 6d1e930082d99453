// Helpers for model tests: tiny configs and host-side token batches.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/model/llama.hpp"

namespace shardtrain::model::test {

inline LlamaConfig tiny_config() {
  LlamaConfig c;
  c.vocab_size = 19;
  c.max_position_embeddings = 64;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.init_seed = 1234;
  return c;
}

// Host-owned (B, S) token ids, targets and optional document ids, viewed as a Batch.
struct HostBatch {
  int64_t b, s;
  std::vector<int32_t> ids, targets, docs;
  int32_t pad = -1;
  HostBatch(int64_t b, int64_t s) : b(b), s(s), ids(static_cast<size_t>(b * s)), targets(static_cast<size_t>(b * s)) {}
  Batch batch() {
    Batch out;
    out.input_ids = ops::make_tensor(ids.data(), DType::I32, {b, s});
    out.targets = ops::make_tensor(targets.data(), DType::I32, {b, s});
    if (!docs.empty()) out.document_ids = ops::make_tensor(docs.data(), DType::I32, {b, s});
    out.pad_token_id = pad;
    return out;
  }
};

// Deterministic pseudo-random tokens in [1, vocab): 0 stays free for padding.
inline HostBatch random_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  HostBatch hb(b, s);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<int32_t>(1 + x % static_cast<uint64_t>(vocab - 1));
  };
  for (auto& v : hb.ids) v = next();
  for (auto& v : hb.targets) v = next();
  return hb;
}

}  // namespace shardtrain::model::test
