// The training configuration: TOML -> resolved -> printed -> loaded round trips; the seeds' JSON and
// YAML examples load as they are; each kind of bad input gives one clear ConfigError naming the key.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/hf_configs.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/yaml_subset.hpp"

using namespace shardtrain;
using namespace shardtrain::train;

#ifndef SHARDTRAIN_SOURCE_DIR
#error "SHARDTRAIN_SOURCE_DIR must point at the repository"
#endif

namespace {

std::string repo(const std::string& rel) { return std::string(SHARDTRAIN_SOURCE_DIR) + "/" + rel; }

// The ConfigError message of `f`, or "" when nothing was thrown.
template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONFIG_ERROR(stmt, ...)                                                                                     \
  do {                                                                                                                     \
    const std::string msg_ = config_error([&] { stmt; });                                                                  \
    ASSERT_FALSE(msg_.empty()) << "expected a ConfigError from " #stmt;                                                    \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(msg_.find(part), std::string::npos) << msg_ << "\n  lacks: " << part; \
  } while (0)

TrainConfig from_text(const std::string& text) {
  TrainConfig c;
  apply_toml_text(c, text, "test.toml");
  return c;
}

}  // namespace

TEST(TrainConfig, EveryShippedConfigRoundTrips) {
  for (const char* name : {"configs/tiny-cpu.toml", "configs/llama-seed.toml", "configs/llama-1b-hybrid.toml"}) {
    SCOPED_TRACE(name);
    const TrainConfig loaded = load_train_config(repo(name));
    ASSERT_NO_THROW(loaded.validate());
    const std::string printed = to_toml(loaded);
    TrainConfig again;
    apply_toml_text(again, printed, "printed");
    EXPECT_EQ(to_toml(again), printed);
    EXPECT_TRUE(again == loaded);
  }
}

TEST(TrainConfig, SeedConfigHasTheSeedsHyperparameters) {
  const TrainConfig c = load_train_config(repo("configs/llama-seed.toml"));
  EXPECT_EQ(c.model.vocab_size, 50000);
  EXPECT_EQ(c.model.hidden_size, 768);
  EXPECT_EQ(c.model.intermediate_size, 4 * 768);
  EXPECT_EQ(c.model.num_hidden_layers, 12);
  EXPECT_EQ(c.model.num_attention_heads, 12);
  EXPECT_EQ(c.model.num_key_value_heads, 3);
  EXPECT_EQ(c.model.max_position_embeddings, 2048);
  EXPECT_EQ(c.data.seq_len, 512);
  EXPECT_EQ(c.data.global_batch_size, 64);
  EXPECT_EQ(c.data.layout, data::BatchLayout::Padded);
  EXPECT_DOUBLE_EQ(c.optim.adamw.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optim.adamw.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optim.adamw.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.max_grad_norm, 1.0);
  EXPECT_EQ(c.schedule.lr.kind, optim::ScheduleKind::WarmupCosine);
  EXPECT_EQ(c.schedule.lr.warmup_steps, 1000);
  EXPECT_DOUBLE_EQ(c.schedule.lr.warmup_start_factor, 0.1);
  EXPECT_EQ(c.schedule.epochs, 3);
  EXPECT_EQ(c.fsdp.engine.param_dtype, DType::BF16);
  EXPECT_EQ(c.fsdp.engine.reduce_dtype, DType::F32);
  EXPECT_EQ(c.logging.name, "llama-seed");
  const TrainConfig h = load_train_config(repo("configs/llama-1b-hybrid.toml"));
  EXPECT_EQ(h.fsdp.engine.strategy, ShardingStrategy::HybridShard);
  EXPECT_NO_THROW(h.validate_for_world(32, 4));
}

