// Traffic and memory accounting against the formulas of docs/fsdp.md: per step, a non-root unit of N
// padded elements costs FULL_SHARD two all-gathers of N*b_p and a reduce-scatter of N*b_r, SHARD_GRAD_OP
// one all-gather, NO_SHARD an all-reduce of N*b_r, hybrid meshes an extra all-reduce of N/S*b_r over
// the replicate axis; the root unit is gathered once. Sharded bytes are N/S*4 per unit; the unshard
// pool never holds more than (1 + prefetch) non-root units plus the root.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>

#include "harness.hpp"
#include "shardtrain/fsdp/plan.hpp"

using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {

struct Expected {
  uint64_t gather = 0, reduce_scatter = 0, replicate_all_reduce = 0;
};

Expected expected_traffic(const RunResult& r, const MeshLayout& m, bool reshard_after_forward, size_t bp, size_t br,
                          int micro_batches) {
  Expected e;
  const int S = m.shard_size, R = m.replicate_size;
  for (size_t u = 0; u < r.layouts.size(); ++u) {
    const uint64_t N = static_cast<uint64_t>(r.layouts[u].padded_numel);
    if (r.layouts[u].entries.empty()) continue;
    const int gathers = r.unit_is_root[u] || !reshard_after_forward ? 1 : 2;
    if (S > 1) {
      e.gather += static_cast<uint64_t>(micro_batches) * gathers * N * bp;
      e.reduce_scatter += static_cast<uint64_t>(micro_batches) * N * br;
    }
    if (R > 1) e.replicate_all_reduce += static_cast<uint64_t>(micro_batches) * (N / S) * br;
  }
  return e;
}

// On a GPU whose step reduces gradients the engine also keeps one double per unit for the gradient norm
// (device_grad_sq_sums), which the plan leaves out: a few hundred bytes.
int64_t unit_sum_bytes(const RunResult& r, const fsdp::FsdpConfig& c, const fsdp::FsdpPlan& plan) {
  const bool reduces = !fsdp::grads_live_in_shards(c, plan.mesh.shard_size, plan.mesh.replicate_size);
  return test_on_gpu() && reduces ? static_cast<int64_t>(r.layouts.size() * sizeof(double)) : 0;
}

}  // namespace

TEST(FsdpAccounting, TrafficPerStepMatchesTheFormulas) {
  const int rpn = ranks_per_node_from_env();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int s = 1; s <= 5; ++s) {
    for (DType dt : {DType::F32, DType::BF16}) {
      RunOptions o;
      o.steps = 1;
      o.fsdp.strategy = static_cast<ShardingStrategy>(s);
      o.fsdp.param_dtype = dt;
      o.fsdp.reduce_dtype = dt;
      const RunResult r = run_training(MPI_COMM_WORLD, rpn, o);
      const MeshLayout m = make_mesh_layout({o.fsdp.strategy, 0}, world, rpn > 0 ? rpn : world);
      const Expected e =
          expected_traffic(r, m, o.fsdp.reshards_after_forward(), dtype_size(dt), dtype_size(dt), o.micro_batches);
      SCOPED_TRACE(fmt::format("{} {}", sharding_strategy_name(o.fsdp.strategy), dtype_name(dt)));
      EXPECT_EQ(r.shard_gather_bytes, e.gather);
      EXPECT_EQ(r.shard_reduce_scatter_bytes, e.reduce_scatter);
      EXPECT_EQ(r.replicate_all_reduce_bytes, e.replicate_all_reduce);
      if (m.shard_size > 1) {
        EXPECT_GT(e.gather, 0u);
      }
      if (m.replicate_size > 1) {
        EXPECT_GT(e.replicate_all_reduce, 0u);
      }
    }
  }
}

TEST(FsdpAccounting, NoSyncReducesOncePerStep) {
  const int rpn = ranks_per_node_from_env();
  RunOptions o;
  o.steps = 1;
  o.micro_batches = 2;
  o.fsdp.accumulation = fsdp::GradAccumulation::NoSync;
  const RunResult lean_run = [&] {
    RunOptions l = o;
    l.fsdp.accumulation = fsdp::GradAccumulation::ReduceEachMicroBatch;
    return run_training(MPI_COMM_WORLD, rpn, l);
  }();
  const RunResult r = run_training(MPI_COMM_WORLD, rpn, o);
  EXPECT_EQ(r.shard_reduce_scatter_bytes * 2, lean_run.shard_reduce_scatter_bytes);
  EXPECT_EQ(r.shard_gather_bytes, lean_run.shard_gather_bytes);
}

