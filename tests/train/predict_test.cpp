// The step-time prediction (train/predict.hpp): the engine's own schedule in virtual time. Exact arithmetic on
// virtual clocks (no wall time, nothing a busy machine changes), so the values are asserted exactly or by order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "shardtrain/fsdp/units.hpp"
#include "shardtrain/model/binding.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/op_cost.hpp"
#include "shardtrain/runtime/timing_device.hpp"
#include "shardtrain/train/predict.hpp"

namespace shardtrain::train {
namespace {

// A 4-layer model at seq 256, one sequence per rank, bf16 compute, fp32 master.
TrainConfig small_config(ShardingStrategy strategy, int world) {
  TrainConfig c;
  c.model.vocab_size = 4096;
  c.model.max_position_embeddings = 256;
  c.model.hidden_size = 256;
  c.model.intermediate_size = 768;
  c.model.num_hidden_layers = 4;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.fsdp.engine.strategy = strategy;
  c.fsdp.engine.param_dtype = DType::BF16;
  c.data.seq_len = 256;
  c.data.micro_batch_size = 1;
  c.data.global_batch_size = world;
  return c;
}

ops::DeviceRates slow_gpu() {  // round rates: a 1 TFLOP/s GPU with 100 GB/s memory
  return {"test", 1e12, 1e11, 1e12, 1e12, 2e-6, 0, {}};
}

// Links slow enough that collectives matter next to this small model's compute.
GroupLinks slow_links(int ranks, int nodes) {
  return preset_group_links(LinkPreset{"test", 1e-6, 2e9, 2e-6, 1e9, 10e-6}, ranks, nodes);
}

Prediction predict(const TrainConfig& c, int nodes, int per_node, const ops::OpCostModel& costs,
                   DeviceKind device = DeviceKind::Cuda, bool gather_ahead = true, double update_bytes_per_s = 0,
                   std::function<void(fsdp::FsdpEngine&)> engine_setup = {}) {
  PredictSetup s;
  s.engine_setup = std::move(engine_setup);
  s.gather_ahead = gather_ahead;
  if (update_bytes_per_s > 0) s.host.memory_bytes_per_s = update_bytes_per_s;
  s.nodes = nodes;
  s.ranks_per_node = per_node;
  s.device = device;
  s.device_name = "NVIDIA H100 80GB HBM3";
  s.op_costs = &costs;
  s.links = [](MeshAxis, int ranks, int n) { return slow_links(ranks, n); };
  s.time_host_updates = false;  // nothing measured: every figure is virtual time
  return predict_step(c, s);
}

TEST(Predict, OneGpuStepIsItsComputeWithNoCommunication) {
  const ops::TableCostModel costs({}, slow_gpu());
  const Prediction p = predict(small_config(ShardingStrategy::FullShard, 1), 1, 1, costs);
  EXPECT_EQ(p.layout.world_size, 1);
  EXPECT_EQ(p.comm_busy_s, 0.0);
  EXPECT_EQ(p.exposed_comm_s, 0.0);
  EXPECT_GT(p.compute_busy_s, 0.0);
  // The compute stream runs back to back; the rest is the host's one synchronization a step.
  EXPECT_LE(p.compute_busy_s, p.step_s);
  EXPECT_GT(p.compute_busy_s, 0.95 * p.step_s);
  EXPECT_DOUBLE_EQ(p.tokens_per_s_per_rank, 256.0 / p.step_s);
  EXPECT_GT(p.mfu, 0.0);
  EXPECT_LE(p.mfu, 1.0);
  EXPECT_GT(p.peak_device_bytes, 0u);
}

// The compute stream's time by kind of work adds up to compute_busy_s, and counts each layer's GEMMs: q/k/v, o and
// gate/up forward, each of their dx and dW, and down_proj's (its forward adds the residual in the GEMM: matmul_add).
TEST(Predict, ComputeByWorkAddsUpToTheComputeStreamsBusyTime) {
  const ops::TableCostModel costs({}, slow_gpu());
  const Prediction p = predict(small_config(ShardingStrategy::FullShard, 1), 1, 1, costs);
  double sum = 0;
  std::map<std::string, double> calls;
  for (const WorkTotal& w : p.compute_by_work) {
    sum += w.seconds;
    calls[w.work] = w.calls;
  }
  EXPECT_NEAR(sum, p.compute_busy_s, 1e-12 * p.compute_busy_s);
  EXPECT_DOUBLE_EQ(calls["matmul"], 4 * 11);
  EXPECT_DOUBLE_EQ(calls["matmul_add"], 4);
  EXPECT_DOUBLE_EQ(calls["linear_cross_entropy"], 1);
  EXPECT_DOUBLE_EQ(calls["attention_forward"], 4);
  EXPECT_TRUE(std::is_sorted(p.compute_by_work.begin(), p.compute_by_work.end(),
                             [](const WorkTotal& a, const WorkTotal& b) { return a.seconds > b.seconds; }));
}

// A gradient buffer fresh for a unit's backward is zeroed only where backward adds into it: every element but the
// decoder projections' weights and the (untied) lm_head's, which their dW GEMMs write whole
// (model::GradWrite::Overwrite). The fills of a step (read from the tasks' work, "fill <elements>") cover exactly
// that: the embedding and the norms, the alignment gaps and the padding, and none of the 4 x 786,432 projection
// elements nor the lm_head's 4096 x 256.
TEST(Predict, BackwardZeroesOnlyTheGradientsItAddsInto) {
  const ops::TableCostModel costs({}, slow_gpu());
  const TrainConfig c = small_config(ShardingStrategy::FullShard, 2);
  const model::ModelSpec spec(c.model);
  int64_t expected = 0, projections = 0;
  const Prediction p = predict(c, 1, 2, costs, DeviceKind::Cuda, true, 0, [&](fsdp::FsdpEngine& e) {
    for (const fsdp::UnitSpec& u : e.units()) {
      const fsdp::FlatLayout l = fsdp::make_flat_layout(spec, u.params, 2);
      expected += l.padded_numel;
      for (const fsdp::FlatEntry& f : l.entries)
        if (model::gemm_writes_gradient(spec, f.param)) expected -= f.numel, projections += f.numel;
    }
  });
  int64_t zeroed = 0;
  for (const timing::Task& t : p.tasks)
    if (t.work.rfind("fill ", 0) == 0) zeroed += std::stoll(t.work.substr(5));
  // q 256, k and v 128, o 256 rows of 256; gate, up 768 x 256; down 256 x 768; the lm_head 4096 x 256
  EXPECT_EQ(projections, 4 * 786432 + 4096 * 256);
  EXPECT_EQ(zeroed, expected);
  EXPECT_GE(expected, 4096 * 256 + 9 * 256);  // the embedding, 9 norms
}

TEST(Predict, TheSameStepTwiceGivesTheSameTimes) {
  const ops::TableCostModel costs({}, slow_gpu());
  const TrainConfig c = small_config(ShardingStrategy::FullShard, 8);
  const Prediction a = predict(c, 1, 8, costs), b = predict(c, 1, 8, costs);
  EXPECT_EQ(a.step_s, b.step_s);
  EXPECT_EQ(a.exposed_comm_s, b.exposed_comm_s);
  EXPECT_EQ(a.peak_device_bytes, b.peak_device_bytes);
}

// The prediction is the engine's schedule, not a model of it: turning the engine's prefetch off exposes its
// all-gathers, as it would on a cluster.
TEST(Predict, PrefetchHidesAllGathersThatWithoutItAreExposed) {
  const ops::TableCostModel costs({}, slow_gpu());
  TrainConfig c = small_config(ShardingStrategy::FullShard, 8);
  const Prediction with = predict(c, 1, 8, costs);
  c.fsdp.engine.forward_prefetch = 0;
  c.fsdp.engine.backward_prefetch = 0;
  const Prediction without = predict(c, 1, 8, costs);
  auto gathers = [](const Prediction& p) {
    double s = 0;
    for (const IdleCause& i : p.idle)
      if (i.what.find("all_gather") != std::string::npos) s += i.seconds;
    return s;
  };
  EXPECT_GT(gathers(without), 2 * gathers(with));
  EXPECT_GT(without.step_s, with.step_s);
  EXPECT_NEAR(without.comm_busy_s, with.comm_busy_s, 1e-12);  // the same bytes, later
}

// The next step's first units gathered in the middle of the update (FsdpEngine::gather_ahead, as the trainer
// does it): the all-gathers the next forward starts with no longer wait for the whole update after it. The update
// here runs at 2 GB/s (28 bytes an element of this rank's shards: milliseconds), long enough to hide them.
TEST(Predict, GatheringTheFirstUnitsDuringTheUpdateHidesTheirAllGathers) {
  const ops::TableCostModel costs({}, slow_gpu());
  const TrainConfig c = small_config(ShardingStrategy::FullShard, 8);
  const Prediction ahead = predict(c, 1, 8, costs, DeviceKind::Cuda, true, 2e9),
                   after = predict(c, 1, 8, costs, DeviceKind::Cuda, false, 2e9);
  auto first_gathers = [](const Prediction& p) {  // the base model unit's and the first layer's
    double s = 0;
    for (const IdleCause& i : p.idle)
      if (i.what == "model all_gather shard" || i.what == "model.layers.0 all_gather shard") s += i.seconds;
    return s;
  };
  EXPECT_GT(first_gathers(after), 0.0);
  EXPECT_LT(first_gathers(ahead), 0.5 * first_gathers(after));
  EXPECT_LT(ahead.step_s, after.step_s);
  EXPECT_NEAR(ahead.comm_busy_s, after.comm_busy_s, 1e-12);  // the same collectives, earlier
  // The same work, but for the update's second launch (its kernel's least time, 3 us, at most).
  EXPECT_NEAR(ahead.compute_busy_s, after.compute_busy_s, 3.1e-6);
}

// The base model unit (embedding and final norm) spans the layers and does not count toward the backward depth,
// so the lm_head's backward prefetches the last layer too: its gather no longer waits for the norm's backward to
// begin and then for the lm_head's reduce-scatter on the link, as it does with the lm_head prefetching the base
// model alone (the schedule before, set explicitly).
TEST(Predict, TheLastLayersGatherIsPrefetchedAtTheLmHeadsBackward) {
  const ops::TableCostModel costs({}, slow_gpu());
  const TrainConfig c = small_config(ShardingStrategy::FullShard, 8);
  auto last_layer = [](const Prediction& p) {
    for (const IdleCause& i : p.idle)
      if (i.what == "model.layers.3 all_gather shard") return i.seconds;
    return 0.0;
  };
  std::vector<int> root_prefetch;
  const Prediction with = predict(c, 1, 8, costs, DeviceKind::Cuda, true, 0, [&](fsdp::FsdpEngine& e) {
    for (const fsdp::UnitSpec& u : e.units())
      if (u.is_root) root_prefetch = e.backward_prefetch(u.index);
  });
  ASSERT_EQ(root_prefetch.size(), 2u);  // the base model (unit 0) and the last layer (unit 4)
  EXPECT_EQ(root_prefetch[0], 0);
  EXPECT_EQ(root_prefetch[1], 4);
  const Prediction before = predict(c, 1, 8, costs, DeviceKind::Cuda, true, 0, [](fsdp::FsdpEngine& e) {
    for (const fsdp::UnitSpec& u : e.units())
      if (u.is_root) e.set_backward_prefetch(u.index, {0});
  });
  EXPECT_GT(last_layer(before), 0.0);
  EXPECT_LT(last_layer(with), 0.25 * last_layer(before));
  EXPECT_LT(with.step_s, before.step_s);
  EXPECT_EQ(with.peak_device_bytes, before.peak_device_bytes);  // within the gathered buffers' bound
}

TEST(Predict, HybridShardAllReducesOverReplicasAcrossNodes) {
  const ops::TableCostModel costs({}, slow_gpu());
  const Prediction full = predict(small_config(ShardingStrategy::FullShard, 8), 2, 4, costs);
  const Prediction hybrid = predict(small_config(ShardingStrategy::HybridShard, 8), 2, 4, costs);
  auto count = [](const Prediction& p, const std::string& what) {
    return std::count_if(p.tasks.begin(), p.tasks.end(),
                         [&](const timing::Task& t) { return t.label.find(what) != std::string::npos; });
  };
  EXPECT_EQ(count(full, "all_reduce replicate"), 0);
  EXPECT_GT(count(hybrid, "all_reduce replicate"), 0);
  EXPECT_EQ(hybrid.layout.shard_size, 4);
  EXPECT_EQ(hybrid.layout.replicate_size, 2);
  EXPECT_NE(full.links_described.find("infiniband"), std::string::npos);  // 8-way shard groups span both nodes
  // Sharding over 4 instead of 8 ranks holds more state per rank.
  EXPECT_GT(hybrid.peak_device_bytes, full.peak_device_bytes);
}

TEST(Predict, CheckpointingHoldsLessAndRecomputes) {
  const ops::TableCostModel costs({}, slow_gpu());
  TrainConfig c = small_config(ShardingStrategy::FullShard, 1);
  c.data.micro_batch_size = 8;
  c.data.global_batch_size = 8;
  const Prediction plain = predict(c, 1, 1, costs);
  c.fsdp.engine.activation_checkpointing = true;
  const Prediction ckpt = predict(c, 1, 1, costs);
  EXPECT_LT(ckpt.peak_device_bytes, plain.peak_device_bytes);
  EXPECT_GT(ckpt.compute_busy_s, plain.compute_busy_s);
}

TEST(Predict, CpuBackendBlocksInEveryCollective) {
  ops::DeviceRates cpu = slow_gpu();
  cpu.name = "cpu";
  const ops::TableCostModel costs({}, cpu);
  TrainConfig c = small_config(ShardingStrategy::FullShard, 2);
  c.fsdp.engine.param_dtype = DType::F32;
  const Prediction p = predict(c, 1, 2, costs, DeviceKind::Cpu);
  EXPECT_GT(p.comm_busy_s, 0.0);
  EXPECT_NEAR(p.exposed_comm_s, p.comm_busy_s, 1e-12);  // nothing overlaps a blocking collective
  EXPECT_NEAR(p.step_s, p.compute_busy_s + p.comm_busy_s, 1e-12 + 1e-9 * p.step_s);
  EXPECT_EQ(p.mfu, 0.0);  // no datasheet peak for a CPU
}

TEST(Predict, AConfigThatDoesNotFitTheMeshIsAConfigError) {
  const ops::TableCostModel costs({}, slow_gpu());
  TrainConfig c = small_config(ShardingStrategy::FullShard, 8);
  c.data.global_batch_size = 12;  // not a multiple of 8 ranks
  EXPECT_THROW(predict(c, 1, 8, costs), ConfigError);
}

}  // namespace
}  // namespace shardtrain::train