TEST(TrainConfig, OverridesAreTypedAndWin) {
  TrainConfig c = load_train_config(repo("configs/tiny-cpu.toml"));
  apply_override(c, "optim.lr", "3e-4");
  apply_override(c, "schedule.max_steps", "1_000");
  apply_override(c, "fsdp.strategy", "2");
  apply_override(c, "fsdp.reshard_after_forward", "false");
  apply_override(c, "fsdp.transformer_layer_cls_to_wrap", "LlamaAttention,LlamaMLP");
  apply_override(c, "data.shuffle", "false");
  EXPECT_DOUBLE_EQ(c.optim.adamw.lr, 3e-4);
  EXPECT_EQ(c.schedule.max_steps, 1000);
  EXPECT_EQ(c.fsdp.engine.strategy, ShardingStrategy::ShardGradOp);
  EXPECT_EQ(c.fsdp.engine.reshard_after_forward, false);
  EXPECT_EQ(c.fsdp.engine.wrap.transformer_layer_cls.size(), 2u);
  EXPECT_FALSE(c.data.shuffle);
  apply_override(c, "fsdp.comm_backend", "mpi");
  EXPECT_EQ(c.fsdp.comm_backend, CommBackendPreference::Mpi);
  apply_override(c, "fsdp.reshard_after_forward", "auto");
  EXPECT_FALSE(c.fsdp.engine.reshard_after_forward.has_value());
  // The printed form keeps every override.
  TrainConfig again;
  apply_toml_text(again, to_toml(c), "printed");
  EXPECT_TRUE(again == c);

  EXPECT_CONFIG_ERROR(apply_override(c, "optim.lr", "fast"), "optim.lr", "expected a number", "fast");
  EXPECT_CONFIG_ERROR(apply_override(c, "schedule.max_steps", "1.5"), "schedule.max_steps", "expected an integer");
  EXPECT_CONFIG_ERROR(apply_override(c, "optim.lrr", "1"), "unknown key 'optim.lrr'", "lr, beta1");
  EXPECT_CONFIG_ERROR(apply_override(c, "optimizer.lr", "1"), "unknown section 'optimizer'");
  EXPECT_CONFIG_ERROR(apply_override(c, "fsdp.strategy", "ZERO3"), "fsdp.strategy", "FULL_SHARD");
  EXPECT_CONFIG_ERROR(apply_override(c, "fsdp.param_dtype", "fp16"), "fsdp.param_dtype");
  EXPECT_CONFIG_ERROR(apply_override(c, "fsdp.comm_backend", "gloo"), "fsdp.comm_backend", "unknown backend 'gloo'",
                      "auto, mpi or nccl");
  EXPECT_CONFIG_ERROR(apply_override(c, "data.seq_len", "99999999999"), "data.seq_len", "does not fit");
  // Every spelling a boolean accepts is in its message.
  apply_override(c, "data.shuffle", "on");
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_CONFIG_ERROR(apply_override(c, "data.shuffle", "maybe"), "data.shuffle",
                      "expected true or false (or 1/0, yes/no, on/off), got 'maybe'");
  EXPECT_CONFIG_ERROR(apply_override(c, "fsdp.reshard_after_forward", "sometimes"), "fsdp.reshard_after_forward",
                      "expected true, false (or 1/0, yes/no, on/off) or auto, got 'sometimes'");
}

