// AdamW on host shards: the one-region chunked update against the per-range loop it replaced (bit for bit,
// at several thread counts) and against a plain double-precision AdamW; padding never touched; state
// read/write round trips and a resume through them; the update on a worker thread (step_async); the host
// gradient norm and the NaN fault helper.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::testing_optim {
namespace {

constexpr float kPad = 7.25f;  // what padding holds; any change is a write outside the ranges

optim::AdamWConfig exempt_config() {
  optim::AdamWConfig c;
  c.decay = optim::DecayScope::ExemptNormsAndEmbeddings;
  c.weight_decay = 0.1;
  return c;
}

// lr and grad_scale per step: a warmup-like rise, and clipping on some steps.
double lr_at(int step) { return 1e-2 * (step + 1) / 3.0; }
double scale_at(int step) { return step % 3 == 1 ? 0.37 : 1.0; }

std::vector<float> state_of(const optim::AdamW& a, size_t i, optim::OptimState which) {
  std::vector<float> out(static_cast<size_t>(a.numel(i)));
  a.read_state(i, which, out);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_padding(const std::vector<ShardSpec>& specs, const HostShards& h, const optim::AdamW& a) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::vector<float> m = state_of(a, i, optim::OptimState::ExpAvg), v = state_of(a, i, optim::OptimState::ExpAvgSq);
    for (int64_t k = 0; k < specs[i].numel; ++k) {
      if (in_ranges(specs[i], k)) continue;
      const auto u = static_cast<size_t>(k);
      ASSERT_EQ(h.param[i][u], kPad) << "shard " << i << " padding element " << k;
      ASSERT_EQ(m[u], 0.0f) << "shard " << i << " exp_avg padding element " << k;
      ASSERT_EQ(v[u], 0.0f) << "shard " << i << " exp_avg_sq padding element " << k;
    }
  }
}

TEST(AdamWHost, ChunkedEqualsPerRangeLoopBitForBitAtAnyThreadCount) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  const int default_threads = omp_get_max_threads();
  for (int threads : {1, 2, 3, 7}) {
    omp_set_num_threads(threads);
    HostShards ref = make_host_shards(spec, specs, 5, kPad), got = make_host_shards(spec, specs, 5, kPad);
    optim::AdamW adamw(got.views, spec, exempt_config(), nullptr);
    ASSERT_EQ(adamw.device(), DeviceKind::Cpu);
    PerRangeAdamW old(adamw, ref.views);
    for (int step = 0; step < 5; ++step) {
      fill_grads(ref.grad, specs, step);
      fill_grads(got.grad, specs, step);
      old.step(ref.views, lr_at(step), scale_at(step));
      adamw.step(got.views, lr_at(step), scale_at(step));
      for (size_t i = 0; i < specs.size(); ++i) {
        ASSERT_TRUE(same_bits(got.param[i], ref.param[i])) << threads << " threads, step " << step << ", shard " << i;
        ASSERT_TRUE(same_bits(state_of(adamw, i, optim::OptimState::ExpAvg), old.m[i]))
            << threads << " threads, shard " << i;
        ASSERT_TRUE(same_bits(state_of(adamw, i, optim::OptimState::ExpAvgSq), old.v[i]))
            << threads << " threads, shard " << i;
      }
    }
    EXPECT_EQ(adamw.steps(), 5);
    expect_padding(specs, got, adamw);
  }
  omp_set_num_threads(default_threads);
}

// AdamW written out in double, element by element, from the formulas (not from either loop), under each
// weight-decay scope.
class AdamWHostScopes : public ::testing::TestWithParam<optim::DecayScope> {};
INSTANTIATE_TEST_SUITE_P(Scopes, AdamWHostScopes,
                         ::testing::Values(optim::DecayScope::All, optim::DecayScope::ExemptNorms,
                                           optim::DecayScope::ExemptNormsAndEmbeddings),
                         [](const auto& info) { return std::string(optim::decay_scope_name(info.param)); });

