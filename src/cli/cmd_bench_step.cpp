// `shardtrain bench step`: the whole training step (data, forward, backward, FSDP collectives, clipping, AdamW)
// through train::Trainer, as `shardtrain train` builds it, for warm-up + timed steps with no evaluation and no
// checkpoints. Reports the median step time of the timed steps, global tokens/s, MFU (the trainer's FLOPs per
// token and measured peak), peak memory, the last loss, the device, the mesh and the collective backend.
// --ops-profile (CPU backend): every rank's ops are timed during the timed steps (ops::make_timed_ops), and rank 0
// writes its op times as a `bench ops --json` profile (step_profile.hpp) for `shardtrain predict`.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cmd_bench.hpp"
#include "command.hpp"
#include "step_profile.hpp"
#include "shardtrain/comm/communicator.hpp"
#include "shardtrain/mesh/strategy.hpp"
#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/ops/timed_ops.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/runtime/timer.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::cli {
namespace {

namespace fs = std::filesystem;

struct BenchStepOptions {
  std::string config;
  int steps = 10, warmup = 3;
  std::string json;
  std::string ops_profile;
  bool keep_run_dir = false;
  std::vector<std::string> override_values;  // one per config field, in config_fields() order
  std::vector<CLI::Option*> override_options;
};

// Each step's metrics; with op times, timing on from the first timed step, and each timed step a period of theirs.
class StepRecorder final : public train::TrainerHooks {
 public:
  StepRecorder(ops::OpTimes* times, int warmup) : times_(times), warmup_(static_cast<size_t>(warmup)) {}
  void on_start(train::Trainer&) override {
    if (times_ && warmup_ == 0) times_->set_enabled(true);
  }
  void on_step_end(train::Trainer&, const train::StepMetrics& m) override {
    steps.push_back(m);
    if (!times_) return;
    if (steps.size() > warmup_) times_->end_period();
    if (steps.size() == warmup_) times_->set_enabled(true);
  }
  std::vector<train::StepMetrics> steps;