TEST(TrainConfig, BadFilesNameTheKey) {
  // Unknown key, with its line and the section's keys.
  EXPECT_CONFIG_ERROR(from_text("[optim]\nlr = 1e-3\nlearning_rate = 1e-3\n"), "test.toml:3",
                      "unknown key 'optim.learning_rate'", "lr, beta1, beta2");
  EXPECT_CONFIG_ERROR(from_text("[trainer]\nsteps = 1\n"), "test.toml:1", "unknown section [trainer]");
  EXPECT_CONFIG_ERROR(from_text("lr = 1\n"), "outside any section");
  // [[model]] is TOML's array of tables: said so, not "outside any section".
  EXPECT_CONFIG_ERROR(from_text("[[model]]\nhidden_size = 64\n"),
                      "test.toml:1: [[model]] is an array of tables, not a section; "
                      "write [model]");
  // The compute dtypes list only what they accept (the list was every storage dtype, all but two then refused).
  for (const char* key : {"fsdp.param_dtype", "fsdp.reduce_dtype"}) {
    for (const char* bad : {"fp16", "fp64", "int32", "uint8"}) {
      TrainConfig c;
      const std::string msg = config_error([&] { apply_override(c, key, bad); });
      EXPECT_NE(msg.find(fmt::format("{}: unknown or unsupported dtype '{}' (expected fp32 or bf16)", key, bad)),
                std::string::npos)
          << msg;
      EXPECT_EQ(msg.find("int64"), std::string::npos) << msg;
    }
    TrainConfig c;
    apply_override(c, key, "bfloat16");
    EXPECT_NE(to_toml(c).find("_dtype = \"bf16\""), std::string::npos);
  }
  // Wrong types.
  EXPECT_CONFIG_ERROR(from_text("[model]\nhidden_size = \"768\"\n"), "test.toml:2", "model.hidden_size",
                      "expected an integer, got a string");
  EXPECT_CONFIG_ERROR(from_text("[optim]\nlr = true\n"), "optim.lr", "expected a number, got a boolean");
  EXPECT_CONFIG_ERROR(from_text("[data]\nshuffle = 1\n"), "data.shuffle", "expected a boolean");
  EXPECT_CONFIG_ERROR(from_text("[fsdp]\ntransformer_layer_cls_to_wrap = [1]\n"), "fsdp.transformer_layer_cls_to_wrap",
                      "array of strings");
  EXPECT_CONFIG_ERROR(from_text("[fsdp]\nreshard_after_forward = \"yes\"\n"), "fsdp.reshard_after_forward", "\"auto\"");
  EXPECT_CONFIG_ERROR(from_text("[model\nx = 1\n"), "test.toml:1", "not valid TOML");
  // Impossible values: caught by the one validate().
  auto invalid = [](std::initializer_list<std::pair<const char*, const char*>> overrides) {
    TrainConfig c = from_text("[data]\npath = \"x.h5\"\n[schedule]\nmax_steps = 10\n");
    for (const auto& [k, v] : overrides) apply_override(c, k, v);
    c.validate();
  };
  EXPECT_NO_THROW(invalid({}));
  EXPECT_CONFIG_ERROR(invalid({{"model.num_attention_heads", "5"}}), "model.num_attention_heads",
                      "does not divide hidden_size");
  EXPECT_CONFIG_ERROR(invalid({{"optim.lr", "-1"}}), "optim.lr");
  EXPECT_CONFIG_ERROR(invalid({{"data.seq_len", "4096"}}), "data.seq_len", "max_position_embeddings");
  EXPECT_CONFIG_ERROR(invalid({{"schedule.max_steps", "0"}}), "never ends");
  EXPECT_CONFIG_ERROR(invalid({{"schedule.warmup_steps", "10"}}), "schedule.warmup_steps");
  EXPECT_CONFIG_ERROR(invalid({{"data.global_batch_size", "10"}, {"data.micro_batch_size", "4"}}), "data.global_batch_size",
                      "multiple");
  EXPECT_CONFIG_ERROR(invalid({{"checkpoint.state_dict_type", "LOCAL"}}), "checkpoint.state_dict_type",
                      "SHARDED_STATE_DICT");
  EXPECT_CONFIG_ERROR(invalid({{"optim.max_consecutive_nonfinite", "0"}}), "optim.max_consecutive_nonfinite");
  // Divergence: spikes and rollbacks.
  EXPECT_NO_THROW(invalid({{"optim.loss_spike_factor", "1.5"}, {"optim.loss_spike_window", "20"}}));
  EXPECT_CONFIG_ERROR(invalid({{"optim.loss_spike_factor", "0.9"}}), "optim.loss_spike_factor", "above 1");
  EXPECT_CONFIG_ERROR(invalid({{"optim.loss_spike_window", "0"}}), "optim.loss_spike_window", "1 or more");
  EXPECT_CONFIG_ERROR(invalid({{"optim.on_divergence", "retry"}}), "optim.on_divergence", "stop or rollback");
  EXPECT_CONFIG_ERROR(invalid({{"optim.on_divergence", "rollback"}}), "optim.on_divergence", "checkpoint.every_n_steps");
  EXPECT_NO_THROW(invalid({{"optim.on_divergence", "rollback"}, {"checkpoint.every_n_steps", "5"}}));
  EXPECT_CONFIG_ERROR(invalid({{"optim.max_rollbacks", "-1"}}), "optim.max_rollbacks");
  EXPECT_CONFIG_ERROR(invalid({{"optim.rollback_skip_steps", "-2"}}), "optim.rollback_skip_steps");
  EXPECT_CONFIG_ERROR(invalid({{"checkpoint.save_timeout", "-1"}}), "checkpoint.save_timeout",
                      "expected 0 (off) or seconds");
  EXPECT_CONFIG_ERROR(invalid({{"fsdp.startup_timeout", "-1"}}), "fsdp.startup_timeout", "expected 0 (off) or seconds");
  EXPECT_CONFIG_ERROR(invalid({{"checkpoint.max_failed_saves", "-1"}}), "checkpoint.max_failed_saves");
  // A generated run directory is RUNS_ROOT/NAME-TIME: "../../x" put it outside logging.runs_root.
  EXPECT_NO_THROW(invalid({{"logging.name", "llama.8b-warm"}}));
  {  // --logging.name "" is the default, the config file's stem (it made "run-TIME")
    TrainConfig named;
    named.logging.name = "llama-seed";
    apply_override(named, "logging.name", "");
    EXPECT_EQ(named.logging.name, "llama-seed");
  }
  EXPECT_CONFIG_ERROR(invalid({{"logging.name", "../../esc"}}), "logging.name", "expected a plain name", "../../esc");
  // The metrics file is appended to: a plain name in the run directory, never a path out of it or the run's own files.
  EXPECT_NO_THROW(invalid({{"logging.metrics_file", "train.jsonl"}}));
  // Nor a name the run directory's own files and folders have: "failures" (a resume once deleted the folder, and the
  // metrics with it), "checkpoints" (an I/O error, exit 8), the plots of scripts/plot-metrics.sh, a temporary of
  // config.toml, the Slurm jobs' files.
  for (const char* bad :
       {"../metrics.jsonl", "/etc/passwd", "logs/m.jsonl", "config.toml", "result.json", "..", "events.out.tfevents.1.host",
        "failures", "checkpoints", "loss.png", "throughput.png", "config.toml.tmp-42", "result.json.tmp-7", "restarts.log",
        "eval.json", "hf", "consolidate-12.out"}) {
    const std::string got = fmt::format("got '{}'", bad);
    EXPECT_CONFIG_ERROR(invalid({{"logging.metrics_file", bad}}), "logging.metrics_file",
                        "expected a file name inside the run directory", got.c_str());
  }
  {
    TrainConfig r = from_text(
        "[data]\npath = \"x.h5\"\n[schedule]\nmax_steps = 10\n[optim]\non_divergence = \"rollback\"\n"
        "rollback_skip_steps = 50\n[checkpoint]\nevery_n_steps = 5\n");
    EXPECT_EQ(r.optim.on_divergence, DivergencePolicy::Rollback);
    EXPECT_EQ(r.optim.rollback_skip_steps, 50);
    EXPECT_EQ(r.optim.max_rollbacks, 3);
    EXPECT_NE(to_toml(r).find("on_divergence = \"rollback\""), std::string::npos) << to_toml(r);
  }
  EXPECT_CONFIG_ERROR(from_text("[data]\npath = \"x.h5\"\nseq_len = -3\n[schedule]\nmax_steps = 1\n").validate(),
                      "data.seq_len", "expected 1 or more");
  // World-size mismatches, checked against the running world.
  TrainConfig w =
      from_text("[data]\npath = \"x.h5\"\nglobal_batch_size = 64\n[schedule]\nmax_steps = 1\n[fsdp]\nnum_processes = 2\n");
  EXPECT_NO_THROW(w.validate_for_world(2, 1));
  EXPECT_CONFIG_ERROR(w.validate_for_world(4, 1), "fsdp.num_processes", "expects 2 processes", "MPI started 4");
  w.fsdp.num_processes = 0;
  EXPECT_CONFIG_ERROR(w.validate_for_world(3, 1), "data.global_batch_size", "3 ranks");
  EXPECT_EQ(w.accumulation_steps_for(4), 1);
  w.data.micro_batch_size = 4;
  EXPECT_EQ(w.accumulation_steps_for(4), 4);
  // Micro-batch x world past 2^31: the product once wrapped to 0 (a division by zero, SIGFPE, at 4 ranks) or to a
  // false message (at 2); now counted in 64 bits, and named.
  w.data.micro_batch_size = w.data.global_batch_size = 1073741824;
  EXPECT_EQ(w.accumulation_steps_for(4), 0);
  EXPECT_EQ(w.accumulation_steps_for(1), 1);
  EXPECT_NO_THROW(w.validate_for_world(1, 1));
  EXPECT_CONFIG_ERROR(w.validate_for_world(4, 1),
                      "data.micro_batch_size: 1073741824 sequences per rank x 4 ranks = "
                      "4294967296 per micro-step, more than data.global_batch_size = 1073741824",
                      "at most 268435456");
  EXPECT_CONFIG_ERROR(w.validate_for_world(2, 1), "data.micro_batch_size", "x 2 ranks = 2147483648 per micro-step");
  // The loader's buffers are made at start: a bounded count of them.
  EXPECT_NO_THROW(invalid({{"data.prefetch", "1024"}}));
  EXPECT_CONFIG_ERROR(invalid({{"data.prefetch", "2147483647"}}), "data.prefetch", "expected 1 to 1024", "2147483647");
  EXPECT_CONFIG_ERROR(invalid({{"data.prefetch", "0"}}), "data.prefetch", "expected 1 to 1024");
}

