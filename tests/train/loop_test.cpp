// The training loop on 2 ranks over a small synthetic dataset: the loss falls, metrics lines parse and
// agree with each other (tokens, tokens/s, MFU, constant FULL_SHARD traffic per step), an injected NaN
// gradient is skipped and training continues, and N non-finite steps in a row stop with ExitCode::Diverged.
// This binary has its own main (below): the tests need the Runtime that main builds after MPI_Init.
#include <gtest/gtest.h>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/trainer.hpp"

using namespace shardtrain;
namespace fs = std::filesystem;

namespace {

const Runtime* g_runtime = nullptr;  // set once in main before any test runs

int rank() { return g_runtime->topology().world_rank; }

// 60 documents of a learnable pattern over 63 ids; EOT = 63. Written by rank 0 once.
std::string dataset_path() {
  const std::string path = "train_loop_test_data.h5";
  if (rank() == 0) {
    std::vector<data::TokenId> tokens;
    std::vector<int64_t> offsets{0};
    for (int d = 0; d < 60; ++d) {
      const int len = 100 + (d * 37) % 100;
      for (int i = 0; i < len; ++i) tokens.push_back(static_cast<data::TokenId>((d % 5 + i * (1 + d % 3)) % 63));
      offsets.push_back(static_cast<int64_t>(tokens.size()));
    }
    data::DatasetInfo info;
    info.tokenizer_name = "synthetic";
    info.tokenizer_format = "tokenizer.json";
    info.tokenizer_hash = "none";
    info.vocab_size = 64;
    info.eot_id = 63;
    info.validation_fraction = 0.1;
    info.split_seed = 3;
    data::write_dataset(path, tokens, offsets, info);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

train::TrainConfig tiny_config(const std::string& run_dir) {
  train::TrainConfig c;
  c.model.vocab_size = 64;
  c.model.max_position_embeddings = 64;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 64;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.init_scheme = model::InitScheme::Scaled;
  c.optim.adamw.lr = 1e-2;
  c.schedule.lr.warmup_steps = 2;
  c.schedule.max_steps = 12;
  c.schedule.eval_every = 4;
  c.schedule.eval_batches = 2;
  c.data.path = dataset_path();
  c.data.seq_len = 32;
  c.data.micro_batch_size = 2;
  c.data.global_batch_size = 8;  // 2 ranks x 2 x 2 accumulation steps
  c.logging.run_dir = run_dir;
  c.logging.progress = ProgressStyle::Off;
  c.logging.peak_flops = 1e9;
  if (rank() == 0) fs::remove_all(run_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return c;
}

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(TrainLoop, LearnsAndWritesConsistentMetrics) {
  const train::TrainConfig c = tiny_config("train_loop_test_run_plain");
  train::Trainer t(*g_runtime, c);
  EXPECT_EQ(t.accumulation_steps(), 2);
  const train::TrainSummary s = t.run();
  EXPECT_EQ(s.steps, 12);
  EXPECT_EQ(s.tokens, 12 * 8 * 32);
  EXPECT_LT(s.last_loss, s.first_loss - 0.5) << "the loss must fall on a learnable pattern";
  EXPECT_TRUE(std::isfinite(s.last_val_loss));
  EXPECT_EQ(t.state().optimizer_steps, 12);
  if (rank() != 0) return;
  const auto lines = read_metrics(s.run_dir);
  const double fpt = train::flops_per_token(model::ModelSpec(c.model), c.data.seq_len);
  int train_lines = 0, eval_lines = 0;
  uint64_t shard_bytes = 0;
  for (const auto& j : lines) {
    if (j["kind"] == "eval") {
      ++eval_lines;
      EXPECT_EQ(j["step"].get<int>() % 4, 0);
      EXPECT_GT(j["val_tokens"].get<int64_t>(), 0);
      continue;
    }
    ++train_lines;
    const int64_t step = j["step"];
    EXPECT_EQ(step, train_lines);
    EXPECT_EQ(j["tokens"].get<int64_t>(), step * 8 * 32);
    const double tps = j["tokens_per_s"], dt = j["step_time_s"], mfu = j["mfu"];
    EXPECT_NEAR(tps * dt, 8 * 32, 1e-6 * 8 * 32);
    EXPECT_NEAR(mfu, tps * fpt / (1e9 * 2), 1e-9 * mfu + 1e-15);
    EXPECT_GT(j["peak_mem_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j["comm_bytes"]["replicate"].get<uint64_t>(), 0u);  // FULL_SHARD: a 1 x 2 mesh
    if (step == 1) shard_bytes = j["comm_bytes"]["shard"];
    EXPECT_EQ(j["comm_bytes"]["shard"].get<uint64_t>(), shard_bytes) << "FULL_SHARD moves the same bytes every step";
    EXPECT_FALSE(j["skipped"].get<bool>());
  }
  EXPECT_GT(shard_bytes, 0u);
  EXPECT_EQ(train_lines, 12);
  EXPECT_EQ(eval_lines, 3);  // steps 4, 8, 12
  EXPECT_TRUE(fs::exists(fs::path(s.run_dir) / "config.toml"));
  // The state a checkpoint stores round trips through its JSON.
  const train::TrainerState back = train::trainer_state_from_json(train::trainer_state_to_json(t.state()), "test");
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.tokens_seen, t.state().tokens_seen);
  EXPECT_EQ(back.sampler, t.state().sampler);
  EXPECT_EQ(back.sampler_samples, static_cast<int64_t>(t.state().sampler.index) * 4);  // micro 2 x 2 ranks per index
  EXPECT_EQ(train::trainer_state_from_json(R"({"step": 1, "tokens_seen": 2, "sampler": {"epoch": 0, "index": 3},
      "optimizer_steps": 1, "consecutive_nonfinite": 0, "skipped_steps": 0})", "old").sampler_samples, -1);  // before sample counts
  EXPECT_EQ(back.optimizer_steps, 12);
  EXPECT_THROW(train::trainer_state_from_json(R"({"step": 1})", "test"), CheckpointError);
}

TEST(TrainLoop, SkipsAnInjectedNanGradientAndContinues) {
  const train::TrainConfig c = tiny_config("train_loop_test_run_nan");
  train::TrainerOptions o;
  o.faults = train::FaultPlan::parse("nan_grad:3");
  train::Trainer t(*g_runtime, c, o);
  const train::TrainSummary s = t.run();
  EXPECT_EQ(s.steps, 12);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_EQ(t.state().optimizer_steps, 11);  // no update, no bias-correction step for the skipped one
  EXPECT_EQ(t.state().consecutive_nonfinite, 0);
  EXPECT_TRUE(std::isfinite(s.last_loss));
  EXPECT_LT(s.last_loss, s.first_loss - 0.5);
  if (rank() != 0) return;
  for (const auto& j : read_metrics(s.run_dir)) {
    if (j["kind"] != "train") continue;
    EXPECT_EQ(j["skipped"].get<bool>(), j["step"].get<int>() == 3) << j.dump();
    if (j["step"].get<int>() == 3) {
      EXPECT_TRUE(j["grad_norm"].is_null());
    }
  }
}

TEST(TrainLoop, StopsWithDivergedAfterNNonFiniteStepsInARow) {
  train::TrainConfig c = tiny_config("train_loop_test_run_diverge");
  c.optim.max_consecutive_nonfinite = 3;
  train::TrainerOptions o;
  o.faults = train::FaultPlan::parse("nan_grad:2,3,5,6,7");  // 2 in a row, then 3 in a row
  train::Trainer t(*g_runtime, c, o);
  std::optional<ExitCode> code;
  try {
    t.run();
  } catch (const Error& e) {
    code = e.code();
    EXPECT_NE(std::string(e.what()).find("3 steps in a row"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, ExitCode::Diverged);
  EXPECT_EQ(t.state().step, 6);  // step 7 never completed
  EXPECT_EQ(t.state().skipped_steps, 5);
  EXPECT_THROW(train::FaultPlan::parse("nan_loss:1"), UsageError);
  EXPECT_THROW(train::FaultPlan::parse("nan_grad:x"), UsageError);
  EXPECT_EQ(train::FaultPlan::parse("nan_grad:2-4,9").nan_grad_steps, (std::vector<int64_t>{2, 3, 4, 9}));
  const train::FaultPlan slow = train::FaultPlan::parse("slow_update:25; nan_grad:2");
  EXPECT_EQ(slow.slow_update_ms, 25);
  EXPECT_EQ(slow.nan_grad_steps, (std::vector<int64_t>{2}));
  EXPECT_THROW(train::FaultPlan::parse("slow_update:-3"), UsageError);
  EXPECT_THROW(train::FaultPlan::parse("slow_update:"), UsageError);
}

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  RuntimeOptions ro;
  ro.log_level = LogLevel::Warn;
  const Runtime runtime(session, ro);
  g_runtime = &runtime;
  if (session.world_rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS(), global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return global;
}
