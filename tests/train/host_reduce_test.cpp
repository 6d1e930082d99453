// The training step's host collectives over the world (issue 34.6), on 2 ranks (FULL_SHARD) and on 4 as two
// simulated nodes of 2 (HYBRID_SHARD): a steady step makes exactly one world all-reduce, carrying its loss sum,
// its non-finite flag, its gradient norm's square, the preemption flag and the next step's counted targets (read
// ahead), no all-reduce over the shard axis (the norm's own, before it rode in the world's), and no raw MPI
// all-reduce on MPI_COMM_WORLD (counted through MPI's profiling interface, below). Reading ahead changes no
// loss and no data position: evaluation between steps, a preemption (one rank's SIGUSR1) with its save, and a
// resume from that save give the uninterrupted run's losses bit for bit, and the state a checkpoint keeps is
// the position after the last step taken, never after the batch read ahead.
// This binary has its own main (below): the tests need the Runtime that main builds after MPI_Init.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/checkpointing.hpp"
#include "shardtrain/train/preemption.hpp"
#include "shardtrain/train/trainer.hpp"
#include "tests/train/tiny_train.hpp"

using namespace shardtrain;
namespace fs = std::filesystem;

// Every MPI_Allreduce / MPI_Iallreduce this process issues on MPI_COMM_WORLD itself (the library's own calls,
// the comm layer's among them, go to its duplicates), counted before PMPI does the work.
namespace {
std::atomic<uint64_t> g_raw_world_all_reduces{0};
}  // namespace

extern "C" int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  if (comm == MPI_COMM_WORLD) g_raw_world_all_reduces.fetch_add(1);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}

extern "C" int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                              MPI_Request* request) {
  if (comm == MPI_COMM_WORLD) g_raw_world_all_reduces.fetch_add(1);
  return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}

namespace {

const Runtime* g_runtime = nullptr;  // set once in main before any test runs

int rank() { return g_runtime->topology().world_rank; }
int world_size() { return g_runtime->topology().world_size; }
std::string tag(const std::string& name) { return "train_host_reduce_test_np" + std::to_string(world_size()) + "_" + name; }

// 16 sequences a step: 2 ranks x 2 x 4 micro-batches, or 4 ranks x 2 x 2; 8 steps fit in the epoch.
train::TrainConfig tiny_config(const std::string& name) {
  train::TrainConfig c = test::tiny_train_config(test::write_pattern_dataset(tag("data.h5"), rank()), tag(name), rank());
  c.fsdp.engine.strategy = world_size() == 4 ? ShardingStrategy::HybridShard : ShardingStrategy::FullShard;
  c.schedule.max_steps = 8;
  c.schedule.eval_batches = 0;
  c.data.global_batch_size = 16;
  return c;
}

struct LossLog final : train::TrainerHooks {
  std::vector<std::pair<int64_t, double>> losses;
  void on_step_end(train::Trainer&, const train::StepMetrics& m) override { losses.emplace_back(m.step, m.loss); }
};

// The world's collectives each step made, read at each step's end (no evaluation or save runs in these runs).
struct WorldCollectives final : train::TrainerHooks {
  struct Step {
    uint64_t all_reduces = 0, all_reduce_bytes = 0, other = 0, raw = 0, shard_all_reduces = 0;
  };
  std::vector<Step> steps;
  uint64_t calls0[kCollectiveKinds]{}, bytes0 = 0, raw0 = 0, shard0 = 0;
  void on_start(train::Trainer& t) override { mark(t); }
  void on_step_end(train::Trainer& t, const train::StepMetrics&) override {
    const TrafficCounters& c = t.comms().world().traffic();
    Step s;
    s.all_reduces = c.calls(CollectiveKind::AllReduce) - calls0[static_cast<int>(CollectiveKind::AllReduce)];
    s.all_reduce_bytes = c.bytes(CollectiveKind::AllReduce) - bytes0;
    for (int k = 0; k < kCollectiveKinds; ++k)
      if (k != static_cast<int>(CollectiveKind::AllReduce)) s.other += c.calls(static_cast<CollectiveKind>(k)) - calls0[k];
    s.raw = g_raw_world_all_reduces.load() - raw0;
    s.shard_all_reduces = t.comms().shard().traffic().calls(CollectiveKind::AllReduce) - shard0;
    steps.push_back(s);
    mark(t);
  }
  void mark(train::Trainer& t) {
    const TrafficCounters& c = t.comms().world().traffic();
    for (int k = 0; k < kCollectiveKinds; ++k) calls0[k] = c.calls(static_cast<CollectiveKind>(k));
    bytes0 = c.bytes(CollectiveKind::AllReduce);
    raw0 = g_raw_world_all_reduces.load();
    shard0 = t.comms().shard().traffic().calls(CollectiveKind::AllReduce);
  }
};

// The losses of an uninterrupted 8-step run, without evaluation (computed once per world size).
const std::vector<std::pair<int64_t, double>>& reference_losses() {
  static std::vector<std::pair<int64_t, double>> losses = [] {
    train::Trainer t(*g_runtime, tiny_config("reference"));
    LossLog log;
    t.add_hooks(&log);
    t.run();
    EXPECT_EQ(t.state().sampler_samples, 8 * 16) << "the last step's position, not past a batch read ahead";
    return log.losses;
  }();
  return losses;
}

}  // namespace