TEST_P(AdamWHostScopes, MatchesADoublePrecisionReference) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  optim::AdamWConfig cfg = exempt_config();
  cfg.decay = GetParam();
  EXPECT_EQ(optim::parse_decay_scope(optim::decay_scope_name(cfg.decay)), cfg.decay);
  // Which module classes decay, from the scope's definition.
  auto decays = [&](model::ModuleClass cls) {
    if (cfg.decay == optim::DecayScope::All) return true;
    if (cls == model::ModuleClass::RMSNorm) return false;
    return !(cfg.decay == optim::DecayScope::ExemptNormsAndEmbeddings && cls == model::ModuleClass::Embedding);
  };
  HostShards got = make_host_shards(spec, specs, 11, kPad);
  optim::AdamW adamw(got.views, spec, cfg, nullptr);
  std::vector<std::vector<double>> p, m, v;
  for (size_t i = 0; i < specs.size(); ++i) {
    p.emplace_back(got.param[i].begin(), got.param[i].end());
    m.emplace_back(got.param[i].size(), 0.0);
    v.emplace_back(got.param[i].size(), 0.0);
  }
  const int steps = 6;
  for (int step = 0; step < steps; ++step) {
    fill_grads(got.grad, specs, step);
    const double lr = lr_at(step), gs = scale_at(step), t = step + 1;
    for (size_t i = 0; i < specs.size(); ++i) {
      for (const RangeSpec& r : specs[i].ranges) {
        const bool decay = decays(r.cls);
        for (int64_t k = r.begin; k < r.end; ++k) {
          const auto u = static_cast<size_t>(k);
          const double g = static_cast<double>(got.grad[i][u]) * gs;
          m[i][u] = cfg.beta1 * m[i][u] + (1 - cfg.beta1) * g;
          v[i][u] = cfg.beta2 * v[i][u] + (1 - cfg.beta2) * g * g;
          const double mhat = m[i][u] / (1 - std::pow(cfg.beta1, t)), vhat = v[i][u] / (1 - std::pow(cfg.beta2, t));
          p[i][u] = p[i][u] * (decay ? 1 - lr * cfg.weight_decay : 1.0) - lr * mhat / (std::sqrt(vhat) + cfg.eps);
        }
      }
    }
    adamw.step(got.views, lr, gs);
  }
  // Relative 1e-6, with an absolute floor of 1e-6 of the largest magnitude (values that cancel to near 0).
  auto expect_close = [](const char* what, size_t shard, const std::vector<float>& a, const std::vector<double>& want) {
    double maxabs = 0;
    for (double w : want) maxabs = std::max(maxabs, std::abs(w));
    double worst = 0;
    size_t worst_k = 0;
    for (size_t k = 0; k < want.size(); ++k) {
      const double excess = std::abs(a[k] - want[k]) - (1e-6 * std::abs(want[k]) + 1e-6 * maxabs);
      if (k == 0 || excess > worst) worst = excess, worst_k = k;
    }
    EXPECT_LE(worst, 0.0) << what << " shard " << shard << " element " << worst_k << ": got " << a[worst_k] << ", want "
                          << want[worst_k];
  };
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].numel == 0) continue;
    expect_close("param", i, got.param[i], p[i]);
    expect_close("exp_avg", i, state_of(adamw, i, optim::OptimState::ExpAvg), m[i]);
    expect_close("exp_avg_sq", i, state_of(adamw, i, optim::OptimState::ExpAvgSq), v[i]);
  }
  expect_padding(specs, got, adamw);
}