 private:
  ops::OpTimes* times_;
  size_t warmup_;
};

// Rank 0's op times as a profile (--ops-profile), with the ceilings measured as `bench ops` measures them on the CPU
// (an f32 2048^3 matmul, a 256 MiB copy; bf16 matmul for a bf16 run), once the step's memory is freed. Prints the
// share of the step the ops took and the keys that took most of it.
void write_ops_profile(const std::string& path, const ops::OpTimes& times, StepProfileSource source) {
  auto backend = ops::make_cpu_ops(ops::CpuOpsOptions{source.threads});
  source.matmul_n = 2048;
  source.copy_bytes = size_t{256} << 20;
  source.matmul_flops_per_s = ops::measure_matmul_flops(*backend, source.dtype, source.matmul_n, 5);
  source.copy_bytes_per_s = ops::measure_copy_bandwidth(*backend, source.copy_bytes, 5);
  write_text_file(path, step_op_profile_json(times, source));

  std::vector<ops::OpTimes::Summary> keys = times.summary();
  const double per_step = op_seconds_per_step(times);
  std::sort(keys.begin(), keys.end(),
            [](const auto& a, const auto& b) { return a.seconds * a.calls_per_period > b.seconds * b.calls_per_period; });
  fmt::print(
      "{:<34} {} per step ({:.1f} % of the median step) in {} kinds of call; profile {} (ceilings: matmul {}, "
      "copy {:.3g} GB/s)\n",
      "ops inside the step (rank 0)", format_seconds(per_step), 100 * per_step / source.step_time_s, keys.size(), path,
      format_flops(source.matmul_flops_per_s), source.copy_bytes_per_s * 1e-9);
  const size_t shown = std::min<size_t>(keys.size(), 8);
  for (size_t i = 0; i < shown; ++i)
    fmt::print("    {:>9} x {:<5g} {:5.1f} %  {}\n", format_seconds(keys[i].seconds), keys[i].calls_per_period,
               100 * keys[i].seconds * keys[i].calls_per_period / source.step_time_s, keys[i].call.key);
  if (keys.size() > shown) fmt::print("    ... {} more in the profile\n", keys.size() - shown);
  if (source.op_seconds_per_step_by_rank.size() > 1) {
    std::string by_rank;
    for (double s : source.op_seconds_per_step_by_rank) by_rank += (by_rank.empty() ? "" : ", ") + format_seconds(s);
    fmt::print("{:<34} {}\n", "ops per step, each rank", by_rank);
  }
}

// The config as `shardtrain train` resolves it (file < overrides), then made a benchmark: exactly
// warmup + steps steps, no evaluation, no checkpoints, nothing loaded.
train::TrainConfig resolve(const BenchStepOptions& o, int& overrides) {
  train::TrainConfig c = train::load_train_config(o.config);
  const auto& fields = train::config_fields();
  for (size_t i = 0; i < fields.size(); ++i) {
    if (o.override_options[i]->count() == 0) continue;
    train::apply_override(c, fields[i].dotted(), o.override_values[i]);
    ++overrides;
  }
  const int64_t total = o.warmup + o.steps;
  c.schedule.max_steps = total;
  c.schedule.max_tokens = 0;
  c.schedule.epochs = 0;
  c.schedule.eval_every = 0;
  c.schedule.eval_batches = 0;
  c.schedule.lr.warmup_steps = std::min<int64_t>(c.schedule.lr.warmup_steps, total - 1);
  c.schedule.lr.decay_steps = 0;
  c.checkpoint.every_n_steps = 0;
  c.checkpoint.resume.clear();
  c.checkpoint.init_from.clear();
  c.validate();
  return c;
}

// Rank 0 makes a fresh directory under the system's temporary directory; every rank gets its name.
std::string make_temp_dir(MPI_Comm world, int rank) {
  std::string path;
  if (rank == 0) {
    std::string pattern = (fs::temp_directory_path() / "shardtrain-bench-step-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw IoError(fmt::format("{}: cannot create the benchmark's run directory", pattern));
    path = pattern;
  }
  return broadcast_text(world, 0, std::move(path));
}

int64_t max_over_ranks(int64_t v, MPI_Comm world) {
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_MAX, world));
  return v;
}