TEST(FsdpAccounting, ShardedBytesAndThePoolBound) {
  const int rpn = ranks_per_node_from_env();
  for (int depth : {0, 1, 2}) {
    RunOptions o;
    o.steps = 1;
    o.fsdp.forward_prefetch = depth;
    o.fsdp.backward_prefetch = depth;
    const RunResult r = run_training(MPI_COMM_WORLD, rpn, o);
    int64_t sharded = 0, max_unit = 0, root = 0, base = 0;
    for (size_t u = 0; u < r.layouts.size(); ++u) {
      sharded += r.layouts[u].shard_numel() * 4;
      if (r.unit_is_root[u]) root = r.layouts[u].padded_numel * 4;
      else if (u == 0) base = r.layouts[u].padded_numel * 4;  // the base model's, first in forward
      else max_unit = std::max(max_unit, r.layouts[u].padded_numel * 4);
    }
    EXPECT_EQ(r.sharded_param_bytes, sharded);
    // The base model's unit (embedding, final norm) stays gathered through the forward, beside the current unit and
    // its prefetches.
    EXPECT_LE(r.max_outstanding, 2 + depth) << "prefetch depth " << depth;
    // With prefetch every forward but the root's own finds its unit gathered already: one on demand per
    // micro-batch (the root); without, every unit.
    const int per_forward = depth > 0 ? 1 : static_cast<int>(r.layouts.size());
    EXPECT_EQ(r.forward_on_demand, o.steps * o.micro_batches * per_forward) << "prefetch depth " << depth;
    EXPECT_GE(r.max_outstanding, 1);
    EXPECT_LE(r.unsharded_param_peak, (1 + depth) * max_unit + base + root) << "prefetch depth " << depth;
  }
  // Without resharding after forward every layer unit stays gathered until its backward.
  RunOptions keep;
  keep.steps = 1;
  keep.fsdp.strategy = ShardingStrategy::ShardGradOp;
  EXPECT_EQ(run_training(MPI_COMM_WORLD, rpn, keep).max_outstanding, 4);  // the three decoder layers and the base model
}

TEST(FsdpAccounting, SyncModuleStatesBroadcastsTheFirstReplica) {
  const int rpn = ranks_per_node_from_env();
  for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::HybridShard}) {
    RunOptions o;
    o.steps = 0;
    o.fsdp.strategy = s;
    // Every replica starts from different weights; the broadcast must leave replica 0's everywhere.
    o.before_first_step = [](fsdp::FsdpEngine& e, optim::AdamW&) {
      e.initialize(100 + static_cast<uint64_t>(e.mesh().coord().replicate));
      e.sync_module_states();
    };
    const RunResult synced = run_training(MPI_COMM_WORLD, rpn, o);
    RunOptions ref = o;
    ref.before_first_step = [](fsdp::FsdpEngine& e, optim::AdamW&) { e.initialize(100); };
    const RunResult want = run_training(MPI_COMM_WORLD, rpn, ref);
    for (const auto& [p, values] : want.params)
      EXPECT_EQ(synced.params.at(p), values) << sharding_strategy_name(s) << " param " << p;
  }
}

// `shardtrain plan`'s figures (fsdp::plan_fsdp) against what the engine's ledger and counters measure
// on the same config: sharded bytes and traffic exactly, gathered buffers within the plan's bound, and
// the full gradient buffers exactly in both accumulation modes.
TEST(FsdpAccounting, PlanAgreesWithTheEngine) {
  const int rpn = ranks_per_node_from_env();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int s = 1; s <= 5; ++s) {
    for (fsdp::GradAccumulation acc : {fsdp::GradAccumulation::ReduceEachMicroBatch, fsdp::GradAccumulation::NoSync}) {
      // no_sync keeps every unit's gradients only across micro-batches: two of them, one reduction.
      const bool no_sync = acc == fsdp::GradAccumulation::NoSync;
      RunOptions o;
      o.steps = 1;
      o.micro_batches = no_sync ? 2 : 1;
      o.fsdp.strategy = static_cast<ShardingStrategy>(s);
      o.fsdp.accumulation = acc;
      o.fsdp.forward_prefetch = 1;
      const RunResult r = run_training(MPI_COMM_WORLD, rpn, o);
      const fsdp::FsdpPlan plan = fsdp::plan_fsdp(model::ModelSpec(o.model), o.fsdp, world, rpn > 0 ? rpn : world);
      SCOPED_TRACE(fmt::format("{} {}", sharding_strategy_name(o.fsdp.strategy), fsdp::grad_accumulation_name(acc)));
      EXPECT_EQ(r.sharded_param_bytes, plan.sharded_param_bytes);
      EXPECT_EQ(r.shard_gather_bytes, static_cast<uint64_t>(o.micro_batches) * plan.shard_all_gather_bytes);
      EXPECT_EQ(r.shard_reduce_scatter_bytes, plan.shard_reduce_scatter_bytes);
      EXPECT_EQ(r.replicate_all_reduce_bytes, plan.replicate_all_reduce_bytes);
      EXPECT_LE(r.unsharded_param_peak, plan.unsharded_param_bytes);
      EXPECT_GT(r.unsharded_param_peak, 0);
      EXPECT_EQ(r.unsharded_grad_peak, plan.unsharded_grad_bytes);
      EXPECT_EQ(r.unsharded_grad_peak == 0, world == 1);  // one rank: backward writes the shards themselves
      EXPECT_EQ(r.comm_buffer_peak, plan.comm_scratch_bytes + unit_sum_bytes(r, o.fsdp, plan));
    }
  }
}

