// The equivalence matrix: every strategy x wrap policy x offload x accumulation mode, trained on this
// run's world, gives the losses and final parameters of one rank training the same global batch, to
// fp32 rounding. Activation checkpointing under every strategy too, and the bf16 policy within bf16
// tolerance of fp32.
// SHARDTRAIN_TEST_MATRIX=gpu_subset (the CUDA emulator's runs, tests/fsdp/CMakeLists.txt: a hundred times a GPU's
// time): only the combinations whose GPU paths differ, the rest being the CPU backend's at every world size.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <string_view>

#include "harness.hpp"

using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {

int env_rpn() { return ranks_per_node_from_env(); }

// The subset keeps every GPU path: each strategy (its mesh axes, so its collectives and their streams) with and
// without offload (the upload and download streams, the host AdamW, the device's unit sums) in each accumulation
// mode, bf16 (the policy and bf16 reductions), activation checkpointing with prefetch, reshard_after_forward,
// all_reduce_last in both reduce dtypes. What it leaves out varies axes whose code is the same on every device
// (the unit layouts a wrap policy makes), which the CPU backend's matrix at W = 1, 2, 4 and 2 x 2 covers in full.
bool gpu_subset() {
  const char* m = std::getenv("SHARDTRAIN_TEST_MATRIX");
  return m != nullptr && std::string_view(m) == "gpu_subset";
}

const RunResult& reference() {
  static const RunResult r = [] {
    RunOptions o;
    o.fsdp.strategy = ShardingStrategy::FullShard;
    o.fsdp.wrap.policy = fsdp::WrapPolicy::NoWrap;
    o.micro_batches = 1;
    return run_training(MPI_COMM_SELF, 0, o);
  }();
  return r;
}

void expect_matches_reference(const RunResult& got, double loss_tol, double param_tol, const std::string& what) {
  const RunResult& ref = reference();
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], loss_tol * std::abs(ref.losses[s])) << what << " step " << s;
    // The norm is computed from the step's reduced gradient shards before the update: a reduction not yet
    // landed when it is read shows here even where the update itself later sees it.
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], loss_tol * std::abs(ref.grad_norms[s]))
        << what << " grad norm, step " << s;
  }
  ASSERT_EQ(got.params.size(), ref.params.size()) << what;
  double worst = 0;
  int worst_param = -1;
  for (const auto& [p, values] : ref.params) {
    const std::vector<float>& g = got.params.at(p);
    ASSERT_EQ(g.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const double d = std::abs(static_cast<double>(g[i]) - values[i]);
      if (d > worst) worst = d, worst_param = p;
    }
  }
  EXPECT_LE(worst, param_tol) << what << ": worst parameter difference in param " << worst_param;
}

std::string describe(const fsdp::FsdpConfig& c) {
  return fmt::format("{} {} offload={} {} ckpt={}", sharding_strategy_name(c.strategy),
                     fsdp::wrap_policy_name(c.wrap.policy), c.offload_params, fsdp::grad_accumulation_name(c.accumulation),
                     c.activation_checkpointing);
}

}  // namespace

TEST(FsdpEquivalence, ReferenceLearns) {
  const RunResult& ref = reference();
  ASSERT_EQ(ref.losses.size(), 3u);
  // At init the loss is close to ln(vocab); training on the same pattern makes it fall.
  EXPECT_NEAR(ref.losses[0], std::log(53.0), 0.15 * std::log(53.0));
  EXPECT_LT(ref.losses[2], ref.losses[0]);
}

