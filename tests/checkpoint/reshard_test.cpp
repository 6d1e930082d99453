// Resharding on load: a checkpoint saved on this run's world (FULL_SHARD, transformer wrap) loads on
// 2 ranks and on 1, under other strategies and wrap policies. What is loaded is exactly what was saved
// (checked by saving it again and comparing every tensor and optimizer state bit for bit), and training
// continues with the losses of a one-rank run continuing from the same checkpoint, to fp32 rounding.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>

#include "common.hpp"
#include "harness.hpp"
#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/reader.hpp"

using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {

void expect_same_tensors(const std::string& a_dir, const std::string& b_dir) {
  checkpoint::CheckpointReader a(a_dir), b(b_dir);
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  EXPECT_EQ(a.optimizer_steps(), b.optimizer_steps());
  for (const checkpoint::TensorInfo& t : a.tensors()) {
    for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
      std::vector<float> x(static_cast<size_t>(t.numel)), y(x.size());
      a.read(t.name, kind, 0, x);
      b.read(t.name, kind, 0, y);
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << t.name << " " << kind;
    }
  }
}

// Continues training from `ckpt` on `comm` (steps 2..3), first re-saving what it loaded into `resave_dir`.
RunResult continue_from(MPI_Comm comm, int rpn, const std::string& ckpt, const RunOptions& base,
                        const std::string& resave_dir) {
  RunOptions o = base;
  o.first_step = 2;
  o.steps = 4;
  o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW& a) {
    checkpoint::load(e, &a, ckpt);
    if (!resave_dir.empty()) {
      checkpoint::SaveMeta m;
      m.step = 2;
      checkpoint::save_sharded(e, a, resave_dir, m, 0);
    }
  };
  return run_training(comm, rpn, o);
}

}  // namespace

TEST(Reshard, SaveHereLoadOnTwoRanksAndOneAcrossStrategiesAndWraps) {
  const int rpn = ranks_per_node_from_env();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string dir = testing_ckpt::fresh_dir("reshard_src");
  RunOptions o;
  o.steps = 2;
  o.after_step = [&](int step, fsdp::FsdpEngine& e, optim::AdamW& a) {
    if (step != 1) return;
    checkpoint::SaveMeta m;
    m.step = 2;
    checkpoint::save_sharded(e, a, dir, m, 0);
  };
  run_training(MPI_COMM_WORLD, rpn, o);
  const std::string ckpt = checkpoint::find_latest(dir);
  ASSERT_FALSE(ckpt.empty());

  // The reference: one rank continues from the checkpoint (FULL_SHARD, no wrap).
  RunResult reference;
  if (rank == 0) {
    RunOptions ref;
    ref.fsdp.wrap.policy = fsdp::WrapPolicy::NoWrap;
    reference = continue_from(MPI_COMM_SELF, 0, ckpt, ref, "");
  }

  struct Target {
    int ranks;
    ShardingStrategy strategy;
    fsdp::WrapPolicy wrap;
  };
  const Target targets[] = {{2, ShardingStrategy::FullShard, fsdp::WrapPolicy::TransformerBased},
                            {2, ShardingStrategy::HybridShard, fsdp::WrapPolicy::SizeBased},
                            {2, ShardingStrategy::NoShard, fsdp::WrapPolicy::NoWrap},
                            {1, ShardingStrategy::ShardGradOp, fsdp::WrapPolicy::SizeBased},
                            {1, ShardingStrategy::FullShard, fsdp::WrapPolicy::TransformerBased}};
  int checked = 0;
  for (const Target& t : targets) {
    if (t.ranks > world) continue;
    SCOPED_TRACE(fmt::format("{} ranks {} {}", t.ranks, sharding_strategy_name(t.strategy), fsdp::wrap_policy_name(t.wrap)));
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank < t.ranks ? 0 : MPI_UNDEFINED, rank, &sub);
    const std::string resave = testing_ckpt::fresh_dir(fmt::format("resave_{}", checked));
    if (sub != MPI_COMM_NULL) {
      RunOptions target;
      target.fsdp.strategy = t.strategy;
      target.fsdp.wrap.policy = t.wrap;
      target.fsdp.wrap.min_num_params = 250;
      // On the sub-world, simulated nodes hold all its ranks: hybrid meshes become 1 x ranks.
      const RunResult r = continue_from(sub, 0, ckpt, target, resave);
      if (rank == 0) {
        expect_same_tensors(ckpt, checkpoint::find_latest(resave));
        ASSERT_EQ(r.losses.size(), reference.losses.size());
        for (size_t i = 0; i < r.losses.size(); ++i)
          EXPECT_NEAR(r.losses[i], reference.losses[i], 2e-6 * reference.losses[i]);
        for (const auto& [p, values] : reference.params) {
          const auto& got = r.params.at(p);
          for (size_t i = 0; i < values.size(); ++i)
            ASSERT_NEAR(got[i], values[i], 2e-6) << "param " << p << " [" << i << "]";
        }
      }
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}
