// `shardtrain check`: a preflight of a training run, offline (no MPI, no device) and in seconds: the same
// command line as `train`, resolved and validated the same way, then everything the run reads or writes
// before its first step: the mesh and batch for an allocation, the datasets (and, with --verify-data, every
// block's checksum), the checkpoint it would resume from and whether it fits the model and the data, and
// whether its output directories can be written. Every check runs and reports, so one call names every
// problem; the exit code is the first problem's (docs/exit-codes.md). Job scripts run it before the ranks
// start and submit.sh before the job is queued (docs/cluster.md, "Preflight").
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "command.hpp"
#include "config_args.hpp"
#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/preflight.hpp"
#include "shardtrain/train/run_dir.hpp"
#include "shardtrain/train/step_memory.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::cli {
namespace {

namespace fs = std::filesystem;

struct CheckOptions {
  ConfigArgs args;
  int nodes = 1;
  int gpus_per_node = 0;  // 0: the allocation is not known (submit time): the mesh is not checked
  bool verify_data = false;
  bool verify_checkpoint = false;
  bool data_pending = false;  // the datasets are made by a job queued before the run: not there yet
  std::string gpu_memory;     // "": the memory is not checked
};

// Where each check's question comes in `train`'s start (cmd_train.cpp, then the Trainer and CheckpointHooks::on_start):
// of several problems, the run stops on the one it meets first, so check's exit code and closing line are that one's,
// whatever order the report lists them in.
enum class Stage {
  Config,         // resolving and validating the command line
  RunDirLook,     // a named logging.run_dir looked into (check_run_dir)
  Memory,         // the model and a step against the memory (check_model_fits, check_step_memory)
  World,          // validate_for_world
  Data,           // open_data_sources
  RunLength,      // check_run_length
  CheckpointDir,  // the checkpoint directory claimed: made, probed, locked
  RunDirMade,     // the run directory (or logging.runs_root) made
  Resume,         // on_start: a fresh run beside checkpoints, the resume, checkpoint.init_from
  Reading,        // met only once the steps read it (a damaged data block) or save (no room for a checkpoint)
};

// One line per check: "  data        ok: ...", "  resume      note: ...", "  outputs     FAILED: ...".
class Report {
 public:
  void ok(const char* what, const std::string& text) { line(what, "ok", text); }
  void note(const char* what, const std::string& text) { line(what, "note", text); }
  void failed(const char* what, Stage stage, const std::exception& e, ExitCode code) {
    const std::string text = fmt::format("{}: {}", exit_code_name(code), e.what());
    line(what, "FAILED", text);
    if (problems_++ == 0 || stage < first_stage_) {
      first_ = code;
      first_stage_ = stage;
      first_text_ = text;
    }
  }
  // Runs one check; an exception is its failure (the run would have stopped with it). Returns success.
  template <class F>
  bool run(const char* what, Stage stage, F&& check) {
    try {
      check();
      return true;
    } catch (const Error& e) {
      failed(what, stage, e, e.code());
    } catch (const std::exception& e) {
      failed(what, stage, e, ExitCode::Internal);
    }
    return false;
  }
  int problems() const { return problems_; }
  ExitCode first() const { return first_; }
  // The line the run would stop with ("data error: ..."), as `train` logs it.
  const std::string& first_text() const { return first_text_; }