TEST(FsdpEquivalence, EveryStrategyWrapOffloadAndAccumulationMode) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int checked = 0;
  bool padded = false;
  const fsdp::WrapPolicy wraps[] = {fsdp::WrapPolicy::TransformerBased, fsdp::WrapPolicy::SizeBased,
                                    fsdp::WrapPolicy::NoWrap};
  for (int s = 1; s <= 5; ++s) {
    for (int w = 0; w < 3; ++w) {
      for (int offload = 0; offload < 2; ++offload) {
        for (int a = 0; a < 2; ++a) {
          // The subset: every strategy x offload x accumulation mode (20), each with one wrap policy, rotated so
          // that each strategy meets every policy and each policy every offload x accumulation pair.
          if (gpu_subset() && w != (s + 2 * offload + a) % 3) continue;
          const fsdp::WrapPolicy wrap = wraps[w];
          const fsdp::GradAccumulation acc =
              a == 0 ? fsdp::GradAccumulation::ReduceEachMicroBatch : fsdp::GradAccumulation::NoSync;
          RunOptions o;
          o.fsdp.strategy = static_cast<ShardingStrategy>(s);
          o.fsdp.wrap.policy = wrap;
          o.fsdp.wrap.min_num_params = 300;
          o.fsdp.offload_params = offload;
          o.fsdp.accumulation = acc;
          const RunResult r = run_training(MPI_COMM_WORLD, env_rpn(), o);
          expect_matches_reference(r, 2e-6, 2e-6, describe(o.fsdp));
          // On a GPU every norm comes from the per-unit device sums (the harness checks each against the
          // shards' own norm) where the step reduces gradients: on more than one rank (the matrix reduces in
          // fp32; one rank writes the shards in place), and with offload where the host shard is one reduction
          // (no_sync).
          const bool unit_sums = test_on_gpu() && (offload ? acc == fsdp::GradAccumulation::NoSync : world > 1);
          EXPECT_EQ(r.unit_sum_norms, unit_sums ? static_cast<int>(r.losses.size()) : 0) << describe(o.fsdp);
          // The device squares each element in fp32 (kernels/sum_squares.cu), the host norm in double.
          EXPECT_LE(r.unit_sum_norm_diff, 1e-8) << describe(o.fsdp);
          for (const fsdp::FlatLayout& l : r.layouts) padded = padded || l.padded_numel > l.used;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, gpu_subset() ? 20 : 60);
  if (world > 1) {
    EXPECT_TRUE(padded) << "no unit needed padding: the matrix would not exercise it";
  }
}

TEST(FsdpEquivalence, ActivationCheckpointingUnderEveryStrategy) {
  for (int s = 1; s <= 5; ++s) {
    // The subset: recomputation regathers (FULL_SHARD), keeps the gather (SHARD_GRAD_OP), over two axes (HYBRID_SHARD).
    if (gpu_subset() && s != 1 && s != 2 && s != 4) continue;
    RunOptions o;
    o.fsdp.strategy = static_cast<ShardingStrategy>(s);
    o.fsdp.activation_checkpointing = true;
    o.fsdp.backward_prefetch = 2;
    o.fsdp.forward_prefetch = 1;
    expect_matches_reference(run_training(MPI_COMM_WORLD, env_rpn(), o), 2e-6, 2e-6, describe(o.fsdp));
  }
}

TEST(FsdpEquivalence, ReshardAfterForwardIsItsOwnSwitch) {
  RunOptions o;
  o.fsdp.strategy = ShardingStrategy::FullShard;
  o.fsdp.reshard_after_forward = false;  // FSDP2's switch: behaves like SHARD_GRAD_OP on the same mesh
  const RunResult r = run_training(MPI_COMM_WORLD, env_rpn(), o);
  expect_matches_reference(r, 2e-6, 2e-6, "FULL_SHARD reshard_after_forward=false");
  RunOptions sgo = o;
  sgo.fsdp.strategy = ShardingStrategy::ShardGradOp;
  sgo.fsdp.reshard_after_forward.reset();
  EXPECT_EQ(r.shard_gather_bytes, run_training(MPI_COMM_WORLD, env_rpn(), sgo).shard_gather_bytes);
}

TEST(FsdpEquivalence, Bf16PolicyTracksFp32AndHalvesGatherTraffic) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::HybridShard}) {
    RunOptions f32;
    f32.fsdp.strategy = s;
    RunOptions bf = f32;
    bf.fsdp.param_dtype = DType::BF16;
    bf.fsdp.reduce_dtype = DType::BF16;
    const RunResult a = run_training(MPI_COMM_WORLD, env_rpn(), f32);
    const RunResult b = run_training(MPI_COMM_WORLD, env_rpn(), bf);
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(b.losses[i], a.losses[i], 2e-2 * a.losses[i]) << "step " << i;
    EXPECT_NE(a.losses.back(), b.losses.back());  // bf16 really was used
    EXPECT_EQ(b.shard_gather_bytes * 2, a.shard_gather_bytes);
    EXPECT_EQ(b.shard_reduce_scatter_bytes * 2, a.shard_reduce_scatter_bytes);
    if (world > 1) {
      EXPECT_GT(a.shard_gather_bytes, 0u);
    }
  }
}

// FSDP2's set_requires_all_reduce(False) on every micro-batch but the last: reduce-scatters each micro-batch, one
// all-reduce over replicas per step of the accumulated shard. The same gradients (to fp32 rounding: the sums are
// taken in another order), half the replica traffic of two micro-batches; with offload, refused.
TEST(FsdpEquivalence, AllReduceOnTheLastMicroBatchOnly) {
  for (int s = 1; s <= 5; ++s) {
    for (DType rd : {DType::F32, DType::BF16}) {
      // The subset: each strategy in one reduce dtype (fp32 for FULL_SHARD and HYBRID_SHARD_ZERO2, bf16 for
      // SHARD_GRAD_OP and NO_SHARD), and HYBRID_SHARD, whose replica all-reduce is the point, in both.
      if (gpu_subset() && s != 4 && (rd == DType::BF16) != (s == 2 || s == 3)) continue;
      RunOptions o;
      o.fsdp.strategy = static_cast<ShardingStrategy>(s);
      o.fsdp.reduce_dtype = rd;
      o.fsdp.accumulation = fsdp::GradAccumulation::AllReduceLast;
      const RunResult r = run_training(MPI_COMM_WORLD, env_rpn(), o);
      const std::string what = describe(o.fsdp) + " reduce " + dtype_name(rd);
      if (rd == DType::F32) {
        expect_matches_reference(r, 2e-6, 2e-6, what);
      } else {
        for (size_t i = 0; i < r.losses.size(); ++i)
          EXPECT_NEAR(r.losses[i], reference().losses[i], 2e-3 * reference().losses[i]) << what;
      }
      RunOptions each = o;
      each.fsdp.accumulation = fsdp::GradAccumulation::ReduceEachMicroBatch;
      const RunResult e = run_training(MPI_COMM_WORLD, env_rpn(), each);
      EXPECT_EQ(r.shard_reduce_scatter_bytes, e.shard_reduce_scatter_bytes) << what;
      EXPECT_EQ(r.replicate_all_reduce_bytes * 2, e.replicate_all_reduce_bytes) << what;  // two micro-batches per step
    }
  }
  RunOptions o;
  o.fsdp.accumulation = fsdp::GradAccumulation::AllReduceLast;
  o.fsdp.offload_params = true;
  try {
    run_training(MPI_COMM_WORLD, env_rpn(), o);
    ADD_FAILURE() << "all_reduce_last with offload_params was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fsdp.grad_accumulation: all_reduce_last does not combine with offload_params"),
              std::string::npos)
        << e.what();
  }
}