TEST(AdamWHost, StatesRoundTripAndResumeExactly) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards a = make_host_shards(spec, specs, 21, kPad);
  optim::AdamW first(a.views, spec, exempt_config(), nullptr);
  for (int step = 0; step < 2; ++step) {
    fill_grads(a.grad, specs, step);
    first.step(a.views, lr_at(step), scale_at(step));
  }
  // A second optimizer on a copy of the parameters takes the states through read_state / write_state.
  HostShards b = make_host_shards(spec, specs, 21, kPad);
  for (size_t i = 0; i < specs.size(); ++i) b.param[i] = a.param[i];
  optim::AdamW second(b.views, spec, exempt_config(), nullptr);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (optim::OptimState which : {optim::OptimState::ExpAvg, optim::OptimState::ExpAvgSq}) {
      const std::vector<float> s = state_of(first, i, which);
      second.write_state(i, which, s);
      EXPECT_TRUE(same_bits(state_of(second, i, which), s)) << "shard " << i;
    }
  }
  second.set_steps(first.steps());
  for (int step = 2; step < 4; ++step) {
    fill_grads(a.grad, specs, step);
    fill_grads(b.grad, specs, step);
    first.step(a.views, lr_at(step), scale_at(step));
    second.step(b.views, lr_at(step), scale_at(step));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_TRUE(same_bits(a.param[i], b.param[i])) << "shard " << i;
    EXPECT_TRUE(
        same_bits(state_of(first, i, optim::OptimState::ExpAvgSq), state_of(second, i, optim::OptimState::ExpAvgSq)));
  }
  // Nonzero states were written and moved the update: the states are not all zero.
  const std::vector<float> m1 = state_of(first, 1, optim::OptimState::ExpAvg);
  EXPECT_NE(m1[100], 0.0f);

  std::vector<float> wrong(static_cast<size_t>(specs[0].numel + 1));
  EXPECT_THROW(first.read_state(0, optim::OptimState::ExpAvg, wrong), InternalError);
  EXPECT_THROW(first.write_state(0, optim::OptimState::ExpAvg, wrong), InternalError);
  EXPECT_THROW(first.read_state(specs.size(), optim::OptimState::ExpAvg, wrong), InternalError);
}

// step_async: the same bits as step, shard by shard as each is announced done; mixed with step (which
// waits for the update in flight); the states read through read_state (which waits too); an update still
// running when the optimizer is destroyed finishes first.
TEST(AdamWHost, StepAsyncGivesStepsBitsShardByShard) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards ref = make_host_shards(spec, specs, 8, kPad), got = make_host_shards(spec, specs, 8, kPad);
  optim::AdamW sync(ref.views, spec, exempt_config(), nullptr);
  {
    optim::AdamW async(got.views, spec, exempt_config(), nullptr);
    async.wait();  // nothing in flight yet: returns at once
    for (int step = 0; step < 6; ++step) {
      fill_grads(ref.grad, specs, step);
      fill_grads(got.grad, specs, step);  // the previous update is finished: wait() at the end of the last step
      sync.step(ref.views, lr_at(step), scale_at(step));
      if (step == 3) {
        async.step(got.views, lr_at(step), scale_at(step));
      } else {
        async.step_async(got.views, lr_at(step), scale_at(step));
      }
      EXPECT_EQ(async.steps(), step + 1);
      for (size_t i = 0; i < specs.size(); ++i) {
        async.wait_shard(static_cast<int>(i));
        ASSERT_TRUE(same_bits(got.param[i], ref.param[i])) << "step " << step << ", shard " << i;
      }
      for (size_t i = 0; i < specs.size(); ++i) {
        ASSERT_TRUE(same_bits(state_of(async, i, optim::OptimState::ExpAvg), state_of(sync, i, optim::OptimState::ExpAvg)));
        ASSERT_TRUE(
            same_bits(state_of(async, i, optim::OptimState::ExpAvgSq), state_of(sync, i, optim::OptimState::ExpAvgSq)));
      }
      async.wait();
    }
    expect_padding(specs, got, async);
    // The last update is left running: the destructor waits for it.
    fill_grads(ref.grad, specs, 6);
    fill_grads(got.grad, specs, 6);
    sync.step(ref.views, lr_at(6), scale_at(6));
    async.step_async(got.views, lr_at(6), scale_at(6));
  }
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_TRUE(same_bits(got.param[i], ref.param[i])) << "shard " << i;
  EXPECT_THROW(sync.step_async(got.views, 1e-3, 1.0), InternalError);  // not its shards
}