// `shardtrain evaluate` validates what it reads (the model, fsdp, data, a load's deadline), not a training run's
// schedule, optimizer, checkpointing, logging or global-batch rules: each of those was its exit 3 (a --config without
// [schedule]: "the run never ends"). validate() still refuses every one of them.
TEST(TrainConfig, EvaluationValidatesOnlyWhatItReads) {
  auto with = [](std::initializer_list<std::pair<const char*, const char*>> overrides) {
    TrainConfig c = from_text("[data]\npath = \"x.h5\"\nglobal_batch_size = 16\n[schedule]\nmax_steps = 10\n");
    for (const auto& [k, v] : overrides) apply_override(c, k, v);
    return c;
  };
  const std::initializer_list<std::pair<const char*, const char*>> training_only[] = {
      {{"schedule.max_steps", "0"}},
      {{"schedule.warmup_steps", "10"}},
      {{"data.micro_batch_size", "3"}},
      {{"optim.on_divergence", "rollback"}, {"checkpoint.every_n_steps", "0"}},
      {{"optim.lr", "-1"}},
      {{"data.prefetch", "0"}},
      {{"checkpoint.keep_last", "-1"}},
      {{"logging.metrics_file", "../m.jsonl"}},
  };
  for (const auto& overrides : training_only) {
    const TrainConfig c = with(overrides);
    SCOPED_TRACE(overrides.begin()->first);
    EXPECT_NO_THROW(c.validate_for_evaluation());
    EXPECT_FALSE(config_error([&] { c.validate(); }).empty()) << "validate() must still refuse it";
  }
  EXPECT_NO_THROW(from_text("[data]\npath = \"x.h5\"\n").validate_for_evaluation());  // no run length at all
  // What evaluation uses is refused alike, by the one shared check.
  EXPECT_CONFIG_ERROR(with({{"data.seq_len", "0"}}).validate_for_evaluation(), "data.seq_len", "expected 1 or more");
  EXPECT_CONFIG_ERROR(with({{"data.seq_len", "4096"}}).validate_for_evaluation(), "data.seq_len", "max_position_embeddings");
  EXPECT_CONFIG_ERROR(with({{"model.num_attention_heads", "5"}}).validate_for_evaluation(), "model.num_attention_heads");
  EXPECT_CONFIG_ERROR(with({{"fsdp.startup_timeout", "-1"}}).validate_for_evaluation(), "fsdp.startup_timeout");
  EXPECT_CONFIG_ERROR(with({{"checkpoint.save_timeout", "-1"}}).validate_for_evaluation(), "checkpoint.save_timeout");
  // Every float key is finite (a file's `inf`): those evaluation reads, not the optimizer's.
  TrainConfig f = with({});
  f.optim.adamw.lr = std::numeric_limits<double>::infinity();
  EXPECT_NO_THROW(f.validate_for_evaluation());
  EXPECT_CONFIG_ERROR(f.validate(), "optim.lr", "expected a finite number");
  f.checkpoint.save_timeout = std::numeric_limits<double>::quiet_NaN();
  EXPECT_CONFIG_ERROR(f.validate_for_evaluation(), "checkpoint.save_timeout", "expected a finite number");
  EXPECT_CONFIG_ERROR(from_text("[data]\nseq_len = 8\n").validate_for_evaluation(), "data.path");
  // Against the world: the mesh's keys, and one sequence per rank at least; not the global batch's divisibility.
  const TrainConfig m = with({{"data.micro_batch_size", "3"}});
  EXPECT_NO_THROW(m.validate_evaluation_for_world(2, 1));
  EXPECT_CONFIG_ERROR(m.validate_for_world(2, 1), "data.global_batch_size");
  EXPECT_NO_THROW(with({}).validate_evaluation_for_world(3, 1));  // 16 over 3 ranks: 5 each, no accumulation
  EXPECT_CONFIG_ERROR(with({{"data.global_batch_size", "1"}}).validate_evaluation_for_world(2, 1), "data.global_batch_size",
                      "1 sequence(s) leave none to each of 2 ranks");
  EXPECT_CONFIG_ERROR(with({{"fsdp.num_processes", "4"}}).validate_evaluation_for_world(2, 1), "fsdp.num_processes");
}

