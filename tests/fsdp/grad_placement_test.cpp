// Where gradient shards go in activation memory (fsdp/grad_placement.hpp): the highest aligned fit in the freed
// spans minus the taken ones, freed spans by layer as backward finishes them, the stage's capacity, and the
// activation plan's freed spans (each layer's saved tensors and the layers' inputs and outputs, inside the arena).
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "shardtrain/fsdp/grad_placement.hpp"
#include "shardtrain/model/activation_plan.hpp"
#include "shardtrain/model/spec.hpp"
#include "small_model.hpp"

using namespace shardtrain;
using namespace shardtrain::fsdp;

TEST(GradPlacement, HighestFitSkipsTakenSpansAndAligns) {
  // One free span [0, 4096): the highest 1000 bytes at 256-alignment start at 3072 (4096 - 1000 = 3096, down to 3072).
  EXPECT_EQ(highest_fit({{0, 4096}}, {}, 1000, 256), std::optional<size_t>(3072));
  // Taken [3072, 4096): the next fit below it (3072 - 1000 = 2072, down to 2048).
  EXPECT_EQ(highest_fit({{0, 4096}}, {{3072, 4096}}, 1000, 256), std::optional<size_t>(2048));
  // Adjacent free spans form one: 3000 bytes fit across the boundary of [0, 2048) and [2048, 4096).
  EXPECT_EQ(highest_fit({{2048, 4096}, {0, 2048}}, {}, 3000, 256), std::optional<size_t>(1024));
  // A gap between free spans does not: [0, 1024) and [2048, 3072) hold 1024 each, never 2000.
  EXPECT_EQ(highest_fit({{0, 1024}, {2048, 3072}}, {}, 2000, 256), std::nullopt);
  // Aligning down past a gap's start: [100, 1200) holds 1000 bytes only at 200, which 256-alignment cannot give.
  EXPECT_EQ(highest_fit({{100, 1200}}, {}, 1000, 256), std::nullopt);
  EXPECT_EQ(highest_fit({{100, 1300}}, {}, 1000, 256), std::optional<size_t>(256));
  EXPECT_EQ(highest_fit({{0, 4096}}, {}, 0, 256), std::nullopt);  // nothing to place
}

TEST(GradPlacement, PlacesOnlyInLayersBackwardHasFinished) {
  // Three layers' spans, adjacent in layer order, 1000 bytes each.
  const std::vector<model::FreedInBackward> freed = {{0, 0, 1000}, {1, 1000, 1000}, {2, 2000, 1000}};
  GradPlacer p;
  p.begin_pass(freed);
  EXPECT_EQ(p.place(256), std::nullopt);  // no layer done yet
  p.layer_done(2);
  EXPECT_EQ(p.place(600), std::optional<size_t>(2304));  // the top of layer 2's span
  EXPECT_EQ(p.place(600), std::nullopt);                  // 400 bytes left below it
  p.layer_done(1);
  EXPECT_EQ(p.place(600), std::optional<size_t>(1536));  // across layers 1 and 2, below the first
  p.layer_done(0);
  EXPECT_EQ(p.place(1500), std::optional<size_t>(0));
  EXPECT_EQ(p.place(256), std::nullopt);  // 36 bytes left
  p.begin_pass(freed);                    // a new pass: nothing done, nothing taken
  EXPECT_EQ(p.place(256), std::nullopt);
  p.layer_done(0);
  EXPECT_EQ(p.place(600), std::optional<size_t>(256));
}

TEST(GradPlacement, TheStageHoldsEveryNormWeightAndNoMore) {
  const model::LlamaConfig c = testing_fsdp::small_llama();
  const model::ModelSpec spec(c);
  // 2 norms a layer and the final one, 12 floats (48 bytes) each, rounded up to 256.
  EXPECT_EQ(GradPlacer::stage_capacity(spec), (2 * 3 + 1) * 256u);
  GradPlacer p(GradPlacer::stage_capacity(spec));
  EXPECT_EQ(p.stage(48), std::optional<size_t>(0));
  EXPECT_EQ(p.stage(300), std::optional<size_t>(256));  // rounded to 512
  EXPECT_EQ(p.stage_used(), 768u);
  EXPECT_EQ(p.stage(1024), std::optional<size_t>(768));  // 1792 - 768 = 1024 left: exactly full
  EXPECT_EQ(p.stage(1), std::nullopt);
}

TEST(GradPlacement, TheActivationPlanFreesEachLayerInsideItsArena) {
  const model::LlamaConfig c = testing_fsdp::small_llama();
  for (model::Checkpointing ck : {model::Checkpointing::None, model::Checkpointing::PerLayer}) {
    const model::ActivationPlan plan(c, 2, 9, DType::F32, ck);
    const auto& freed = plan.freed_in_backward();
    // hidden[0..3] (4 spans) and, without checkpointing, one span per layer; with it, the one recomputed set.
    ASSERT_EQ(freed.size(), ck == model::Checkpointing::None ? 4u + 3u : 4u + 1u);
    for (const model::FreedInBackward& f : freed) {
      EXPECT_GE(f.layer, 0);
      EXPECT_LT(f.layer, 3);
      EXPECT_GT(f.bytes, 0u);
      EXPECT_LE(f.offset + f.bytes, plan.bytes());
      EXPECT_EQ(f.offset % model::ActivationPlan::kAlignment, 0u);
    }
    // No two spans overlap.
    std::vector<model::FreedInBackward> sorted = freed;
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    for (size_t i = 1; i < sorted.size(); ++i) EXPECT_LE(sorted[i - 1].offset + sorted[i - 1].bytes, sorted[i].offset);
    if (ck == model::Checkpointing::PerLayer) {
      EXPECT_EQ(freed.back().layer, 0);  // the recomputed set: free only once layer 0 is done
    }
  }
}

// What waits on the stage when a unit's backward reaches a module before its shard has a place: an RMSNorm's
// parameters not on the stage yet, while there is room; a projection's never (its group's gradients stay adjacent).
TEST(GradPlacement, OnlyANormsGradientsWaitOnTheStage) {
  const model::ModelSpec spec(testing_fsdp::small_llama());
  const std::vector<UnitSpec> units = plan_units(spec, WrapConfig{});
  const UnitSpec& base = units.front();  // the embedding and the final norm
  ASSERT_EQ(base.params.size(), 2u);
  const FlatLayout layout = make_flat_layout(spec, base.params, 1);
  GradPlacer p(GradPlacer::stage_capacity(spec));
  const model::ModuleInfo& norm = spec.module(spec.norm_module());
  const auto request = p.stage_request(layout, norm, {});
  ASSERT_TRUE(request.has_value());
  ASSERT_EQ(request->size(), 1u);
  EXPECT_EQ((*request)[0]->param, spec.norm_param());
  const auto again = p.stage_request(layout, norm, {spec.norm_param()});  // already on the stage: nothing more
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->empty());
  EXPECT_FALSE(p.stage_request(layout, spec.module(spec.embed_module()), {}).has_value());  // not a norm
  GradPlacer full(0);  // no room
  EXPECT_FALSE(full.stage_request(layout, norm, {}).has_value());
}
