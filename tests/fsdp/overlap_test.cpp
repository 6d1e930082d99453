// The FSDP engine's overlap, proven on the CUDA emulator without two GPUs (issue 34): 8 ranks as 2 simulated nodes of
// 4, a device each, the emulated NCCL. Every strategy x {fp32, bf16} reduction x {1, 4} micro-batches x {offload,
// none} x {reshard_after_forward true, false} trains a step and matches one rank training the same global batch (loss
// and gradient norm); that step's stream trace (tests/emulator, the dependency graph of every op queued) shows each overlap
// property (schedule_checker.hpp), and the next step's first all-gathers queued inside the update (gather-ahead). Each
// property's check is then shown to fail on a schedule broken on purpose.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "harness.hpp"
#include "schedule_checker.hpp"

using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {

// Marks the engine's schedule points in the emulator's trace.
class TraceMarks final : public fsdp::ScheduleObserver {
 public:
  void schedule_point(fsdp::SchedulePoint what, int unit) override {
    static constexpr char kinds[] = {'G', 'F', 'B', 'R'};
    cuda_emulator::trace_mark(fmt::format("{} {}", kinds[static_cast<int>(what)], unit));
  }
};

constexpr int kGlobalBatch = 32;  // 8 ranks x 4 micro-batches x 1 row
constexpr int kSteps = 1;         // the traced step: its loss, gradient norm (every reduction in it) and update

RunOptions base_options() {
  RunOptions o;
  o.steps = kSteps;
  o.global_batch = kGlobalBatch;
  o.gather_params = false;  // the losses and gradient norms say enough here; fsdp_equivalence_test checks parameters
  return o;
}

const RunResult& reference() {
  static const RunResult r = [] {
    RunOptions o = base_options();
    o.fsdp.wrap.policy = fsdp::WrapPolicy::NoWrap;
    o.micro_batches = 1;
    return run_training(MPI_COMM_SELF, 0, o);
  }();
  return r;
}

struct Traced {
  RunResult result;
  ScheduleReport report;
  int gathers_ahead = 0;
};

// Gather-ahead (FsdpEngine::gather_ahead, in the middle of the update): the all-gathers queued after the step's last
// micro-batch and before the last kernel launch of the step (the rest of the update), so that update hides them.
int gathers_ahead(const std::vector<cuda_emulator::TraceOp>& trace) {
  size_t last_mb = 0, last_kernel = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].what == "mark" && trace[i].detail.rfind("E ", 0) == 0) last_mb = i;
    if (trace[i].what == "kernel launch") last_kernel = i;
  }
  int n = 0;
  for (size_t i = last_mb; i < last_kernel; ++i) n += trace[i].what == "ncclAllGather";
  return n;
}

// Trains `o` on the world with the first step traced, and checks the trace.
Traced run_traced(RunOptions o, ScheduleExpectations expect) {
  TraceMarks marks;
  std::vector<cuda_emulator::TraceOp> trace;
  std::set<size_t> shard_bytes;
  o.before_first_step = [&](fsdp::FsdpEngine& e, optim::AdamW&) {
    for (size_t u = 0; u < e.units().size(); ++u)
      shard_bytes.insert(static_cast<size_t>(e.layout(static_cast<int>(u)).shard_numel()) * 4);
    e.set_schedule_observer(&marks);
    cuda_emulator::trace_begin();
  };
  o.after_micro_batch = [](int mb) { cuda_emulator::trace_mark(fmt::format("E {}", mb)); };
  o.after_step = [&](int step, fsdp::FsdpEngine& e, optim::AdamW&) {
    if (step != 0) return;
    trace = cuda_emulator::trace_end();
    e.set_schedule_observer(nullptr);
  };
  Traced t;
  t.result = run_training(MPI_COMM_WORLD, ranks_per_node_from_env(), o);
  expect.shard_bytes = shard_bytes;
  t.report = check_schedule(trace, expect);
  t.gathers_ahead = gathers_ahead(trace);
  return t;
}

std::string describe(const fsdp::FsdpConfig& c, int micro_batches) {
  return fmt::format("{} reduce {} micro-batches {} offload={} reshard_after_forward={}", sharding_strategy_name(c.strategy),
                     dtype_name(c.reduce_dtype), micro_batches, c.offload_params, c.reshards_after_forward());
}

std::string violations(const ScheduleReport& r) {
  std::string out;
  for (size_t i = 0; i < r.violations.size() && i < 5; ++i) out += "\n  " + r.violations[i];
  if (r.violations.size() > 5) out += fmt::format("\n  ... {} in all", r.violations.size());
  return out;
}

bool emulated_nccl_world() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return test_on_gpu() && world == 8;
}

}  // namespace