// The run's length in steps: past what the run's int64 token count holds is refused naming the key that set it
// (it printed negative step and token counts, then `check: ok`); up to that, exact.
TEST(TrainConfig, RunLengthFitsTheTokenCount) {
  TrainConfig c = from_text("[data]\npath = \"x.h5\"\nseq_len = 128\nglobal_batch_size = 16\n[schedule]\nmax_steps = 3\n");
  const int64_t most = std::numeric_limits<int64_t>::max() / 2048;  // 4503599627370495 steps of 2048 tokens
  EXPECT_EQ(planned_steps(c, 1199), 3);
  c.schedule.max_steps = 0;
  c.schedule.max_tokens = most * 2048;  // 9223372036854773760: the most tokens a run counts
  EXPECT_EQ(planned_steps(c, 1199), most);
  c.schedule.max_tokens = 4097;  // rounded up
  EXPECT_EQ(planned_steps(c, 1199), 3);
  c.schedule.max_tokens = std::numeric_limits<int64_t>::max();
  EXPECT_CONFIG_ERROR(planned_steps(c, 1199), "schedule.max_tokens: 9223372036854775807 rounds up to 4503599627370496 steps",
                      "expected at most 9223372036854773760");
  c.schedule.max_tokens = 0;
  c.schedule.epochs = 4611686018427387904;
  EXPECT_CONFIG_ERROR(planned_steps(c, 1199), "schedule.epochs: 4611686018427387904 epochs of 1199 steps",
                      "expected at most 3756129797640");
  c.schedule.epochs = 3756129797640;
  EXPECT_EQ(planned_steps(c, 1199), 3756129797640 * 1199);
  c.schedule.max_steps = 7;  // the first limit reached wins, also beside an absurd one
  c.schedule.epochs = 4611686018427387904;
  EXPECT_EQ(planned_steps(c, 1199), 7);
  c.schedule.epochs = 0;
  c.schedule.max_steps = most + 1;
  EXPECT_CONFIG_ERROR(planned_steps(c, 1199), "schedule.max_steps: 4503599627370496 steps",
                      "expected at most 4503599627370495");
}