 private:
  static void line(const char* what, const char* verdict, const std::string& text) {
    std::printf("  %-10s %s: %s\n", what, verdict, text.c_str());
    std::fflush(stdout);
  }
  int problems_ = 0;
  ExitCode first_ = ExitCode::Ok;
  Stage first_stage_ = Stage::Config;
  std::string first_text_;
};

std::string count(double n) {
  return n >= 1e9 ? fmt::format("{:.2f}B", n / 1e9) : n >= 1e6 ? fmt::format("{:.2f}M", n / 1e6) : fmt::format("{:.0f}", n);
}

int run_check(CheckOptions o) {
  Report report;
  std::vector<std::string> notes;
  std::string source;
  train::TrainConfig c;
  const double gpu_memory = o.gpu_memory.empty() ? 0.0 : parse_gpu_memory(o.gpu_memory);  // a usage error first
  std::printf("check: %s\n", o.args.config.c_str());
  if (!report.run("config", Stage::Config, [&] { c = o.args.resolve(notes, source); })) {
    log::error("check: the config does not resolve; nothing else was checked");
    return static_cast<int>(report.first());
  }
  for (const auto& n : notes) report.note("config", n);
  report.run("config", Stage::Config, [&] {
    const model::ModelSpec spec(c.model);
    report.ok("config",
              fmt::format("{}: model {} parameters ({} layers, hidden {}), {}, seq_len {}, global batch {}", source,
                          count(static_cast<double>(spec.num_params())), c.model.num_hidden_layers, c.model.hidden_size,
                          sharding_strategy_name(c.fsdp.engine.strategy), c.data.seq_len, c.data.global_batch_size));
  });

  // The mesh and batch of the allocation, when it is known; the data checks below count for its world size. Without
  // --gpus-per-node, the world an Accelerate or Transformers file names (fsdp.num_processes over fsdp.num_machines), as
  // `plan` and the run take it: 7 processes and a global batch of 12 said "check: ok", and the run refused them.
  int world = 1;
  bool world_ok = false;
  if (o.gpus_per_node == 0 && c.fsdp.num_processes > 0) {
    const int nodes = std::max(1, c.fsdp.num_machines);
    if (c.fsdp.num_processes % nodes == 0) {
      o.nodes = nodes;
      o.gpus_per_node = c.fsdp.num_processes / nodes;
      report.note("world", fmt::format("from fsdp.num_processes {} and fsdp.num_machines {}", c.fsdp.num_processes,
                                       c.fsdp.num_machines));
    } else {  // nodes of unequal sizes: the batch over the world, the mesh not (it needs ranks per node)
      world = c.fsdp.num_processes;
      report.run("world", Stage::World, [&] {
        c.validate_for_world(c.fsdp.num_processes, nodes);
        report.ok("world", fmt::format("{} ranks on {} nodes (fsdp.num_processes, fsdp.num_machines; not as many on each: "
                                       "the mesh is not checked, give --nodes and --gpus-per-node for it)",
                                       c.fsdp.num_processes, nodes));
      });
    }
  }
  if (o.gpus_per_node > 0) {
    world = world_size_of(o.nodes, o.gpus_per_node);
    world_ok = report.run("world", Stage::World, [&] {
      // The mesh as the trainer builds it (DeviceMesh): a hybrid shard size that does not divide the world
      // or cross nodes is refused here, with the trainer's message.
      const MeshLayout mesh = make_mesh_layout({c.fsdp.engine.strategy, c.fsdp.engine.shard_size}, world, o.gpus_per_node);
      c.validate_for_world(world, o.nodes);
      report.ok(
          "world",
          fmt::format(
              "{} node(s) x {} ranks, mesh {}: micro-batch {} x {} accumulation step(s) per rank = {} sequences per step",
              o.nodes, o.gpus_per_node, mesh.describe(), c.micro_batch_size_for(world), c.accumulation_steps_for(world),
              c.data.global_batch_size));
    });
  } else if (world == 1) {
    report.note("world", "not checked (give --nodes and --gpus-per-node for an allocation)");
  }
  // What each GPU will hold, by `shardtrain plan`'s accounting (fsdp::estimate_memory, which the engine's
  // ledger is tested against), against --gpu-memory: an out-of-memory found now, not after the queue wait.
  if (world_ok && gpu_memory > 0) {
    report.run("memory", Stage::Memory, [&] {
      // First what the run itself refuses at its start, by its own functions and in its words (the GPU named as
      // --gpu-memory): the model's state, then a step's lower bound. The nodes' host memory (the loaders, an
      // offloaded state) is not known here.
      const std::string gpu_name = fmt::format("--gpu-memory {}", o.gpu_memory);
      check_model_fits(c, world, o.gpus_per_node, gpu_memory, gpu_name);
      train::RankMemory rank;
      rank.world = world;
      rank.local_size = o.gpus_per_node;
      rank.gpu = gpu_memory;
      rank.gpu_name = gpu_name;
      rank.host = std::numeric_limits<double>::infinity();
      train::check_step_memory(c, rank);
      // Then plan's fuller estimate (with the ops' scratch), which the run's start check leaves out: past it, the run
      // starts and runs out of memory in its first step.
      const model::ModelSpec spec(c.model);
      const fsdp::FsdpConfig f = train::engine_config(c, world);
      const int64_t micro = c.micro_batch_size_for(world);
      const fsdp::MemoryEstimate m =
          fsdp::estimate_memory(spec, f, fsdp::plan_fsdp(spec, f, world, o.gpus_per_node), micro, c.data.seq_len);
      const auto gib = [](double bytes) { return bytes / static_cast<double>(1ull << 30); };
      const std::string parts = fmt::format(
          "sharded state {:.2f}{}, gathered parameters and gradients {:.2f}, activations {:.2f} (micro-batch {} x {}), op scratch "
          "{:.2f} GiB",
          gib(m.state), f.offload_params ? " in host memory" : "", gib(m.buffers), gib(m.activations), micro, c.data.seq_len,
          gib(m.op_scratch));
      if (m.device > gpu_memory) {
        std::vector<std::string> options;
        if (!f.activation_checkpointing) options.emplace_back("fsdp.activation_checkpointing = true");
        if (micro > 1) options.emplace_back("a smaller data.micro_batch_size");
        if (!f.offload_params) options.emplace_back("fsdp.offload_params = true");
        options.emplace_back("more GPUs");
        std::string advice;
        for (size_t k = 0; k < options.size(); ++k)
          advice += (k ? k + 1 == options.size() ? " or " : ", " : "") + options[k];
        throw ConfigError(fmt::format(
            "about {:.2f} GiB per GPU ({}), more than --gpu-memory {:.4g} GiB: the run would start (its own check "
            "leaves the op scratch out) and run out of device memory in its first step; try {} (`shardtrain plan` "
            "compares the strategies)",
            gib(m.device), parts, gib(gpu_memory), advice));
      }
      report.ok("memory", fmt::format("about {:.2f} of {:.4g} GiB per GPU: {}", gib(m.device), gib(gpu_memory), parts));
    });
  } else if (gpu_memory > 0) {
    report.note("memory", "not checked (--gpu-memory needs --nodes and --gpus-per-node, and a mesh that fits them)");
  } else if (world_ok) {
    report.note("memory",
                "not checked (give --gpu-memory): the run refuses (3) a model or step that does not fit its "
                "GPU's share, or the node's host memory on the CPU backend, which check cannot see");
  }

  // The datasets and what the run makes of them.
  std::vector<data::MixtureComponent> sources;
  int64_t total_steps = 0;
  bool data_ok = false;
  std::optional<ConfigError> length_error;  // the run's length or rollback skip, refused: its own line below
  if (o.data_pending) {
    report.note("data", fmt::format("{}: not checked: a job queued before the run makes it (--data-pending); the run "
                                    "checks it when it starts",
                                    c.data.describe()));
  } else {
    data_ok = report.run("data", Stage::Data, [&] {
      sources = train::open_data_sources(c);
      const data::MixedSource mix(sources, data::DatasetSplit::Train, c.data.layout, c.data.seq_len, c.data.seed,
                                  c.data.shuffle);
      mix.require_global_batch(c.data.global_batch_size);
      const int64_t per_epoch =
          static_cast<int64_t>(mix.num_samples() / static_cast<size_t>(c.data.global_batch_size));  // drop_last
      std::string length;
      try {  // the trainer's own check, before it makes anything
        total_steps = train::check_run_length(c, sources);
        const double tokens = static_cast<double>(total_steps) * c.data.global_batch_size * c.data.seq_len;
        length = fmt::format("; the run: {} steps, {} tokens, {:.3g} epochs", total_steps, count(tokens),
                             static_cast<double>(total_steps) / static_cast<double>(per_epoch));
      } catch (const ConfigError& e) {
        length_error = e;
      }
      report.ok("data",
                fmt::format("{}: {} training samples ({}, seq_len {}) = {} steps per epoch{}", c.data.describe(),
                            mix.num_samples(), data::batch_layout_name(c.data.layout), c.data.seq_len, per_epoch, length));
      if (mix.size() > 1)
        for (size_t k = 0; k < mix.size(); ++k)
          report.note("data", fmt::format("{}: {}", mix.dataset(k).path(), mix.share(k)));
    });
  }
  if (length_error) report.run("schedule", Stage::RunLength, [&] { throw *length_error; });
  if (data_ok && c.schedule.eval_batches > 0) {
    // As the trainer decides: a source whose validation split holds less than one evaluation batch
    // (micro-batch x world) has no validation loss. Said, not failed: the run goes on without it.
    int64_t eval_batch = c.data.global_batch_size;
    if (const int accumulation = c.accumulation_steps_for(world); accumulation > 0)
      eval_batch /= accumulation;  // 0: a micro-batch x world past the global batch (the world check said so)
    for (const auto& s : sources) {
      size_t samples = 0;
      try {
        samples =
            data::SampleSource(*s.dataset, data::DatasetSplit::Validation, c.data.layout, c.data.seq_len).num_samples();
      } catch (const DataError&) {
      }
      if (samples < static_cast<size_t>(eval_batch))
        report.note(
            "validation",
            fmt::format("{}: {} validation samples, fewer than one evaluation batch of {}: no validation loss from it",
                        s.dataset->path(), samples, eval_batch));
      else
        report.ok(
            "validation",
            fmt::format("{}: {} samples, {} evaluation batch(es) of {}", s.dataset->path(), samples,
                        std::min<int64_t>(c.schedule.eval_batches, static_cast<int64_t>(samples) / eval_batch), eval_batch));
    }
  }
  if (data_ok && o.verify_data) {
    for (const auto& s : sources)
      report.run("verify", Stage::Reading, [&] {
        const uint64_t blocks = data::verify_dataset(*s.dataset, false);
        report.ok("verify", fmt::format("{}: {} checksum block(s) read, every id below {}", s.dataset->path(), blocks,
                                        s.dataset->info().vocab_size));
      });
  }

  // The checkpoint the run would resume from, read as the run would: complete, this model, this tokenizer.
  const std::string& run_dir = c.logging.run_dir;
  const std::string ckpt_dir =
      c.checkpoint.dir.empty() && run_dir.empty() ? std::string() : train::checkpoint_dir_for(c, run_dir);
  // Another run holding the directory, and checkpoints this run would mix its saves with, stop the run at its start
  // (train::CheckpointDirClaim): said here the same way.
  if (!ckpt_dir.empty()) {
    report.run("resume", Stage::CheckpointDir, [&] {
      const std::string holder = train::checkpoint_dir_holder(ckpt_dir);
      if (!holder.empty()) throw CheckpointError(train::dir_in_use_problem(ckpt_dir, holder));
    });
  }
  bool resumes = false;  // a checkpoint is loaded: checkpoint.init_from is not read
  const bool resume_ok = report.run("resume", Stage::Resume, [&] {
    if (c.checkpoint.resume.empty()) {
      const std::string problem = ckpt_dir.empty() ? std::string() : train::fresh_run_problem(ckpt_dir);
      if (!problem.empty()) throw CheckpointError(problem);
      report.ok("resume", "off (checkpoint.resume is empty): the run starts at step 0");
      return;
    }
    if (ckpt_dir.empty() && c.checkpoint.resume == "auto") {
      report.ok("resume",
                "auto, in a new run directory (logging.run_dir and checkpoint.dir are empty): the run starts at step 0");
      return;
    }
    const bool fall_back = c.checkpoint.resume == "auto";
    std::vector<std::string> candidates;  // newest first: `auto` passes over damaged ones, as the run does
    if (fall_back) {
      const auto all = checkpoint::complete_checkpoints(ckpt_dir);
      for (auto it = all.rbegin(); it != all.rend(); ++it) candidates.push_back(it->second);
    } else {
      candidates.push_back(train::resolve_resume_path(c.checkpoint.resume, ckpt_dir));
    }
    if (candidates.empty()) {
      report.ok("resume", fmt::format("auto: no complete checkpoint in {} yet: the run starts at step 0", ckpt_dir));
      return;
    }
    std::unique_ptr<checkpoint::CheckpointReader> opened;
    std::string path;
    train::TrainerState state;
    std::vector<std::string> damaged, errors;
    for (const std::string& candidate : candidates) {
      try {
        auto reader = std::make_unique<checkpoint::CheckpointReader>(candidate);
        // In the run's order (load_for_resume): the tokenizer, then the model (checkpoint::load).
        if (!sources.empty()) train::check_resume_tokenizer(*reader, *sources.front().dataset);
        checkpoint::check_same_model(reader->model_config(), c.model, candidate);
        try {
          state = train::trainer_state_from_json(reader->trainer_state(), candidate);
        } catch (const CheckpointError& e) {
          throw checkpoint::CheckpointDamaged(e.what());
        }
        if (o.verify_checkpoint) {
          const int64_t n = reader->verify_checksums();
          report.ok("resume", fmt::format("{}: {} elements read, every chunk's checksum verified", candidate, n));
        }
        opened = std::move(reader);
        path = candidate;
        break;
      } catch (const checkpoint::CheckpointDamaged& e) {
        if (!fall_back) throw;
        report.note("resume", fmt::format("{} is damaged: the run would set it aside (.damaged) and try the one before "
                                          "it: {}",
                                          candidate, e.what()));
        damaged.push_back(candidate);
        errors.emplace_back(e.what());
      }
    }
    if (!opened) throw checkpoint::CheckpointDamaged(train::no_checkpoint_loads_problem(ckpt_dir, errors));
    resumes = true;
    checkpoint::CheckpointReader& reader = *opened;
    if (!damaged.empty())
      report.note("resume", fmt::format("the run would resume from {}, the newest that loads, and train the steps after it "
                                        "again",
                                        path));
    if (!fall_back)
      for (const std::string& newer : train::checkpoints_beside(ckpt_dir, state.step, path))
        report.note(
            "resume",
            fmt::format("{} is {} the checkpoint resumed from: the run would set it aside as {}.superseded "
                        "(renamed, not deleted), so that its saves do not mix with it",
                        newer, train::resumes_from_outside(ckpt_dir, path) ? "beside, and not part of," : "newer than",
                        newer));
    std::string left =
        total_steps > 0 ? fmt::format("; {} of {} steps left", std::max<int64_t>(0, total_steps - state.step), total_steps)
                        : std::string();
    report.ok(
        "resume",
        fmt::format("{}: step {}, {} tokens seen, {}{}", path, state.step, count(static_cast<double>(state.tokens_seen)),
                    reader.has_optimizer() ? "with the AdamW states"
                                           : "weights only (a full checkpoint saved before 2026-11-29: AdamW starts over)",
                    left));
    if (total_steps > 0 && state.step >= total_steps)
      report.note("resume", fmt::format("the run has taken its {} steps already: it would save nothing new and stop at once "
                                        "(raise schedule.max_steps to train on)",
                                        total_steps));
    if (!sources.empty()) {
      const std::string change = train::resume_data_change(reader, c, sources);
      if (!change.empty()) report.note("resume", change);
      const std::string schedule = train::resume_schedule_change(reader, c, sources, total_steps, state.step);
      if (!schedule.empty()) report.note("resume", schedule);
      const std::string optimizer = reader.has_optimizer() ? train::resume_optimizer_change(reader, c) : std::string();
      if (!optimizer.empty()) report.note("resume", optimizer);
    }
  });

  // checkpoint.init_from, when no checkpoint is resumed: opened and vetted as the run imports it (preflight.hpp).
  if (resume_ok && !resumes && !c.checkpoint.init_from.empty()) {
    report.run("init_from", Stage::Resume, [&] {
      const auto weights = train::open_init_from(c, sources.empty() ? nullptr : sources.front().dataset.get());
      checkpoint::check_source_tensors(model::ModelSpec(c.model), *weights);  // as the run's import begins
      report.ok("init_from", fmt::format("{}: this model's weights{}", weights->path(),
                                         weights->step() >= 0 ? fmt::format(" (step {})", weights->step()) : std::string()));
    });
  }

  // What a checkpoint takes, as a save of the run's mesh computes it (checkpoint::checkpoint_size, also what `train`
  // logs at its start): a sharded one has a rank file per shard rank, so the world counts; without it, one rank's.
  const bool sharded = c.checkpoint.state_dict_type == train::StateDictType::Sharded;
  std::optional<checkpoint::CheckpointSize> ckpt_size;
  if (c.checkpoint.every_n_steps > 0) {
    report.run("space", Stage::Reading, [&] {
      const model::ModelSpec spec(c.model);
      const int ranks = world_ok ? world : 1;
      const fsdp::FsdpPlan plan =
          fsdp::plan_fsdp(spec, train::engine_config(c, ranks), ranks, world_ok ? o.gpus_per_node : 1);
      ckpt_size = checkpoint::checkpoint_size(spec, plan, c.checkpoint.state_dict_type);
    });
  }

  // Where the run writes, probed as the run makes it (preflight.hpp) and in its order: nothing is created here. Then
  // the inodes of what it makes there at its start, which the probe (one inode, given back) does not show.
  std::vector<train::InodeNeed> inodes;
  const auto exists = [](const fs::path& p) {
    std::error_code ec;
    return fs::exists(fs::symlink_status(p, ec));
  };
  const bool looked_ok = run_dir.empty() ||  // not a directory; a config.toml or result.json the run would replace
                         report.run("outputs", Stage::RunDirLook, [&] { train::check_run_dir(c, run_dir); });
  const bool ckpt_ok = ckpt_dir.empty() || report.run("outputs", Stage::CheckpointDir, [&] {
    train::require_writable_dir("checkpoint.dir", ckpt_dir, train::DirProbe::LookOnly);
    train::InodeNeed need{"checkpoint.dir", ckpt_dir, 0, ""};
    std::vector<std::string> what;
    if (!exists(fs::path(ckpt_dir) / ".shardtrain.lock")) {
      ++need.files;
      what.emplace_back("its lock file");
    }
    if (ckpt_size) {
      need.files += ckpt_size->inodes;
      what.push_back(fmt::format("a checkpoint's {} inodes", ckpt_size->inodes));
    }
    need.what = fmt::format("{}", fmt::join(what, " and "));
    if (need.files > 0) train::require_inodes(need, inodes);
    inodes.push_back(need);
  });
  const bool run_dir_ok = report.run("outputs", Stage::RunDirMade, [&] {
    std::string dir = run_dir;
    if (run_dir.empty()) {
      train::require_writable_dir("logging.runs_root", c.logging.runs_root, train::DirProbe::LookOnly);
      // The name the run makes there (its time differs; its length does not): the key a name too long is train's.
      dir = train::generated_run_dir(c, std::time(nullptr));
      train::require_writable_dir("logging.name", dir, train::DirProbe::LookOnly);
    } else {
      train::require_writable_dir("logging.run_dir", run_dir, train::DirProbe::LookOnly);
    }
    // Its lock, config.toml (written beside, then renamed over an old one: one inode either way), metrics.jsonl and
    // the TensorBoard events file (a new one at every start).
    train::InodeNeed need{run_dir.empty() ? "logging.runs_root" : "logging.run_dir", dir, 1, "config.toml"};
    if (!exists(fs::path(dir) / ".shardtrain-run.lock")) {
      ++need.files;
      need.what = "its lock file, " + need.what;
    }
    if (!exists(fs::path(dir) / c.logging.metrics_file)) {
      ++need.files;
      need.what += ", " + c.logging.metrics_file;
    }
    if (c.logging.tensorboard) {
      ++need.files;
      need.what += ", a TensorBoard events file";
    }
    // result.json, at the end (written beside, then renamed: one inode more while both exist). Uncounted, a run
    // directory one inode short passed, and the run finished without the result job scripts read.
    ++need.files;
    need.what += ", result.json";
    if (ckpt_dir.empty() && ckpt_size) {  // its checkpoints/ is made in the new run directory
      need.files += 2 + ckpt_size->inodes;
      need.what += fmt::format(", checkpoints/ with its lock file and a checkpoint's {} inodes", ckpt_size->inodes);
    }
    train::require_inodes(need, inodes);
  });
  if (looked_ok && ckpt_ok && run_dir_ok)
    report.ok("outputs",
              fmt::format("{} and {} can be written, with the inodes the run makes there",
                          run_dir.empty() ? fmt::format("a new run directory under {}", c.logging.runs_root) : run_dir,
                          ckpt_dir.empty() ? std::string("its checkpoints directory") : ckpt_dir));

  // Disk space for checkpoints, bytes and inodes, by the saves' own estimate and the start line's words
  // (checkpoint::checkpoint_room): one must fit, and as many as are kept at a save (keep_last, as the oldest goes before
  // a save that lacks room; 2 with keep_last = 1, whose only checkpoint is removed after the next is written). Too
  // little for those is a note: the run starts, and a periodic save that does not fit is skipped
  // (checkpoint.max_failed_saves).
  if (ckpt_size) {
    report.run("space", Stage::Reading, [&] {
      const std::string where = ckpt_dir.empty() ? c.logging.runs_root : ckpt_dir;
      const checkpoint::CheckpointRoom room = checkpoint::checkpoint_room(where, *ckpt_size, c.checkpoint.state_dict_type,
                                                                          {c.checkpoint.keep_last, c.checkpoint.keep_every});
      const std::string world_text =
          sharded && !world_ok
              ? " (sized for 1 rank: a sharded checkpoint has a file per shard rank; give --nodes and --gpus-per-node for "
                "the run's)"
              : std::string();
      using Verdict = checkpoint::CheckpointRoom::Verdict;
      if (room.verdict == Verdict::NotOne) throw IoError(room.text + world_text);
      if (room.verdict == Verdict::Enough) report.ok("space", room.text + world_text);
      else report.note("space", room.text + world_text);
    });
  }

  if (report.problems() > 0) {
    log::error("check: {} problem(s); the run would stop on: {}", report.problems(), report.first_text());
    return static_cast<int>(report.first());
  }
  std::printf("check: ok\n");
  return 0;
}

}  // namespace