// With CPU offload the engine uploads each master shard when it unshards the unit (prefetch included) and casts
// it into the unshard buffer right after, on the same stream, so one upload buffer (the largest shard) serves
// every unit: the communication buffers' peak is the fixed scratch (the plan's comm_scratch_bytes and the pinned
// host stage) plus exactly the plan's offload_upload_bytes, at any prefetch depth.
TEST(FsdpAccounting, OffloadUploadsWithinThePlan) {
  const int rpn = ranks_per_node_from_env();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard}) {
    for (int prefetch : {0, 1, 2}) {
      RunOptions o;
      o.steps = 1;
      o.fsdp.strategy = s;
      o.fsdp.offload_params = true;
      o.fsdp.forward_prefetch = prefetch;
      o.fsdp.backward_prefetch = prefetch;
      const RunResult r = run_training(MPI_COMM_WORLD, rpn, o);
      const fsdp::FsdpPlan plan = fsdp::plan_fsdp(model::ModelSpec(o.model), o.fsdp, world, rpn > 0 ? rpn : world);
      const int64_t scratch = plan.comm_scratch_bytes + plan.offload_stage_bytes + unit_sum_bytes(r, o.fsdp, plan);
      SCOPED_TRACE(fmt::format("{} prefetch {}", sharding_strategy_name(s), prefetch));
      EXPECT_GT(plan.offload_stage_bytes, 0);
      EXPECT_EQ(r.comm_buffer_peak, scratch + plan.offload_upload_bytes);
      EXPECT_GT(plan.offload_upload_bytes, 0);
    }
  }
}

// Gradient shards in activation memory (fsdp/grad_placement.hpp), one micro-batch a step: the engine trains to the
// same bits as with every shard in memory of its own, on every strategy, with and without activation
// checkpointing; the shards it keeps in memory of their own are exactly what the plan says (place_grad_shards,
// what `shardtrain plan` counts), and some do sit in the activation arena.
TEST(FsdpAccounting, GradsInActivationMemoryTrainToTheSameBitsWithinThePlan) {
  const int rpn = ranks_per_node_from_env();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int s = 1; s <= 5; ++s) {
    for (bool checkpointing : {false, true}) {
      RunOptions o;
      o.steps = 3;
      o.micro_batches = 1;
      o.fsdp.strategy = static_cast<ShardingStrategy>(s);
      o.fsdp.activation_checkpointing = checkpointing;
      o.fsdp.grads_in_activation_memory = false;
      const RunResult own = run_training(MPI_COMM_WORLD, rpn, o);
      o.fsdp.grads_in_activation_memory = true;
      const RunResult placed = run_training(MPI_COMM_WORLD, rpn, o);
      SCOPED_TRACE(fmt::format("{}{}", sharding_strategy_name(o.fsdp.strategy), checkpointing ? " checkpointing" : ""));
      EXPECT_EQ(placed.losses, own.losses);
      EXPECT_EQ(placed.grad_norms, own.grad_norms);
      for (const auto& [p, values] : own.params) EXPECT_EQ(placed.params.at(p), values) << "param " << p;
      EXPECT_EQ(own.grads_in_arena, 0);
      EXPECT_FALSE(own.grads_in_activations);
      EXPECT_TRUE(placed.grads_in_activations);
      EXPECT_GT(placed.grads_in_arena, 0);

      const model::ModelSpec spec(o.model);
      const fsdp::FsdpPlan plan = fsdp::plan_fsdp(spec, o.fsdp, world, rpn > 0 ? rpn : world);
      const model::ActivationPlan act(o.model, o.global_batch / world, o.seq, o.fsdp.param_dtype,
                                      checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None);
      const fsdp::GradShardMemory g = fsdp::place_grad_shards(spec, o.fsdp, plan, act);
      EXPECT_EQ(placed.sharded_grad_bytes, g.own + g.stage);
      EXPECT_GT(g.in_activations, 0);
      EXPECT_EQ(g.own + g.in_activations, plan.sharded_state_bytes / 4);
      EXPECT_EQ(own.sharded_grad_bytes, plan.sharded_state_bytes / 4);
      EXPECT_LT(placed.sharded_grad_bytes, own.sharded_grad_bytes);
    }
  }
}