TEST(TrainConfig, DataMixtureOrPathButNotBoth) {
  TrainConfig c = from_text("[data]\nmixture = [\"data/web.h5:0.7\", \"data/code.h5:0.3\"]\n[schedule]\nmax_steps = 1\n");
  EXPECT_NO_THROW(c.validate());
  const auto sources = c.data.sources();
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[1].path, "data/code.h5");
  EXPECT_DOUBLE_EQ(sources[1].weight, 0.3);
  EXPECT_EQ(c.data.describe(), "a mixture of 2 datasets (data/web.h5, data/code.h5)");
  TrainConfig again;  // the printed form reads back
  apply_toml_text(again, to_toml(c), "printed");
  EXPECT_TRUE(again == c);
  // A command-line choice of one replaces the file's other.
  apply_override(c, "data.path", "data/one.h5");
  EXPECT_TRUE(c.data.mixture.empty());
  ASSERT_EQ(c.data.sources().size(), 1u);
  EXPECT_DOUBLE_EQ(c.data.sources()[0].weight, 1.0);
  apply_override(c, "data.mixture", "a.h5:1,b.h5:3");
  EXPECT_TRUE(c.data.path.empty());
  EXPECT_EQ(c.data.mixture.size(), 2u);
  // In one file, both is an error; so are a bad entry, a repeated path and neither.
  EXPECT_CONFIG_ERROR(from_text("[data]\npath = \"x.h5\"\nmixture = [\"y.h5:1\"]\n[schedule]\nmax_steps = 1\n").validate(),
                      "data.mixture", "not both");
  EXPECT_CONFIG_ERROR(from_text("[data]\nmixture = [\"y.h5:1\", \"z.h5\"]\n[schedule]\nmax_steps = 1\n").validate(),
                      "data.mixture[1]", "PATH:WEIGHT");
  EXPECT_CONFIG_ERROR(from_text("[data]\nmixture = [\"y.h5:1\", \"y.h5:2\"]\n[schedule]\nmax_steps = 1\n").validate(),
                      "data.mixture[1]", "listed twice");
  EXPECT_CONFIG_ERROR(from_text("[data]\nmixture = [\"y.h5:0\"]\n[schedule]\nmax_steps = 1\n").validate(), "data.mixture[0]",
                      "positive number");
  // One file however spelled (docs/data.md): compared as files when they exist, as normalized paths when not.
  EXPECT_CONFIG_ERROR(from_text("[data]\nmixture = [\"y.h5:1\", \"./y.h5:2\"]\n[schedule]\nmax_steps = 1\n").validate(),
                      "data.mixture[1]: ./y.h5 is the same file as data.mixture[0] (y.h5)");
  EXPECT_CONFIG_ERROR(
      from_text("[data]\nmixture = [\"d/y.h5:1\", \"d/../d/y.h5:2\"]\n[schedule]\nmax_steps = 1\n").validate(),
      "data.mixture[1]", "same file");
  {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("mixture-links-{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream((dir / "a.h5").string()) << "x";
    std::filesystem::create_symlink(dir / "a.h5", dir / "link.h5");
    const std::string a = (dir / "a.h5").string(), link = (dir / "link.h5").string();
    EXPECT_CONFIG_ERROR(
        from_text(fmt::format("[data]\nmixture = [\"{}:1\", \"{}:1\"]\n[schedule]\nmax_steps = 1\n", a, link)).validate(),
        "data.mixture[1]", "same file");
    std::filesystem::remove_all(dir);
  }
  // Each weight finite, their sum not: every share was 0 and every loss NaN.
  EXPECT_CONFIG_ERROR(
      from_text("[data]\nmixture = [\"y.h5:1e308\", \"z.h5:1e308\"]\n[schedule]\nmax_steps = 1\n").validate(),
      "data.mixture: the weights sum to inf");
  EXPECT_CONFIG_ERROR(from_text("[schedule]\nmax_steps = 1\n").validate(), "data.path", "data.mixture");
}

