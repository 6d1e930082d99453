// The tiny training run the train tests share: a synthetic dataset of a learnable pattern, a 2-layer model's
// config around it (each test sets its own schedule, batch and strategy on top), and the tests' main.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::test {

// 60 documents of a learnable pattern over 63 ids (EOT = 63) at `path`, written by world rank 0; every rank
// returns once it exists.
inline std::string write_pattern_dataset(const std::string& path, int rank) {
  if (rank == 0) {
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

// A 2-layer model (hidden 32, 4 / 2 heads) on that dataset at seq 32, micro-batch 2, lr 1e-2 with 2 warm-up
// steps, logging into `run_dir` (emptied by rank 0 first) with no progress output and a peak no CPU step
// outruns (an outrun peak is raised: MFU never above 1).
inline train::TrainConfig tiny_train_config(const std::string& data_path, const std::string& run_dir, int rank) {
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
  c.data.path = data_path;
  c.data.seq_len = 32;
  c.data.micro_batch_size = 2;
  c.logging.run_dir = run_dir;
  c.logging.progress = ProgressStyle::Off;
  c.logging.peak_flops = 1e13;
  if (rank == 0) std::filesystem::remove_all(run_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return c;
}

// gtest's main for tests that build Trainers: the Runtime they need exists only after MPI_Init, so main owns it and
// points *runtime at it while the tests run. Rank 0 prints the report; the exit code is non-zero if any rank failed.
inline int run_tests_with_runtime(int argc, char** argv, const Runtime** runtime) {
  MpiSession session(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  RuntimeOptions ro;
  ro.log_level = LogLevel::Warn;
  const Runtime owned(session, ro);
  *runtime = &owned;
  if (session.world_rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local = RUN_ALL_TESTS(), global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  *runtime = nullptr;
  return global;
}

}  // namespace shardtrain::test
