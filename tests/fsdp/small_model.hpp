// The small Llama the FSDP unit tests lay out (odd sizes: 3 layers of hidden 12, 3 query heads over 1 KV head).
#pragma once

#include "shardtrain/model/config.hpp"

namespace shardtrain::testing_fsdp {

inline model::LlamaConfig small_llama(bool tied = false) {
  model::LlamaConfig c;
  c.vocab_size = 53;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.tie_word_embeddings = tied;
  return c;
}

}  // namespace shardtrain::testing_fsdp
