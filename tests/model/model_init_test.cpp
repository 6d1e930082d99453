// Counter-based init: slices equal the whole, values depend only on (seed, name, element), distributions.
#include <gtest/gtest.h>

#include <cmath>

#include "model_test_util.hpp"
#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/init.hpp"

namespace shardtrain::model::test {
namespace {

std::vector<float> init_range(const ParamInfo& p, uint64_t seed, int64_t first, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  init_param_slice(p, seed, first, ops::make_tensor(out.data(), DType::F32, {count}));
  return out;
}

TEST(ModelInit, SlicesEqualTheWholeForSeveralSlicings) {
  const ModelSpec spec(tiny_config());
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"}) {
    const ParamInfo& p = spec.param(spec.find_param(name));
    const std::vector<float> whole = init_range(p, 7, 0, p.numel);
    for (int64_t parts : {2, 3, 7, 64}) {
      std::vector<float> joined;
      for (int64_t r = 0; r < parts; ++r) {  // FSDP-style: rank r takes [r*N/parts, (r+1)*N/parts)
        const int64_t first = r * p.numel / parts, last = (r + 1) * p.numel / parts;
        const std::vector<float> slice = init_range(p, 7, first, last - first);
        joined.insert(joined.end(), slice.begin(), slice.end());
      }
      EXPECT_EQ(joined, whole) << name << " in " << parts << " slices";
    }
  }
}

TEST(ModelInit, IndependentOfModelShapeAndDenseLayout) {
  LlamaConfig small = tiny_config(), big = tiny_config();
  big.num_hidden_layers = 4;
  big.vocab_size = 40;  // changes the embedding shape, not layer 0's parameters
  const ModelSpec a(small), b(big);
  const ParamInfo& pa = a.param(a.find_param("model.layers.1.self_attn.q_proj.weight"));
  const ParamInfo& pb = b.param(b.find_param("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(init_range(pa, 3, 0, pa.numel), init_range(pb, 3, 0, pb.numel));
  DenseParams dense(a);
  dense.initialize(3);
  const ops::Tensor t = dense.param(pa.index);
  const std::vector<float> from_dense(t.as<float>(), t.as<float>() + pa.numel);
  EXPECT_EQ(from_dense, init_range(pa, 3, 0, pa.numel));
}

TEST(ModelInit, SeedsDifferAndParametersDiffer) {
  const ModelSpec spec(tiny_config());
  const ParamInfo& q = spec.param(spec.find_param("model.layers.0.self_attn.q_proj.weight"));
  const ParamInfo& k = spec.param(spec.find_param("model.layers.0.self_attn.k_proj.weight"));
  const auto a = init_range(q, 1, 0, 64), b = init_range(q, 2, 0, 64), c = init_range(k, 1, 0, 64);
  int same_seed = 0, same_param = 0;
  for (size_t i = 0; i < 64; ++i) {
    same_seed += a[i] == b[i];
    same_param += a[i] == c[i];
  }
  EXPECT_EQ(same_seed, 0);
  EXPECT_EQ(same_param, 0);
}

TEST(ModelInit, ResetParametersDistributions) {
  LlamaConfig c = tiny_config();
  c.vocab_size = 4000;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  const ModelSpec spec(c);
  // Embedding: N(0, 1)
  const ParamInfo& emb = spec.param(spec.embed_param());
  const auto e = init_range(emb, 5, 0, emb.numel);
  double mean = 0, sq = 0;
  for (float v : e) {
    mean += v;
    sq += static_cast<double>(v) * v;
  }
  mean /= static_cast<double>(e.size());
  const double sd = std::sqrt(sq / static_cast<double>(e.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 1.0, 0.01);
  // Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), here fan_in = 96 for down_proj
  const ParamInfo& down = spec.param(spec.find_param("model.layers.0.mlp.down_proj.weight"));
  const auto d = init_range(down, 5, 0, down.numel);
  const double bound = 1.0 / std::sqrt(96.0);
  double lo = 1, hi = -1, dsq = 0;
  for (float v : d) {
    lo = std::min(lo, static_cast<double>(v));
    hi = std::max(hi, static_cast<double>(v));
    dsq += static_cast<double>(v) * v;
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.95 * bound);
  EXPECT_GT(hi, 0.95 * bound);
  EXPECT_NEAR(std::sqrt(dsq / static_cast<double>(d.size())), bound / std::sqrt(3.0), 0.02 * bound);
  // RMSNorm: ones
  for (float v : init_range(spec.param(spec.norm_param()), 5, 0, 64)) EXPECT_EQ(v, 1.0f);
}

TEST(ModelInit, ScaledVariantShrinksResidualProjections) {
  LlamaConfig c = tiny_config();
  c.init_scheme = InitScheme::Scaled;
  c.init_std = 0.02;
  const ModelSpec spec(c);
  const ParamInfo& q = spec.param(spec.find_param("model.layers.0.self_attn.q_proj.weight"));
  const ParamInfo& o = spec.param(spec.find_param("model.layers.0.self_attn.o_proj.weight"));
  EXPECT_EQ(q.init, InitKind::Normal);
  EXPECT_DOUBLE_EQ(q.init_scale, 0.02);
  EXPECT_DOUBLE_EQ(o.init_scale, 0.02 / std::sqrt(4.0));  // 1 / sqrt(2 * layers)
  EXPECT_DOUBLE_EQ(spec.param(spec.embed_param()).init_scale, 0.02);
}

TEST(ModelInit, Bf16IsRoundedFromTheSameDraw) {
  const ModelSpec spec(tiny_config());
  const ParamInfo& p = spec.param(spec.find_param("model.layers.0.mlp.up_proj.weight"));
  std::vector<bf16> b(static_cast<size_t>(p.numel));
  init_param_slice(p, 9, 0, ops::make_tensor(b.data(), DType::BF16, {p.numel}));
  const auto f = init_range(p, 9, 0, p.numel);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i].bits, bf16(f[i]).bits);
}

}  // namespace
}  // namespace shardtrain::model::test