TEST(TrainConfig, SeedExamplesLoadAsTheyAre) {
  TrainConfig c = load_train_config(repo("configs/tiny-cpu.toml"));
  const auto notes = apply_accelerate_config(c, repo("configs/examples/accelerate_fsdp.yaml"));
  EXPECT_EQ(c.fsdp.engine.strategy, ShardingStrategy::FullShard);  // fsdp_sharding_strategy: 1
  EXPECT_TRUE(c.fsdp.engine.offload_params);
  EXPECT_EQ(c.fsdp.engine.param_dtype, DType::BF16);  // mixed_precision: bf16
  EXPECT_EQ(c.fsdp.engine.backward_prefetch, 1);      // BACKWARD_PRE
  EXPECT_EQ(c.fsdp.engine.forward_prefetch, 0);
  EXPECT_TRUE(c.fsdp.engine.sync_module_states);
  EXPECT_EQ(c.checkpoint.state_dict_type, StateDictType::Sharded);
  EXPECT_EQ(c.fsdp.num_processes, 2);
  EXPECT_EQ(c.fsdp.num_machines, 1);
  ASSERT_EQ(c.fsdp.engine.wrap.transformer_layer_cls.size(),
            1u);  // BertLayer is not a Llama module: noted, Llama's block used
  EXPECT_EQ(c.fsdp.engine.wrap.transformer_layer_cls[0], model::ModuleClass::LlamaDecoderLayer);
  bool noted = false;
  for (const auto& n : notes) noted = noted || n.find("BertLayer") != std::string::npos;
  EXPECT_TRUE(noted);
  EXPECT_NO_THROW(c.validate_for_world(2, 1));
  EXPECT_CONFIG_ERROR(c.validate_for_world(4, 1), "fsdp.num_processes");

  TrainConfig j = load_train_config(repo("configs/tiny-cpu.toml"));
  apply_fsdp_config_json(j, repo("configs/examples/fsdp_config.json"));
  EXPECT_EQ(j.fsdp.engine.reshard_after_forward, true);
  EXPECT_FALSE(j.fsdp.engine.offload_params);
  EXPECT_TRUE(j.fsdp.engine.activation_checkpointing);
  EXPECT_EQ(j.checkpoint.state_dict_type, StateDictType::Full);
  EXPECT_EQ(j.fsdp.engine.wrap.policy, fsdp::WrapPolicy::TransformerBased);
  // Both still print and load back.
  TrainConfig again;
  apply_toml_text(again, to_toml(c), "printed");
  EXPECT_TRUE(again == c);
}

