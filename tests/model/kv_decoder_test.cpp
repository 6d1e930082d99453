// The key/value-cache decoder gives the logits of the full-sequence forward, position by position; and
// sampling honours greedy, top-k and top-p.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/kv_decoder.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/model/sampling.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;
using namespace shardtrain::model;

TEST(KvCacheDecoder, MatchesTheFullForwardAtEveryPosition) {
  for (bool tied : {false, true}) {
    LlamaConfig c;
    c.vocab_size = 57;
    c.max_position_embeddings = 32;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.rope_theta = 300;
    c.tie_word_embeddings = tied;
    c.init_scheme = InitScheme::Scaled;
    c.init_std = 0.2;
    auto ops = ops::make_cpu_ops({1});
    LlamaModel model(c, *ops);
    DenseParams params(model.spec());
    params.initialize(11);
    params.bind(model.binding());
    KvCacheDecoder decoder(model.spec(), model.binding(), *ops, 32);
    std::vector<int32_t> ids;
    std::vector<float> full(static_cast<size_t>(c.vocab_size));
    for (int i = 0; i < 12; ++i) {
      ids.push_back((i * 13 + 5) % 57);
      const auto step = decoder.step(ids.back());
      model.last_logits(ops::make_tensor(ids.data(), DType::I32, {1, static_cast<int64_t>(ids.size())}),
                        ops::make_tensor(full.data(), DType::F32, {1, c.vocab_size}));
      double worst = 0;
      for (size_t v = 0; v < full.size(); ++v) worst = std::max(worst, std::abs(static_cast<double>(step[v]) - full[v]));
      EXPECT_LT(worst, 2e-5) << "position " << i << " tied " << tied;
    }
    EXPECT_EQ(decoder.length(), 12);
    EXPECT_THROW(decoder.step(57), DataError);
  }
}

TEST(Sampling, GreedyTopKAndTopP) {
  const std::vector<float> logits = {0.0f, 3.0f, 2.9f, -1.0f, 1.0f};
  std::mt19937_64 rng(5);
  EXPECT_EQ(sample_token(logits, {0.0, 0, 1.0}, rng), 1);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, {1.0, 2, 1.0}, rng)];
  EXPECT_EQ(seen.size(), 2u);  // top-2: only tokens 1 and 2
  EXPECT_GT(seen[1], seen[2]);
  seen.clear();
  // top-p 0.5: token 1 alone holds about 47% of the mass, tokens 1 and 2 together about 91%.
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, {1.0, 0, 0.5}, rng)];
  EXPECT_EQ(seen.size(), 2u);
  seen.clear();
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, {1.0, 0, 1.0}, rng)];
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_THROW(validate({-1.0, 0, 1.0}), UsageError);
  EXPECT_THROW(validate({1.0, 0, 0.0}), UsageError);
}