int run_bench_step(const BenchStepOptions& o, Runtime* rt) {
  if (o.steps < 1) throw UsageError(fmt::format("bench step: --steps {}: expected 1 or more timed steps", o.steps));
  if (o.warmup < 0) throw UsageError(fmt::format("bench step: --warmup {}: expected 0 or more", o.warmup));
  int overrides = 0;
  train::TrainConfig config = resolve(o, overrides);
  const Topology& topo = rt->topology();
  const int rank = topo.world_rank, W = topo.world_size;

  // The run directory it made: removed however the benchmark ends (a failed run left one per try), unless kept.
  struct TempRunDir {
    std::string path;
    bool remove = false;
    ~TempRunDir() {
      std::error_code ec;
      if (remove && !path.empty()) fs::remove_all(path, ec);
    }
  } temp;
  if (config.logging.run_dir.empty()) {
    temp.path = make_temp_dir(rt->world(), rank);
    temp.remove = rank == 0 && !o.keep_run_dir;
    config.logging.run_dir = (fs::path(temp.path) / "run").string();
  }
  train::TrainerOptions topts;
  topts.config_source =
      o.config + (overrides ? fmt::format(" + {} override(s)", overrides) : std::string()) + " (bench step)";
  ops::OpTimes op_times;
  if (!o.ops_profile.empty()) {
    if (rt->device().is_cuda())
      throw UsageError(
          "bench step: --ops-profile times the CPU backend's ops only (a GPU op's wall time is not its kernel's); "
          "run with --device cpu, or profile a GPU with `bench ops`");
    topts.wrap_ops = [&op_times](std::unique_ptr<ops::Ops> inner) {
      return ops::make_timed_ops(std::move(inner), op_times);
    };
  }

  StepRecorder recorder(o.ops_profile.empty() ? nullptr : &op_times, o.warmup);
  int64_t device_peak = 0;
  train::MfuMeter meter;
  std::string mesh, comm_backend, strategy;
  int replicate = 0, shard = 0;
  int64_t ledger_peak = 0;  // rank 0's memory ledger (metrics' peak_mem_bytes is the device allocator's on a GPU)
  {
    check_model_fits(config, *rt);
    train::Trainer trainer(*rt, config, topts);
    trainer.add_hooks(&recorder);
    // The peak counts what training holds, not the trainer's own peak-FLOP/s measurement before it.
    reset_device_memory_peak();
    trainer.run();
    op_times.set_enabled(false);
    device_peak = max_over_ranks(static_cast<int64_t>(device_memory_stats().peak), rt->world());
    meter = trainer.mfu_meter();  // after the run: a peak a step outran has been raised
    ledger_peak = trainer.replica().ledger().peak_total();
    replicate = trainer.mesh().replicate_size(), shard = trainer.mesh().shard_size();
    strategy = sharding_strategy_name(trainer.mesh().strategy());
    mesh = fmt::format("{} x {} ({})", replicate, shard, strategy);
    comm_backend = comm_backend_name(trainer.comms().backend());
  }
  const int64_t rss_peak = max_over_ranks(train::peak_rss_bytes(), rt->world());
  std::vector<double> op_seconds_by_rank(static_cast<size_t>(W));  // --ops-profile: each rank's ops per step
  if (!o.ops_profile.empty()) {
    const double mine = op_seconds_per_step(op_times);
    ST_CHECK_MPI(MPI_Gather(&mine, 1, MPI_DOUBLE, op_seconds_by_rank.data(), 1, MPI_DOUBLE, 0, rt->world()));
  }

  const std::vector<train::StepMetrics>& all = recorder.steps;
  if (static_cast<int>(all.size()) != o.warmup + o.steps)
    throw InternalError(
        fmt::format("bench step: the trainer ran {} steps, expected {} warm-up + {} timed", all.size(), o.warmup, o.steps));
  std::vector<double> seconds, update_s, wait_s, gpu_busy, gpu_idle, host_queue;
  int64_t skipped = 0;
  for (size_t i = static_cast<size_t>(o.warmup); i < all.size(); ++i) {
    seconds.push_back(all[i].step_time_s);
    update_s.push_back(all[i].host_update_s);
    wait_s.push_back(all[i].update_wait_s);
    if (all[i].gpu_busy_s >= 0) {  // a GPU, from the second step
      gpu_busy.push_back(all[i].gpu_busy_s);
      gpu_idle.push_back(all[i].gpu_idle_before_s);
      host_queue.push_back(all[i].host_queue_s);
    }
    skipped += all[i].skipped ? 1 : 0;
  }
  // CPU offload on a GPU: the host update beside the forward (rank 0's; 0 when the update is not asynchronous).
  const double host_update_s = median(update_s), update_wait_s = median(wait_s);
  const double step_s = median(seconds);
  const auto [min_s, max_s] = std::minmax_element(seconds.begin(), seconds.end());
  const int64_t tokens_per_step = static_cast<int64_t>(config.data.global_batch_size) * config.data.seq_len;
  const double tokens_per_s = static_cast<double>(tokens_per_step) / step_s;
  const double fpt = train::flops_per_token(model::ModelSpec(config.model), config.data.seq_len);
  const double mfu = meter.mfu(tokens_per_s * fpt, W);
  const double mfu_measured = meter.mfu_of_measured(tokens_per_s * fpt, W);
  const train::StepMetrics& last = all.back();
  const bool cuda = rt->device().is_cuda();
  const int64_t peak_mem = cuda ? device_peak : last.peak_mem_bytes;
  const int micro = config.micro_batch_size_for(W), accumulation = config.accumulation_steps_for(W);
  if (rank != 0) return 0;

  fmt::print("bench step: {} ({} + {} override(s)), {} timed steps after {} warm-up\n",
             config.logging.name.empty() ? o.config : config.logging.name, o.config, overrides, o.steps, o.warmup);
  fmt::print(
      "device {} | {} ranks, mesh {} | collectives {} | micro-batch {} x seq {} x {} accumulation x {} ranks = {} tokens per step\n",
      rt->device().describe(), W, mesh, comm_backend, micro, config.data.seq_len, accumulation, W, tokens_per_step);
  fmt::print("{:<34} {}\n", "step time median (min, max)",
             fmt::format("{} ({}, {})", format_seconds(step_s), format_seconds(*min_s), format_seconds(*max_s)));
  fmt::print("{:<34} {:.0f}\n", "tokens/s (all ranks)", tokens_per_s);
  fmt::print("{:<34} {:.2f} %  ({:.4g} GFLOP per token = 6 (params - input embedding) + 12 L H S; against {})\n", "MFU",
             100 * mfu, fpt * 1e-9, meter.label());
  if (meter.kind() != train::PeakKind::Measured && meter.measured_per_rank() > 0)
    fmt::print("{:<34} {:.2f} %  (against the matmul measured at start, {} per rank)\n", "MFU of the measured peak",
               100 * mfu_measured, format_flops(meter.measured_per_rank()));
  if (cuda)
    fmt::print("{:<34} {}\n", "peak device memory (max over ranks)", format_bytes(static_cast<uint64_t>(device_peak)));
  // On the CPU metrics' peak_mem_bytes is the ledger's; on a GPU the device allocator's, so the ledger is read here.
  const int64_t ledger_bytes = cuda ? ledger_peak : last.peak_mem_bytes;
  fmt::print("{:<34} {} (FSDP shards and buffers, optimizer state; no activations)\n", "peak memory ledger (rank 0)",
             format_bytes(static_cast<uint64_t>(ledger_bytes)));
  fmt::print("{:<34} {}\n", "peak RSS (max over ranks)", format_bytes(static_cast<uint64_t>(rss_peak)));
  if (!gpu_busy.empty()) {
    fmt::print("{:<34} {} busy, {} idle between steps; the host queued forward and backward in {} (medians, rank 0)\n",
               "GPU compute stream per step", format_seconds(median(gpu_busy)), format_seconds(median(gpu_idle)),
               format_seconds(median(host_queue)));
  }
  if (host_update_s > 0) {
    fmt::print("{:<34} {} median, of which the step waited {} (rank 0)\n", "host optimizer update (offload)",
               format_seconds(host_update_s), format_seconds(update_wait_s));
  }
  fmt::print("{:<34} {:.4f}{}\n", "loss of the last step", last.loss,
             skipped ? fmt::format(" ({} timed step(s) skipped)", skipped) : std::string());
  if (cuda && device_peak == 0)
    log::warn("bench step: the device is a GPU but the trainer allocated no device memory: the step ran on the CPU ops");
  if (!o.ops_profile.empty()) {
    StepProfileSource source;
    source.device = rt->device().describe();
    source.threads = rt->host_threads();
    source.machine_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    source.dtype = config.fsdp.engine.param_dtype;
    source.shape = BenchShape{config.model, micro, config.data.seq_len, o.config};
    source.ranks = W;
    source.accumulation = accumulation;
    source.steps = o.steps;
    source.warmup = o.warmup;
    source.step_time_s = step_s;
    source.op_seconds_per_step_by_rank = op_seconds_by_rank;
    write_ops_profile(o.ops_profile, op_times, source);
  }

  if (!o.json.empty()) {
    nlohmann::ordered_json j;
    j["config"] = o.config;
    j["overrides"] = overrides;
    j["device"] = rt->device().describe();
    j["backend"] = cuda ? "cuda" : "cpu";
    j["world_size"] = W;
    j["mesh"] = {{"replicate", replicate}, {"shard", shard}, {"strategy", strategy}};
    j["comm_backend"] = comm_backend;
    j["micro_batch"] = micro;
    j["accumulation_steps"] = accumulation;
    j["seq_len"] = config.data.seq_len;
    j["global_batch_size"] = config.data.global_batch_size;
    j["tokens_per_step"] = tokens_per_step;
    j["warmup"] = o.warmup;
    j["steps"] = o.steps;
    j["step_times_s"] = seconds;
    j["step_time_median_s"] = step_s;
    j["tokens_per_s"] = tokens_per_s;
    j["flops_per_token"] = fpt;
    j["peak_flops_per_rank"] = meter.peak_per_rank();
    j["peak_kind"] = train::peak_kind_name(meter.kind());
    j["peak_label"] = meter.label();
    j["mfu"] = mfu;
    j["measured_peak_flops_per_rank"] = meter.measured_per_rank();
    j["mfu_measured_peak"] = std::isfinite(mfu_measured) ? nlohmann::json(mfu_measured) : nlohmann::json(nullptr);
    j["peak_memory_bytes"] = peak_mem;
    j["peak_memory_source"] = cuda ? "device_memory_stats (max over ranks)" : "memory ledger (rank 0)";
    j["device_peak_bytes"] = device_peak;
    j["ledger_peak_bytes"] = ledger_bytes;
    j["rss_peak_bytes"] = rss_peak;
    j["last_loss"] = std::isfinite(last.loss) ? nlohmann::ordered_json(last.loss) : nlohmann::ordered_json(nullptr);
    j["skipped_steps"] = skipped;
    j["offload_params"] = config.fsdp.engine.offload_params;
    j["host_update_median_s"] = host_update_s;
    if (!gpu_busy.empty()) {
      j["gpu_busy_median_s"] = median(gpu_busy);
      j["gpu_idle_between_steps_median_s"] = median(gpu_idle);
      j["host_queue_median_s"] = median(host_queue);
    }
    j["update_wait_median_s"] = update_wait_s;
    j["param_dtype"] = dtype_name(config.fsdp.engine.param_dtype);
    write_text_file(o.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

BenchSubcommand add_bench_step_command(CLI::App& bench) {
  auto o = std::make_shared<BenchStepOptions>();
  CLI::App* a = bench.add_subcommand("step",
                                     "time the whole training step (train::Trainer) for a config under mpirun: "
                                     "step time, tokens/s, MFU, peak memory");
  a->add_option("--config,-c", o->config, "the run's TOML config, e.g. configs/tiny-cpu.toml")->required();
  a->add_option("--steps", o->steps, "timed steps (their median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  a->add_option("--warmup", o->warmup, "untimed steps first")->capture_default_str()->check(CLI::Range(0, 1000000));
  a->add_option("--json", o->json, "also write the results as JSON to this file (rank 0)")->check(output_file_check());
  a->add_option("--ops-profile", o->ops_profile,
                "CPU backend: time every op call inside the timed steps and write rank 0's times to this file as a "
                "`bench ops --json` profile (for `shardtrain predict --ops-profile`)");
  a->add_flag("--keep-run-dir", o->keep_run_dir, "keep the temporary run directory (config.toml, metrics.jsonl)");
  const auto& fields = train::config_fields();
  o->override_values.resize(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    const train::ConfigField& f = fields[i];
    o->override_options.push_back(
        a->add_option("--" + f.dotted(), o->override_values[i], f.help)->group("Config keys (override the file)"));
  }
  a->footer(
      "The run directory is a temporary one, removed at the end, unless logging.run_dir names one. The schedule is cut to\n"
      "warmup + steps steps (LR warm-up shortened to fit), with no evaluation and no checkpoints.");
  return {a, [o](Runtime* rt) { return run_bench_step(*o, rt); }};
}

}  // namespace shardtrain::cli
