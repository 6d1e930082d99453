// Wrap policies and flat layouts on the Llama module tree.
#include <gtest/gtest.h>

#include <numeric>

#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/runtime/error.hpp"
#include "small_model.hpp"

using namespace shardtrain;
using namespace shardtrain::fsdp;

namespace {
model::LlamaConfig config(bool tied) { return testing_fsdp::small_llama(tied); }

// Every parameter belongs to exactly one unit.
void expect_partition(const model::ModelSpec& spec, const std::vector<UnitSpec>& units) {
  std::vector<int> count(spec.params().size(), 0);
  for (const UnitSpec& u : units)
    for (int p : u.params) ++count[p];
  for (int c : count) EXPECT_EQ(c, 1);
}
}  // namespace

TEST(WrapPolicy, TransformerBasedWrapsEachDecoderLayer) {
  const model::ModelSpec spec(config(false));
  const auto units = plan_units(spec, {});
  ASSERT_EQ(units.size(), 5u);  // the base model, three layers and the root
  expect_partition(spec, units);
  // The seed's wrapping, ordered by first use: the base model (embedding and final norm) leads, then the layers, then
  // the root with lm_head alone, whose gather a prefetch can issue behind the last layer.
  EXPECT_EQ(units[0].name, "model");
  EXPECT_FALSE(units[0].is_root);
  EXPECT_EQ(units[0].params.size(), 2u);  // embed_tokens, norm
  EXPECT_EQ(units[0].first_use, spec.embed_module());
  EXPECT_LT(units[0].last_use, spec.lm_head_module());
  EXPECT_EQ(units[1].name, "model.layers.0");
  EXPECT_EQ(units[3].name, "model.layers.2");
  EXPECT_EQ(units[1].params.size(), 9u);
  EXPECT_TRUE(units[4].is_root);
  ASSERT_EQ(units[4].params.size(), 1u);
  EXPECT_EQ(spec.param(units[4].params[0]).name, "lm_head.weight");
}

TEST(WrapPolicy, NestedClassesAndTiedEmbeddings) {
  const model::ModelSpec spec(config(true));
  WrapConfig w;
  w.transformer_layer_cls = {model::ModuleClass::LlamaMLP, model::ModuleClass::Embedding};
  const auto units = plan_units(spec, w);
  expect_partition(spec, units);
  // embed_tokens, the base model (norms and attention, as FSDP2's fully_shard(model.model) takes what the nested
  // units leave), three MLPs, and the root (empty: the tied lm_head owns no parameter).
  ASSERT_EQ(units.size(), 6u);
  const UnitSpec& embed = units[0];
  EXPECT_EQ(embed.name, "model.embed_tokens");
  EXPECT_EQ(units[1].name, "model");
  EXPECT_TRUE(units.back().is_root);
  EXPECT_TRUE(units.back().params.empty());
  // The tied lm_head reads the embedding: its unit stays in use until the end of forward.
  EXPECT_EQ(embed.last_use, spec.lm_head_module());
  EXPECT_EQ(embed.first_use, spec.embed_module());
}

TEST(WrapPolicy, SizeBasedGroupsConsecutiveModules) {
  const model::ModelSpec spec(config(false));
  WrapConfig w;
  w.policy = WrapPolicy::SizeBased;
  w.min_num_params = 300;
  const auto units = plan_units(spec, w);
  expect_partition(spec, units);
  for (const UnitSpec& u : units) {
    if (u.is_root) continue;
    int64_t n = 0;
    for (int p : u.params) n += spec.param(p).numel;
    EXPECT_GE(n, 300) << u.name;
  }
  EXPECT_GT(units.size(), 4u);
}

TEST(WrapPolicy, NoWrapIsOneRootUnit) {
  const model::ModelSpec spec(config(false));
  WrapConfig w;
  w.policy = WrapPolicy::NoWrap;
  const auto units = plan_units(spec, w);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_TRUE(units[0].is_root);
  EXPECT_EQ(units[0].params.size(), spec.params().size());
}

TEST(WrapPolicy, Names) {
  EXPECT_EQ(parse_wrap_policy("TRANSFORMER_BASED_WRAP"), WrapPolicy::TransformerBased);
  EXPECT_EQ(parse_wrap_policy("size"), WrapPolicy::SizeBased);
  EXPECT_EQ(parse_wrap_policy("NO_WRAP"), WrapPolicy::NoWrap);
  EXPECT_THROW(parse_wrap_policy("LAYER_WRAP"), ConfigError);
}

TEST(FlatLayout, AlignedOffsetsPaddingAndRanges) {
  const model::ModelSpec spec(config(false));
  std::vector<int> params = {spec.embed_param(), spec.norm_param()};
  const FlatLayout l = make_flat_layout(spec, params, 4, 8);
  ASSERT_EQ(l.entries.size(), 2u);
  EXPECT_EQ(l.entries[0].offset, 0);
  EXPECT_EQ(l.entries[1].offset, 640);  // 53*12 = 636, aligned up to 8
  EXPECT_EQ(l.used, 652);
  EXPECT_EQ(l.padded_numel, 652);  // already a multiple of 4
  const FlatLayout l3 = make_flat_layout(spec, params, 3, 8);
  EXPECT_EQ(l3.padded_numel, 654);
  EXPECT_EQ(l3.shard_numel(), 218);
  // The second shard [218, 436) lies inside the embedding; the last one holds its tail and the norm.
  const auto mid = l3.ranges(218, 436);
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(mid[0].param_offset, 218);
  const auto last = l3.ranges(436, 654);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].end, 636);
  EXPECT_EQ(last[1].begin, 640);
  EXPECT_EQ(last[1].param_offset, 0);
}