Command add_check_command(CLI::App& parent) {
  auto o = std::make_shared<CheckOptions>();
  Command c;
  c.app = parent.add_subcommand(
      "check", "preflight a training run offline: the same options as train; config, mesh, data, resume, outputs");
  o->args.add_to(c.app);
  c.app->add_option("--nodes", o->nodes, "nodes of the allocation (with --gpus-per-node)")
      ->check(count_range())
      ->capture_default_str();
  c.app
      ->add_option("--gpus-per-node", o->gpus_per_node, "ranks per node of the allocation: checks the mesh and batch for it")
      ->check(count_range(1, kMaxRanksPerNode));
  c.app->add_flag("--verify-data", o->verify_data, "read every token of the datasets now: each block's checksum and ids");
  c.app->add_flag("--verify-checkpoint", o->verify_checkpoint,
                  "read the checkpoint to resume from whole: every chunk's checksum");
  c.app->add_flag("--data-pending", o->data_pending,
                  "the datasets do not exist yet (a job queued before the run makes them): leave them unchecked");
  c.app->add_option("--gpu-memory", o->gpu_memory,
                    "memory per GPU (80GiB, 80GB): with --nodes/--gpus-per-node, checks that the run's estimate fits it");
  c.app->footer(
      "Exit code: 0 when the run can start; otherwise the first problem's (docs/exit-codes.md), every problem listed.");
  c.launch = Launch::Offline;
  c.run = [o](Runtime*) { return run_check(*o); };
  return c;
}

}  // namespace shardtrain::cli
