// `bench step --ops-profile`'s profile, from a small model's forward_backward run through the timed CPU ops for three
// periods: every key the model's step makes (as a recorder of op calls records them) timed, as often as the model
// makes it, and the profile written from those times read back by load_op_profile with each key's seconds.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/model/dense_params.hpp"
#include "shardtrain/model/llama.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/timed_ops.hpp"
#include "src/cli/op_profile.hpp"
#include "src/cli/op_rows.hpp"
#include "src/cli/step_profile.hpp"

namespace shardtrain::cli {
namespace {

BenchShape small_shape() {
  BenchShape s;
  s.model.num_hidden_layers = 2, s.model.hidden_size = 64, s.model.num_attention_heads = 4;
  s.model.num_key_value_heads = 2, s.model.intermediate_size = 96, s.model.vocab_size = 50;
  s.model.max_position_embeddings = 64;
  s.batch = 2, s.seq = 12;
  s.source = "step_profile_test";
  return s;
}

// `periods` forward_backwards of the small model through `ops` (documents in the batch, as packed data has them).
void run_model(ops::Ops& ops, const BenchShape& s, int periods, ops::OpTimes* times) {
  model::LlamaModel m(s.model, ops, model::ModelOptions{.activation_dtype = DType::F32});
  model::DenseParams params(m.spec(), DType::F32, DType::F32);
  params.initialize(7);
  params.bind(m.binding());
  const int64_t n = s.batch * s.seq;
  std::vector<int32_t> ids(n), targets(n), docs(n);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>(i * 7 % 50), targets[i] = static_cast<int32_t>(i * 11 % 50);
    docs[i] = static_cast<int32_t>(i % s.seq >= 5);
  }
  model::Batch batch;
  batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {s.batch, s.seq});
  batch.targets = ops::make_tensor(targets.data(), DType::I32, {s.batch, s.seq});
  batch.document_ids = ops::make_tensor(docs.data(), DType::I32, {s.batch, s.seq});
  batch.document_runs = 2 * s.batch;
  for (int p = 0; p < periods; ++p) {
    m.forward_backward(batch, model::StepOptions{.loss_scale = 1.0});
    if (times) times->end_period();
  }
}

TEST(StepProfile, EveryKeyOfTheModelsStepTimedAndReadBackByTheLoader) {
  const BenchShape shape = small_shape();
  CallRecorder recorder;
  run_model(recorder, shape, 1, nullptr);
  std::map<std::string, int64_t> want;
  for (const ops::OpCall& c : recorder.calls) ++want[c.key];
  ASSERT_GT(want.size(), 15u);

  ops::OpTimes times;
  times.set_enabled(true);
  auto timed = ops::make_timed_ops(ops::make_cpu_ops(ops::CpuOpsOptions{1}), times);
  run_model(*timed, shape, 3, &times);
  ASSERT_EQ(times.periods(), 3);
  std::map<std::string, int64_t> got;
  std::map<std::string, double> seconds;
  for (const ops::OpTimes::Summary& s : times.summary()) {
    EXPECT_DOUBLE_EQ(s.calls_per_period, static_cast<double>(s.calls) / 3) << s.call.key;
    got[s.call.key] = s.calls / 3;
    seconds[s.call.key] = s.seconds;
  }
  EXPECT_EQ(got, want);

  // Written with 2 accumulation steps: calls per micro-batch are the step's over 2, rounded, at least 1.
  StepProfileSource source;
  source.device = "cpu";
  source.threads = 1;
  source.shape = shape;
  source.ranks = 2, source.accumulation = 2, source.steps = 3, source.warmup = 1;
  source.step_time_s = 1.0;
  source.matmul_flops_per_s = 5e10, source.copy_bytes_per_s = 1e10;
  source.matmul_n = 2048, source.copy_bytes = 1 << 20;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("step_profile_test_" + std::to_string(getpid()) + ".json")).string();
  {
    std::ofstream out(path);
    out << step_op_profile_json(times, source);
  }
  const OpTimeTable t = load_op_profile(path);
  std::remove(path.c_str());
  EXPECT_EQ(t.backend, "cpu");
  EXPECT_EQ(t.dtype, "f32");
  EXPECT_EQ(t.matmul_flops_per_s, 5e10);
  EXPECT_EQ(t.copy_bytes_per_s, 1e10);
  EXPECT_FALSE(t.keys_reconstructed);
  EXPECT_TRUE(t.rows_without_keys.empty());
  ASSERT_EQ(t.seconds.size(), want.size());
  for (const auto& [key, n] : want) {
    ASSERT_TRUE(t.seconds.count(key)) << key;
    EXPECT_DOUBLE_EQ(t.seconds.at(key), seconds.at(key)) << key;  // each row is one call: its seconds unsplit
    EXPECT_EQ(t.row_of.at(key), key);
  }
  // A memory-bound op's shortfall from the copy ceiling is carried to shapes the profile lacks.
  EXPECT_GT(t.memory_bound_scale.count("rmsnorm_forward"), 0u);
}

// The profile's own fields: calls per micro-batch from calls per step (at least 1), the per-step sum.
TEST(StepProfile, CallsPerMicroBatchAndTheStepsSum) {
  ops::OpTimes times;
  ops::OpCall gemm, norm;
  gemm.name = "matmul", gemm.key = "matmul NT m 4 n 4 k 4 f32 f32 f32", gemm.flops = 128, gemm.bytes = 192;
  norm.name = "sum_squares", norm.key = "sum_squares f32[4] f64[1]", norm.bytes = 24;
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 6; ++i) times.add(gemm, 0.5);
    times.add(norm, 0.25);
    times.end_period();
  }
  StepProfileSource source;
  source.shape = small_shape();
  source.accumulation = 4;
  source.step_time_s = 4;
  source.matmul_flops_per_s = 1, source.copy_bytes_per_s = 1;
  const nlohmann::json j = nlohmann::json::parse(step_op_profile_json(times, source));
  ASSERT_EQ(j.at("rows").size(), 2u);
  const nlohmann::json& g = j.at("rows")[0];  // by key: "matmul ..." < "sum_squares ..."
  const nlohmann::json& n = j.at("rows")[1];
  // 6 GEMMs a step over 4 micro-batches: 1.5, rounded to 2; the norm's 1 a step: 0.25, at least 1.
  EXPECT_EQ(g.at("calls_per_microbatch"), 2);
  EXPECT_EQ(g.at("calls_per_step"), 6.0);
  EXPECT_EQ(n.at("calls_per_microbatch"), 1);
  EXPECT_EQ(n.at("calls_per_step"), 1.0);
  EXPECT_EQ(g.at("kind"), "flops");
  EXPECT_EQ(g.at("work"), 128.0);
  EXPECT_EQ(n.at("kind"), "bytes");
  EXPECT_EQ(n.at("work"), 24.0);
  EXPECT_EQ(g.at("op"), gemm.key);
  EXPECT_EQ(g.at("calls"), nlohmann::json::array({{{"key", gemm.key}, {"flops", 128.0}, {"bytes", 192.0}}}));
  EXPECT_EQ(j.at("op_seconds_per_step"), 6 * 0.5 + 0.25);
  EXPECT_EQ(j.at("batch"), 2);
  EXPECT_EQ(j.at("model").at("head_dim"), 16);
}

}  // namespace
}  // namespace shardtrain::cli