// Several micro-batches a step with the option left on: the next forward would overwrite the first micro-batch's
// gradients, so the engine moves every shard to memory of its own at the first micro-batch that is not a step's
// last, and trains to the same bits as without the option.
TEST(FsdpAccounting, GradsLeaveActivationMemoryUnderAccumulation) {
  const int rpn = ranks_per_node_from_env();
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::NoShard, ShardingStrategy::HybridShard}) {
    for (fsdp::GradAccumulation acc : {fsdp::GradAccumulation::ReduceEachMicroBatch, fsdp::GradAccumulation::NoSync}) {
      RunOptions o;
      o.micro_batches = 2;
      o.fsdp.strategy = s;
      o.fsdp.accumulation = acc;
      o.fsdp.grads_in_activation_memory = false;
      const RunResult own = run_training(MPI_COMM_WORLD, rpn, o);
      o.fsdp.grads_in_activation_memory = true;
      o.grads_in_activations_with_accumulation = true;
      const RunResult moved = run_training(MPI_COMM_WORLD, rpn, o);
      SCOPED_TRACE(fmt::format("{} {}", sharding_strategy_name(s), fsdp::grad_accumulation_name(acc)));
      EXPECT_EQ(moved.losses, own.losses);
      for (const auto& [p, values] : own.params) EXPECT_EQ(moved.params.at(p), values) << "param " << p;
      EXPECT_FALSE(moved.grads_in_activations);
      EXPECT_EQ(moved.grads_in_arena, 0);
      EXPECT_EQ(moved.sharded_grad_bytes, own.sharded_grad_bytes);
    }
  }
}

// An evaluation between steps at a larger shape makes the model's arena grow (reallocated, wherever the allocator
// puts it), and the next step places the gradient shards in the new one: training keeps the bits of the run
// without the option. The forward also ends the gradients' readability until the next backward.
TEST(FsdpAccounting, GradsFollowTheArenaWhenItMoves) {
  if (test_on_gpu()) GTEST_SKIP() << "host batches only (the CPU backend's arena)";
  const int rpn = ranks_per_node_from_env();
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::HybridShard}) {
    RunOptions o;
    o.steps = 4;
    o.micro_batches = 1;
    o.fsdp.strategy = s;
    std::vector<int32_t> ids(static_cast<size_t>(6 * 40)), targets(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 7 + 3) % 53);
      targets[i] = static_cast<int32_t>((i * 5 + 1) % 53);
    }
    std::vector<bool> readable;
    o.after_step = [&](int step, fsdp::FsdpEngine& engine, optim::AdamW&) {
      if (step != 1) return;
      model::Batch eval;
      eval.input_ids = ops::make_tensor(ids.data(), DType::I32, {6, 40});
      eval.targets = ops::make_tensor(targets.data(), DType::I32, {6, 40});
      readable.push_back(engine.gradients_readable());
      engine.forward(eval);
      readable.push_back(engine.gradients_readable());
    };
    o.fsdp.grads_in_activation_memory = false;
    const RunResult own = run_training(MPI_COMM_WORLD, rpn, o);
    EXPECT_EQ(readable, (std::vector<bool>{true, true}));
    readable.clear();
    std::vector<const float*> before, after;
    auto record = o.after_step;
    o.after_step = [&](int step, fsdp::FsdpEngine& engine, optim::AdamW& adamw) {
      if (step == 1)
        for (const auto& v : engine.shards()) before.push_back(v.grad);
      if (step == 2)
        for (const auto& v : engine.shards()) after.push_back(v.grad);
      record(step, engine, adamw);
    };
    o.fsdp.grads_in_activation_memory = true;
    const RunResult placed = run_training(MPI_COMM_WORLD, rpn, o);
    SCOPED_TRACE(sharding_strategy_name(s));
    EXPECT_EQ(readable, (std::vector<bool>{true, false}));
    EXPECT_EQ(placed.losses, own.losses);
    for (const auto& [p, values] : own.params) EXPECT_EQ(placed.params.at(p), values) << "param " << p;
    EXPECT_GT(placed.grads_in_arena, 0);
    // Whether the larger arena lands elsewhere is the allocator's choice; when it does, the shards moved with it
    // and the optimizer followed (the bits above). tests/optim/adamw_test.cpp moves them on purpose.
    EXPECT_EQ(before.size(), after.size());
  }
}