// The update's OpenMP threads are the constructing thread's default (Runtime sets it to host_threads()), on
// step_async's worker thread too: a thread of its own, whose default would be the one OpenMP read off the
// process's affinity at start. Under mpirun's default one-core binding that was one thread (the first GPU
// run's offloaded step: 340 ms, against 72.5 without offload).
TEST(AdamWHost, UpdatesRunOnTheThreadCountSetWhenBuilt) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();  // shard 1: 70001 elements, enough for several threads
  HostShards ref = make_host_shards(spec, specs, 5, kPad), got = make_host_shards(spec, specs, 5, kPad);
  optim::AdamW sync(ref.views, spec, exempt_config(), nullptr);
  const int before = omp_get_max_threads();
  const int want = before + 1;  // a count OpenMP would not choose by itself
  omp_set_num_threads(want);
  optim::AdamW adamw(got.views, spec, exempt_config(), nullptr);
  omp_set_num_threads(before);
  EXPECT_EQ(adamw.threads(), want);
  EXPECT_EQ(adamw.last_update_threads(), 0);  // no update yet
  for (int step = 0; step < 2; ++step) {
    fill_grads(ref.grad, specs, step);
    fill_grads(got.grad, specs, step);
    sync.step(ref.views, lr_at(step), scale_at(step));
    if (step == 0) {
      adamw.step(got.views, lr_at(step), scale_at(step));  // this thread, whose default is `before` again
    } else {
      adamw.step_async(got.views, lr_at(step), scale_at(step));
      adamw.wait();
    }
    EXPECT_EQ(adamw.last_update_threads(), want) << "step " << step;
  }
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_TRUE(same_bits(got.param[i], ref.param[i])) << "shard " << i;
}

// take_async_times: the last update's wall time and the time callers were blocked waiting for it (CPU offload's
// step metrics), each reported once.
TEST(AdamWHost, AsyncTimesCountTheUpdateAndTheWaits) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards a = make_host_shards(spec, specs, 9, kPad);
  optim::AdamW adamw(a.views, spec, exempt_config(), nullptr);
  optim::AdamW::AsyncTimes t = adamw.take_async_times();
  EXPECT_EQ(t.update_s, 0.0);  // no update yet
  EXPECT_EQ(t.waited_s, 0.0);
  const auto delay = std::chrono::milliseconds(20);  // before each shard's part
  adamw.set_async_delay(delay);
  fill_grads(a.grad, specs, 0);
  adamw.step_async(a.views, lr_at(0), scale_at(0));
  const auto before = std::chrono::steady_clock::now();
  adamw.wait_shard(0);  // blocks for the first shard's delay, unless this thread runs late
  adamw.wait();         // and for the rest
  const double bracket = std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  t = adamw.take_async_times();
  const double all_delays = 1e-3 * static_cast<double>(delay.count() * static_cast<int64_t>(specs.size()));
  // What holds on any machine, however loaded (issue 36: bounds between two threads' clocks do not): the update
  // slept through every delay; the waits were counted inside the interval this thread spent in them.
  EXPECT_GE(t.update_s, all_delays);
  EXPECT_GE(t.waited_s, 0.0);
  EXPECT_LE(t.waited_s, bracket);
  t = adamw.take_async_times();  // reported once
  EXPECT_EQ(t.update_s, 0.0);
  EXPECT_EQ(t.waited_s, 0.0);
  // The next update is reported afresh.
  adamw.set_async_delay(std::chrono::milliseconds(0));
  fill_grads(a.grad, specs, 1);
  adamw.step_async(a.views, lr_at(1), scale_at(1));
  const auto before2 = std::chrono::steady_clock::now();
  adamw.wait();
  const double bracket2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - before2).count();
  t = adamw.take_async_times();
  EXPECT_GT(t.update_s, 0.0);
  EXPECT_GE(t.waited_s, 0.0);
  EXPECT_LE(t.waited_s, bracket2);
}