TEST(TrainConfig, HfFileVariantsAndErrors) {
  TrainConfig c;
  apply_accelerate_config_text(c,
                               "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n"
                               "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1000\n"
                               "  fsdp_backward_prefetch: NO_PREFETCH\n  fsdp_transformer_layer_cls_to_wrap:\n"
                               "  - LlamaAttention\n  - LlamaMLP\nmixed_precision: 'no'  # fp32\n",
                               "acc.yaml");
  EXPECT_EQ(c.fsdp.engine.strategy, ShardingStrategy::HybridShard);
  EXPECT_EQ(c.fsdp.engine.wrap.policy, fsdp::WrapPolicy::SizeBased);
  EXPECT_EQ(c.fsdp.engine.wrap.min_num_params, 1000);
  EXPECT_EQ(c.fsdp.engine.backward_prefetch, 0);
  EXPECT_EQ(c.fsdp.engine.wrap.transformer_layer_cls.size(), 2u);
  EXPECT_EQ(c.fsdp.engine.param_dtype, DType::F32);
  for (const char* s : {"4", "5", "SHARD_GRAD_OP", "NO_SHARD"}) {
    EXPECT_NO_THROW(
        apply_accelerate_config_text(c, std::string("fsdp_config:\n  fsdp_sharding_strategy: ") + s + "\n", "a.yaml"));
  }
  EXPECT_EQ(c.fsdp.engine.strategy, ShardingStrategy::NoShard);
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "fsdp_config:\n  fsdp_sharding_strategy: 7\n", "a.yaml"), "a.yaml:2",
                      "fsdp_sharding_strategy");
  // Counts past an int: 4294967297 went in as 1, 99999999999999999999999 as -1 (strtoll's limit, then an int).
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "num_processes: 4294967297\n", "a.yaml"), "a.yaml:1: num_processes",
                      "expected 1 to 1048576 processes, got 4294967297");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "num_machines: 99999999999999999999999\n", "a.yaml"),
                      "a.yaml:1: num_machines", "expected an integer");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "distributed_type: DEEPSPEED\n", "a.yaml"), "a.yaml:1",
                      "distributed_type", "FSDP");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "mixed_precision: fp16\n", "a.yaml"), "mixed_precision", "fp16");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "fsdp_config:\n  fsdp_magic: true\n", "a.yaml"), "a.yaml:2",
                      "fsdp_magic", "unknown");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "num_processes: two\n", "a.yaml"), "num_processes", "integer");
  EXPECT_CONFIG_ERROR(apply_accelerate_config_text(c, "colour: blue\n", "a.yaml"), "colour", "unknown Accelerate option");
  // Outside the YAML subset: file:line and what was not understood.
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: &x 1\n", "y.yaml"), "y.yaml:1", "anchor");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: |\n  text\n", "y.yaml"), "y.yaml:1");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: 1\n\tb: 2\n", "y.yaml"), "y.yaml:2", "tab");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: 1\na: 2\n", "y.yaml"), "y.yaml:2", "duplicate key 'a'");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: 1\n    b: 2\n", "y.yaml"), "y.yaml:2", "indentation");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: 'open\n", "y.yaml"), "y.yaml:1", "not closed");
  EXPECT_CONFIG_ERROR(parse_yaml_subset("a: 1\n---\nb: 2\n", "y.yaml"), "y.yaml:2", "more than one document");
  const YamlNode y = parse_yaml_subset("# c\na: 'it''s' # note\nb: \"x#y\"\nc: []\nd:\n  e: [1, two]\n", "y.yaml");
  ASSERT_EQ(y.map.size(), 4u);
  EXPECT_EQ(y.map[0].second.scalar, "it's");
  EXPECT_EQ(y.map[1].second.scalar, "x#y");
  EXPECT_EQ(y.map[2].second.kind, YamlNode::Kind::List);
  EXPECT_EQ(y.map[3].second.map[0].second.list[1].scalar, "two");

  TrainConfig j;
  EXPECT_NO_THROW(apply_fsdp_config_json_text(j, R"({"fsdp_min_num_params": 5000, "auto_wrap_policy": "SIZE_BASED_WRAP",
      "transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "backward_prefetch": "BACKWARD_POST", "use_orig_params": true})",
                                              "f.json"));
  EXPECT_EQ(j.fsdp.engine.wrap.min_num_params, 5000);
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, R"({"version": 3})", "f.json"), "f.json", "version");
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, R"({"cpu_offload": "maybe"})", "f.json"), "f.json: cpu_offload",
                      "true or false");
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, R"({"sharding": 1})", "f.json"), "f.json: sharding",
                      "unknown fsdp_config option");
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, R"({"xla": true})", "f.json"), "xla");
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, "{", "f.json"), "f.json", "not valid JSON");
  // A number past a double was nlohmann's out_of_range, which only parse errors were caught for: exit 1.
  EXPECT_CONFIG_ERROR(apply_fsdp_config_json_text(j, R"({"fsdp_min_num_params": 1e400})", "f.json"), "f.json",
                      "not valid JSON", "1e400");
}