TEST(FsdpOverlap, EveryStrategyReductionAccumulationOffloadAndReshard) {
  if (!emulated_nccl_world()) GTEST_SKIP() << "needs 8 ranks on the (emulated) GPU";
  const RunResult& ref = reference();
  double worst_bf16_norm = 0;
  int checked = 0;
  for (int s = 1; s <= 5; ++s) {
    for (DType rd : {DType::F32, DType::BF16}) {
      for (int mb : {1, 4}) {
        for (bool offload : {false, true}) {
          for (bool raf : {true, false}) {
            RunOptions o = base_options();
            o.fsdp.strategy = static_cast<ShardingStrategy>(s);
            o.fsdp.reduce_dtype = rd;
            o.fsdp.offload_params = offload;
            o.fsdp.reshard_after_forward = raf;
            o.micro_batches = mb;
            const std::string what = describe(o.fsdp, mb);
            ScheduleExpectations expect;
            expect.offload_copies = offload;
            const Traced t = run_traced(o, expect);
            // The loss as one rank's (the forward is fp32 either way); the gradient norm, which reads every reduced
            // shard after the step's last reduction, to fp32 rounding, or bf16's for bf16 reductions.
            ASSERT_EQ(t.result.losses.size(), ref.losses.size()) << what;
            EXPECT_NEAR(t.result.losses[0], ref.losses[0], 2e-6 * ref.losses[0]) << what;
            const double norm_tol = rd == DType::F32 ? 2e-6 : 1e-2;
            EXPECT_NEAR(t.result.grad_norms[0], ref.grad_norms[0], norm_tol * ref.grad_norms[0]) << what;
            if (rd == DType::BF16)
              worst_bf16_norm =
                  std::max(worst_bf16_norm, std::abs(t.result.grad_norms[0] - ref.grad_norms[0]) / ref.grad_norms[0]);
            EXPECT_TRUE(t.report.violations.empty()) << what << violations(t.report);
            const auto strategy = o.fsdp.strategy;
            if (strategy != ShardingStrategy::NoShard) {
              EXPECT_GT(t.report.prefetch_pairs, 0) << what;
              EXPECT_GT(t.report.gathers_waited, 0) << what;
              // Not with offload: its update runs on the host (the trainer's step_async), its uploads prefetch.
              if (!offload)
                EXPECT_GT(t.gathers_ahead, 0) << what << ": no all-gather of the next step queued inside the update";
              if (offload) EXPECT_EQ(t.gathers_ahead, 0) << what;
            }
            EXPECT_GT(t.report.reductions, 0) << what;
            if (offload) EXPECT_GT(t.report.offload_copies, 0) << what;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 80);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("bf16 reductions: gradient norm within %.2g of fp32's\n", worst_bf16_norm);
}

// Each property's check fails when the schedule is broken on purpose.
TEST(FsdpOverlap, TheChecksCatchABrokenSchedule) {
  if (!emulated_nccl_world()) GTEST_SKIP() << "needs 8 ranks on the (emulated) GPU";
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::HybridShard}) {
    RunOptions o = base_options();
    o.fsdp.strategy = s;
    o.fsdp.reduce_dtype = DType::BF16;
    o.micro_batches = 1;
    {  // no prefetch: every gather is issued at its unit's first use
      RunOptions p = o;
      p.fsdp.forward_prefetch = 0;
      p.fsdp.backward_prefetch = 0;
      ScheduleExpectations only;
      only.async_reductions = false;
      const Traced t = run_traced(p, only);
      ASSERT_FALSE(t.report.violations.empty()) << sharding_strategy_name(s) << ": prefetch 0 passed the prefetch check";
      EXPECT_NE(t.report.violations.front().find("all-gather queued"), std::string::npos) << t.report.violations.front();
    }
    {  // synchronous reductions: compute waits for each right after issuing it
      RunOptions p = o;
      p.fsdp.reduce_schedule = fsdp::ReduceSchedule::Synchronous;
      ScheduleExpectations only;
      only.prefetch = false;
      const Traced t = run_traced(p, only);
      ASSERT_FALSE(t.report.violations.empty()) << sharding_strategy_name(s) << ": a synchronous reduction passed";
      EXPECT_NE(t.report.violations.front().find("compute waits for unit"), std::string::npos)
          << t.report.violations.front();
    }
    {  // the update in one launch and the next step's gathers after it: none counted inside the update
      RunOptions p = o;
      p.gather_ahead = false;
      const Traced t = run_traced(p, ScheduleExpectations{});
      EXPECT_EQ(t.gathers_ahead, 0) << sharding_strategy_name(s);
      const Traced ahead = run_traced(o, ScheduleExpectations{});
      EXPECT_GT(ahead.gathers_ahead, 0) << sharding_strategy_name(s);
    }
  }
}