TEST(AdamWHost, RefusesShardsItWasNotBuiltFor) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards a = make_host_shards(spec, specs, 3, kPad), b = make_host_shards(spec, specs, 3, kPad);
  optim::AdamW adamw(a.views, spec, exempt_config(), nullptr);
  EXPECT_THROW(adamw.step(b.views, 1e-3, 1.0), InternalError);
  std::vector<fsdp::ShardView> fewer(a.views.begin(), a.views.end() - 1);
  EXPECT_THROW(adamw.step(fewer, 1e-3, 1.0), InternalError);
  EXPECT_EQ(adamw.steps(), 0);
  std::vector<fsdp::ShardView> bad = a.views;
  bad[0].ranges.push_back({0, 30, 40, 0});  // past the shard's 37 elements
  EXPECT_THROW(optim::AdamW(bad, spec, exempt_config(), nullptr), InternalError);
}

// The FSDP engine's gradient shards in activation memory have no memory before the first backward and may move
// between steps (fsdp/grad_placement.hpp): the optimizer follows them, with the bits of one that never moved.
TEST(AdamWHost, FollowsGradientsThatMove) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards ref = make_host_shards(spec, specs, 4, kPad), got = make_host_shards(spec, specs, 4, kPad);
  HostShards elsewhere = make_host_shards(spec, specs, 4, kPad);  // a second home for got's gradients
  optim::AdamW fixed(ref.views, spec, exempt_config(), nullptr);
  std::vector<fsdp::ShardView> views = got.views;
  for (fsdp::ShardView& v : views) v.grad = nullptr;  // before any backward
  optim::AdamW moving(views, spec, exempt_config(), nullptr);
  EXPECT_THROW(moving.step(views, 1e-3, 1.0), InternalError);  // a shard with elements and no gradient
  EXPECT_EQ(moving.steps(), 0);
  for (int step = 0; step < 4; ++step) {
    std::vector<std::vector<float>>& home = step % 2 ? elsewhere.grad : got.grad;
    fill_grads(ref.grad, specs, step);
    fill_grads(home, specs, step);
    for (size_t i = 0; i < views.size(); ++i) views[i].grad = home[i].data();
    fixed.step(ref.views, lr_at(step), scale_at(step));
    moving.step(views, lr_at(step), scale_at(step));
    for (size_t i = 0; i < specs.size(); ++i)
      ASSERT_TRUE(same_bits(got.param[i], ref.param[i])) << "step " << step << ", shard " << i;
  }
  EXPECT_EQ(moving.steps(), 4);
}

// The update in two parts (the engine's gather-ahead between them) gives the bits of one update, with `between`
// called once, after the first shards' update and before the others'.
TEST(AdamWHost, StepSplitGivesStepsBits) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards ref = make_host_shards(spec, specs, 6, kPad), got = make_host_shards(spec, specs, 6, kPad);
  optim::AdamW whole(ref.views, spec, exempt_config(), nullptr), split(got.views, spec, exempt_config(), nullptr);
  const std::vector<int> first = {4, 0, 1};  // out of order, two runs: {0, 1} and {4}
  for (int step = 0; step < 3; ++step) {
    fill_grads(ref.grad, specs, step);
    fill_grads(got.grad, specs, step);
    whole.step(ref.views, lr_at(step), scale_at(step));
    int calls = 0;
    std::vector<bool> updated_then(specs.size());
    const std::vector<std::vector<float>> before = got.param;
    split.step_split(got.views, lr_at(step), scale_at(step), {}, first, [&] {
      ++calls;
      for (size_t i = 0; i < specs.size(); ++i) updated_then[i] = got.param[i] != before[i];
    });
    EXPECT_EQ(calls, 1);
    // When `between` ran, the first shards (those with parameters) were updated and no other one was.
    for (size_t i = 0; i < specs.size(); ++i) {
      const bool is_first = std::find(first.begin(), first.end(), static_cast<int>(i)) != first.end();
      EXPECT_EQ(updated_then[i], is_first && !specs[i].ranges.empty()) << "step " << step << ", shard " << i;
    }
    for (size_t i = 0; i < specs.size(); ++i)
      ASSERT_TRUE(same_bits(got.param[i], ref.param[i])) << "step " << step << ", shard " << i;
  }
  EXPECT_EQ(split.steps(), 3);
}