TEST(HostReduce, OneWorldAllReducePerStepCarriesLossFlagPreemptionAndNextCounts) {
  const train::TrainConfig c = tiny_config("counted");
  train::Trainer t(*g_runtime, c);
  EXPECT_EQ(t.accumulation_steps(), 8 / world_size());
  train::PreemptionHooks preemption;  // as `shardtrain train` has it: its flag rides in the step's all-reduce
  WorldCollectives world;
  LossLog log;
  t.add_hooks(&preemption);
  t.add_hooks(&world);
  t.add_hooks(&log);
  const train::TrainSummary s = t.run();
  ASSERT_EQ(s.steps, 8);
  ASSERT_EQ(world.steps.size(), 8u);
  for (size_t k = 0; k < world.steps.size(); ++k) {
    const WorldCollectives::Step& w = world.steps[k];
    const int64_t step = static_cast<int64_t>(k) + 1;
    // Step 1 also reduces its own counts (nothing was read ahead before it): one int64.
    EXPECT_EQ(w.all_reduces, step == 1 ? 2u : 1u) << "step " << step;
    // The step's doubles: loss sum, non-finite flag, the gradient norm's square, the preemption hook's 2 flags,
    // and but for the last step the next step's counted targets (one source: one count).
    const uint64_t step_bytes = 8 * (3 + 2 + (step < 8 ? 1 : 0));
    EXPECT_EQ(w.all_reduce_bytes, step_bytes + (step == 1 ? 8 : 0)) << "step " << step;
    EXPECT_EQ(w.other, 0u) << "step " << step << ": no other world collective";
    EXPECT_EQ(w.raw, 0u) << "step " << step << ": no raw MPI all-reduce on MPI_COMM_WORLD (the preemption flag's was one)";
    EXPECT_EQ(w.shard_all_reduces, 0u) << "step " << step << ": the gradient norm's sum rides the world's all-reduce";
  }
  EXPECT_FALSE(preemption.preempted());
  EXPECT_EQ(t.state().sampler_samples, 8 * 16);
  // The same losses as the run without the preemption hook: its slots change nothing else in the buffer.
  EXPECT_EQ(log.losses, reference_losses());
}

TEST(HostReduce, EvaluationBetweenStepsChangesNoLoss) {
  train::TrainConfig c = tiny_config("evaluated");
  c.schedule.eval_every = 2;
  c.schedule.eval_batches = 2;
  train::Trainer t(*g_runtime, c);
  LossLog log;
  t.add_hooks(&log);
  const train::TrainSummary s = t.run();
  EXPECT_TRUE(std::isfinite(s.last_val_loss));
  ASSERT_EQ(log.losses.size(), 8u);
  for (size_t k = 0; k < 8; ++k) EXPECT_EQ(log.losses[k], reference_losses()[k]) << "step " << k + 1;
  EXPECT_EQ(t.state().sampler_samples, 8 * 16);
}

TEST(HostReduce, PreemptedOnOneRankSavesTheLastStepsPositionAndResumesBitForBit) {
  // Rank 0 alone gets SIGUSR1 after step 2: its flag travels in step 3's all-reduce, so every rank stops after
  // step 3 and saves there, though step 4's batch was already read ahead.
  const std::string dir = tag("preempted_checkpoints");
  if (rank() == 0) fs::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  struct SignalAfter final : train::TrainerHooks {
    void on_step_end(train::Trainer&, const train::StepMetrics& m) override {
      if (m.step == 2 && rank() == 0) std::raise(SIGUSR1);
    }
  };
  {
    train::TrainConfig c = tiny_config("preempted");
    c.checkpoint.dir = dir;
    train::Trainer t(*g_runtime, c);
    train::PreemptionHooks preemption;  // before the checkpoints, as in `shardtrain train`
    train::CheckpointHooks checkpoints(t);
    SignalAfter signal;
    LossLog log;
    t.add_hooks(&preemption);
    t.add_hooks(&checkpoints);
    t.add_hooks(&signal);
    t.add_hooks(&log);
    const train::TrainSummary s = t.run();
    EXPECT_TRUE(preemption.preempted());
    EXPECT_EQ(preemption.signal(), SIGUSR1);
    EXPECT_EQ(s.steps, 3) << "every rank stops after the same step";
    EXPECT_EQ(t.state().step, 3);
    EXPECT_EQ(t.state().sampler_samples, 3 * 16) << "the position after step 3, not after the batch read ahead";
    EXPECT_EQ(checkpoints.last_saved(), dir + "/step_00000003");
    ASSERT_EQ(log.losses.size(), 3u);
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(log.losses[k], reference_losses()[k]) << "step " << k + 1;
  }
  train::TrainConfig c = tiny_config("resumed");
  c.checkpoint.dir = dir;
  c.checkpoint.resume = "auto";
  train::Trainer t(*g_runtime, c);
  train::CheckpointHooks checkpoints(t);
  LossLog log;
  t.add_hooks(&checkpoints);
  t.add_hooks(&log);
  t.run();
  EXPECT_EQ(checkpoints.resumed_from(), dir + "/step_00000003");
  ASSERT_EQ(log.losses.size(), 5u);
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(log.losses[k], reference_losses()[3 + k]) << "step " << 4 + k;
  EXPECT_EQ(t.state().sampler_samples, 8 * 16);
}

int main(int argc, char** argv) { return test::run_tests_with_runtime(argc, argv, &g_runtime); }