TEST(AdamWHost, LedgerCountsBothStates) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards a = make_host_shards(spec, specs, 3, kPad);
  MemoryLedger ledger;
  optim::AdamW adamw(a.views, spec, exempt_config(), &ledger);
  int64_t at_least = 0;
  for (const ShardSpec& s : specs) at_least += 2 * s.numel * 4;
  EXPECT_GE(ledger.current(MemoryCategory::OptimizerStates), at_least);
  EXPECT_LE(ledger.current(MemoryCategory::OptimizerStates), at_least + 2 * 64 * static_cast<int64_t>(specs.size()));
}

TEST(GradNormHost, SumOfSquaresAndReplicas) {
  const model::ModelSpec spec(small_config());
  const std::vector<ShardSpec> specs = odd_shard_specs();
  HostShards a = make_host_shards(spec, specs, 9, 0.0f);  // padding gradients are zero, as FSDP keeps them
  double want = 0;
  for (const auto& g : a.grad)
    for (float x : g) want += static_cast<double>(x) * x;
  ASSERT_GT(want, 0);
  EXPECT_NEAR(optim::grad_sq_sum_local(a.views), want, 1e-12 * want);
  ReplicaComm one(1, MemorySpace::Host), three(3, MemorySpace::Host);
  EXPECT_NEAR(optim::grad_norm_global(a.views, one), std::sqrt(want), 1e-12 * std::sqrt(want));
  EXPECT_NEAR(optim::grad_norm_global(a.views, three), std::sqrt(3 * want), 1e-12 * std::sqrt(want));
  EXPECT_EQ(three.traffic().calls(CollectiveKind::AllReduce), 1u);
  EXPECT_EQ(one.traffic().calls(CollectiveKind::AllReduce), 0u);
}

// The host sum of squares adds in an order fixed by the shards (blocks, lanes), not by the threads: the same
// double at 1, 2, 3 and 7 threads, and within rounding of a long-double sum. Sizes around the block and lane
// boundaries, and an empty shard.
TEST(GradNormHost, SameBitsAtAnyThreadCount) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<std::vector<float>> grads;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{16383}, int64_t{16384},
                    int64_t{16385}, int64_t{100003}}) {
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = normal(rng);
    grads.push_back(std::move(g));
  }
  std::vector<fsdp::ShardView> views(grads.size());
  long double want = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    views[i].numel = static_cast<int64_t>(grads[i].size());
    views[i].grad = grads[i].data();
    for (float x : grads[i]) want += static_cast<long double>(x) * x;
  }
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = optim::host_sum_of_squares(views);
  for (int threads : {2, 3, 7}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(optim::host_sum_of_squares(views), one) << threads << " threads";
  }
  omp_set_num_threads(before);
  EXPECT_NEAR(one, static_cast<double>(want), 1e-13 * static_cast<double>(want));
  EXPECT_EQ(optim::host_sum_of_squares({}), 0.0);
}

TEST(GradNormHost, PoisonedGradientMakesTheNormNaN) {
  const model::ModelSpec spec(small_config());
  std::vector<ShardSpec> specs = odd_shard_specs();
  specs.insert(specs.begin(), ShardSpec{0, {}});  // an empty shard first: the next one is poisoned
  HostShards a = make_host_shards(spec, specs, 9, 0.0f);
  const std::vector<std::vector<float>> before = a.grad;
  optim::poison_first_gradient(a.views);
  EXPECT_TRUE(std::isnan(a.grad[1][0]));
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t k = 0; k < a.grad[i].size(); ++k) {
      if (i == 1 && k == 0) continue;
      ASSERT_TRUE(same_bits({a.grad[i][k]}, {before[i][k]})) << "shard " << i << " element " << k;
    }
  }
  ReplicaComm one(1, MemorySpace::Host);
  EXPECT_TRUE(std::isnan(optim::grad_norm_global(a.views, one)));
}

}  // namespace
}  // namespace shardtrain::testing_optim
