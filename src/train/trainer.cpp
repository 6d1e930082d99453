// Trainer construction (trainer.hpp): run directory, the peak MFU is reported against, the replica
// (replica.cpp), AdamW, the training loader, the validation's evaluator (evaluator.cpp), the schedule; and the
// trainer state's JSON. The loop itself is in loop.cpp.
#include "shardtrain/train/trainer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <limits>
#include <new>
#include <string_view>
#include <system_error>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/files.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/preflight.hpp"
#include "shardtrain/train/progress_view.hpp"
#include "shardtrain/train/rank_agreement.hpp"
#include "shardtrain/train/run_dir.hpp"
#include "shardtrain/train/startup.hpp"

namespace shardtrain::train {
namespace fs = std::filesystem;

std::string trainer_state_to_json(const TrainerState& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["tokens_seen"] = s.tokens_seen;
  j["sampler"] = {{"epoch", s.sampler.epoch}, {"index", s.sampler.index}};
  if (s.sampler_samples >= 0) j["sampler"]["samples"] = s.sampler_samples;
  j["optimizer_steps"] = s.optimizer_steps;
  j["consecutive_nonfinite"] = s.consecutive_nonfinite;
  j["skipped_steps"] = s.skipped_steps;
  if (!s.tokens_by_source.empty()) j["tokens_by_source"] = s.tokens_by_source;
  if (s.rollbacks > 0) j["rollbacks"] = s.rollbacks;
  if (s.last_rollback_to >= 0) j["last_rollback_to"] = s.last_rollback_to;
  if (!s.recent_losses.empty()) j["recent_losses"] = s.recent_losses;  // shortest round-trip form: exact on reading
  return json_text(j);
}

TrainerState trainer_state_from_json(std::string_view json, const std::string& source) {
  TrainerState s;
  std::string field;
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    field = "step";
    s.step = j.at("step").get<int64_t>();
    field = "tokens_seen";
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    field = "sampler";
    s.sampler.epoch = j.at("sampler").at("epoch").get<uint64_t>();
    s.sampler.index = j.at("sampler").at("index").get<uint64_t>();
    if (j.at("sampler").contains("samples"))
      s.sampler_samples = j.at("sampler").at("samples").get<int64_t>();  // since 2026-11-24
    field = "optimizer_steps";
    s.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    field = "consecutive_nonfinite";
    s.consecutive_nonfinite = j.at("consecutive_nonfinite").get<int64_t>();
    field = "skipped_steps";
    s.skipped_steps = j.at("skipped_steps").get<int64_t>();
    field = "tokens_by_source";  // since data mixtures; absent before, and without one
    if (j.contains("tokens_by_source")) s.tokens_by_source = j.at("tokens_by_source").get<std::map<std::string, int64_t>>();
    field = "rollbacks";  // since 2026-11-25, and only once there was one
    if (j.contains("rollbacks")) s.rollbacks = j.at("rollbacks").get<int64_t>();
    field = "last_rollback_to";
    if (j.contains("last_rollback_to")) s.last_rollback_to = j.at("last_rollback_to").get<int64_t>();
    field = "recent_losses";  // since 2026-11-25, with optim.loss_spike_factor
    if (j.contains("recent_losses")) s.recent_losses = j.at("recent_losses").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("{}: trainer state{}: {}", source, field.empty() ? "" : " field '" + field + "'", e.what()));
  }
  return s;
}

namespace {

// Rank 0 picks the run directory, checks it (run_dir.hpp), creates it and removes the failure records an earlier
// start left; every rank gets its name and whether it existed before (or rank 0's error, with its exit code).
std::string pick_and_make_run_dir(const TrainConfig& c, MPI_Comm world, int rank, bool* existed, DirLock& lock) {
  std::string dir, error;
  int outcome[2] = {0, 0};  // exit code, existed
  if (rank == 0) {
    try {
      if (!c.logging.run_dir.empty()) {
        dir = c.logging.run_dir;
      } else {
        // Said of logging.runs_root, as `shardtrain check` says it (preflight.hpp), not of a name made here.
        require_writable_dir("logging.runs_root", c.logging.runs_root, DirProbe::Create);
        const std::string first = generated_run_dir(c, std::time(nullptr));
        dir = first;
        std::error_code ec;  // a name too long for the file system: require_writable_dir below says so
        for (int k = 2; fs::exists(dir, ec); ++k) dir = fmt::format("{}-{}", first, k);
      }
      outcome[1] = check_run_dir(c, dir) ? 1 : 0;
      // A generated directory's name is logging.name's (its root was probed above): a name too long is that key's.
      require_writable_dir(c.logging.run_dir.empty() ? "logging.name" : "logging.run_dir", dir, DirProbe::Create);
      // Before anything in it changes (the failure records below, config.toml, the metrics): two runs in one
      // directory interleaved their metrics.jsonl, and one's config.toml sat beside the other's result.json, so
      // `-c RUN_DIR/config.toml --resume auto` continued the wrong run.
      std::string holder, written;
      if (lock.take((fs::path(dir) / kRunDirLockFile).string(), "logging.run_dir", dir, holder, written) ==
          DirLock::Taken::HeldByAnother)
        throw ConfigError(run_dir_in_use_problem(dir, holder));
      // A resumed run's directory may hold the failure records of the start before it (failure_record.hpp). They go
      // now, before any rank can write one of this start's: every rank enables its records after this. Only they:
      // anything else in failures/ is not shardtrain's.
      remove_failure_records(dir);
    } catch (const Error& e) {
      outcome[0] = static_cast<int>(e.code());
      error = e.what();
    } catch (const std::exception& e) {
      outcome[0] = static_cast<int>(ExitCode::Io);
      error = fmt::format("{}: cannot create '{}': {}", c.logging.run_dir.empty() ? "logging.name" : "logging.run_dir", dir,
                          e.what());
    }
  }
  // Raw MPI on the world, not the mesh's world communicator: the run directory comes before the replica (a fatal
  // error while building it leaves a failure record there), so no communicator or watchdog exists yet.
  ST_CHECK_MPI(MPI_Bcast(outcome, 2, MPI_INT, 0, world));
  std::string payload = broadcast_text(world, 0, outcome[0] == 0 ? dir : error);
  if (outcome[0] != 0) throw_typed(static_cast<ExitCode>(outcome[0]), payload, /*every_rank=*/true);
  *existed = outcome[1] != 0;
  return payload;
}

// Runs `build`; running out of host memory in it is a device error (exit code 7, not restartable) naming `what`:
// not an unclassified std::bad_alloc (exit code 1), nor a page-locked allocation's "host allocation of N bytes
// failed" alone.
template <typename F>
auto allocating(const char* what, F&& build) {
  const auto out_of_memory = [&](const std::string& how) {
    return Error(ExitCode::Device,
                 fmt::format("out of host memory while allocating {} ({}): `shardtrain plan` shows what the run's sizes "
                             "need; lower them",
                             what, how));
  };
  try {
    return build();
  } catch (const std::bad_alloc&) {
    throw out_of_memory("std::bad_alloc");
  } catch (const std::system_error& e) {  // a thread (the loader's) that cannot get its stack
    if (e.code() != std::errc::resource_unavailable_try_again) throw;
    throw out_of_memory(fmt::format("cannot start a thread: {}", e.what()));
  } catch (const Error& e) {
    if (e.code() != ExitCode::Device || std::string_view(e.what()).find("host allocation") == std::string_view::npos) throw;
    throw out_of_memory(e.what());
  }
}

// The peak MFU is reported against (mfu.hpp): on a GPU its datasheet figure, with a bf16 matmul measured
// through the backend itself (`cuda_ops`) beside it; on the CPU the best of several sgemms at the step's thread
// count, before the backend sets its thread count, bounded by the CPU's ceiling. The ranks' mean, so every rank
// reports the same MFU. Raw MPI on the world: the measurement comes before the replica and its communicators
// (the CPU backend claims its threads when it is made).
MfuMeter measure_peak(const Runtime& runtime, const TrainConfig& config, ops::Ops* cuda_ops) {
  const bool on_gpu = cuda_ops != nullptr;
  const int threads = runtime.host_threads();
  // logging.peak_flops set: nothing is measured (the tests set it to start faster).
  double gflops = config.logging.peak_flops > 0 ? 0.0
                  : on_gpu ? ops::measure_matmul_flops(*cuda_ops, DType::BF16, 8192, 5, cuda_ops->stream()) * 1e-9
                           : ops::measure_cpu_sgemm(threads, 1024, 5).best_gflops;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &gflops, 1, MPI_DOUBLE, MPI_SUM, runtime.world()));
  const ops::CpuCeiling ceiling = on_gpu ? ops::CpuCeiling{} : ops::cpu_fp32_ceiling(threads);
  // CPU ranks that share the node's cores: each gets 1 / (ranks x threads / cores) of its threads' rate alone
  // (the factor predict prices host work with), and MFU is of that (audit I3).
  const int ranks = runtime.ranks_sharing_cores(), cores = runtime.cpu_binding().allowed;
  const double oversubscription = on_gpu ? 1.0 : core_oversubscription(ranks, threads, cores);
  return MfuMeter::choose(config.logging.peak_flops, on_gpu, runtime.device().name,
                          gflops / runtime.topology().world_size * 1e9, ceiling.flops_per_s, ceiling.how, ceiling.bound,
                          1.0 / oversubscription,
                          fmt::format("{} ranks x {} thread(s) share this node's {} core(s)", ranks, threads, cores));
}

// The training loader's options: every rank of the mesh is a data-parallel rank.
data::LoaderOptions train_loader_options(const TrainConfig& c, int micro_batch, int accumulation, int rank, int world_size) {
  data::LoaderOptions lo;
  lo.split = data::DatasetSplit::Train;
  lo.layout = c.data.layout;
  lo.seq_len = c.data.seq_len;
  lo.micro_batch_size = micro_batch;
  lo.global_batch_size = c.data.global_batch_size;
  lo.dp_rank = rank;
  lo.dp_size = world_size;
  lo.seed = c.data.seed;
  lo.shuffle = c.data.shuffle;
  lo.prefetch = static_cast<size_t>(c.data.prefetch);
  lo.held = 2 * static_cast<size_t>(accumulation);  // the step's micro-batches and the next step's (read ahead)
  return lo;
}

}  // namespace

Trainer::Trainer(const Runtime& runtime, const TrainConfig& config, TrainerOptions options)
    : runtime_(&runtime),
      config_(config),
      options_(std::move(options)),
      last_val_loss_(std::numeric_limits<double>::quiet_NaN()) {
  const Topology& topo = runtime.topology();
  config_.validate();
  config_.validate_for_world(topo.world_size, topo.node_count);
  options_.faults.check_ranks(topo.world_size);
  const int W = topo.world_size, rank = topo.world_rank;
  resolved_toml_ = to_toml(config_);
  StartupWatch* const watch = options_.startup;
  startup_stage(watch, "the ranks' agreement on the configuration");
  check_ranks_agree_on_config(runtime.world(), resolved_toml_);  // before any collective a difference could mismatch

  // The datasets (data.path, or each source of data.mixture): every rank maps them and checks each against
  // the model; the loader checks that a mixture's sources share one tokenizer. With the run's length, before the
  // run directory: a run refused for them leaves none. Sources handed over (`train`) come with their length checked.
  const bool handed_over = !options_.sources.empty();
  if (!handed_over) startup_stage(watch, "opening the datasets");
  sources_ = handed_over ? std::move(options_.sources) : open_data_sources(config_);
  options_.sources.clear();
  startup_stage(watch, "the ranks' agreement on the datasets");
  check_ranks_agree_on_data(runtime.world(), sources_);
  if (!handed_over) check_run_length(config_, sources_);
  startup_stage(watch, "making the run directory");
  make_run_dir();

  const bool on_gpu = runtime.device().is_cuda();
  startup_stage(watch, "measuring the peak FLOP rate");
  std::unique_ptr<ops::Ops> ops = on_gpu ? ops::make_cuda_ops() : nullptr;
  mfu_ = measure_peak(runtime, config_, ops.get());
  if (options_.wrap_ops) ops = options_.wrap_ops(ops ? std::move(ops) : ops::make_cpu_ops({runtime.host_threads()}));
  startup_stage(watch, "building the mesh, its communicators (NCCL's start on a GPU), the model and its FSDP buffers");
  replica_ = allocating("the model and its FSDP buffers",
                        [&] { return std::make_unique<Replica>(runtime, config_, std::move(ops)); });
  watchdog_ = &replica_->watchdog();
  comms_ = &replica_->comms();
  ops_ = &replica_->ops();
  engine_ = &replica_->engine();
  adamw_ = allocating("the AdamW states",
                      [&] { return std::make_unique<optim::AdamW>(*engine_, config_.optim.adamw, &replica_->ledger()); });
  // CPU offload on a GPU: the host update runs beside the next forward, each unit's upload waiting for its
  // own shard only (optim::AdamW::step_async). On the CPU backend the cores are the compute: no overlap.
  async_update_ = on_gpu && config_.fsdp.engine.offload_params;
  if (async_update_) engine_->set_pending_writes(adamw_.get());
  adamw_->set_async_delay(std::chrono::milliseconds(options_.faults.slow_update_ms));

  micro_batch_ = config_.micro_batch_size_for(W);
  accumulation_ = config_.accumulation_steps_for(W);
  loader_ =
      allocating("the training loader's micro-batch buffers (data.micro_batch_size x data.seq_len, data.prefetch)", [&] {
        return std::make_unique<data::Loader>(sources_, train_loader_options(config_, micro_batch_, accumulation_, rank, W));
      });
  if (config_.schedule.eval_batches > 0)
    evaluator_ = allocating("the validation loaders' micro-batch buffers", [&] {
      return std::make_unique<Evaluator>(*replica_, config_, sources_,
                                         EvaluatorOptions{.micro_batches = config_.schedule.eval_batches});
    });

  // The run's length: the first of max_steps, max_tokens, epochs.
  const int64_t steps_per_epoch = static_cast<int64_t>(loader_->sampler().global_batches_per_epoch());
  tokens_per_step_ = static_cast<int64_t>(config_.data.global_batch_size) * config_.data.seq_len;
  total_steps_ = planned_steps(config_, steps_per_epoch);
  schedule_ = std::make_unique<optim::LrSchedule>(config_.schedule.lr, config_.optim.adamw.lr, total_steps_);
  if (const auto& s = config_.schedule.lr;  // every rank decides it alike: rank 0 says it
      rank == 0 && s.kind == optim::ScheduleKind::WarmupStableDecay && s.decay_steps > total_steps_ - s.warmup_steps)
    log::warn(
        "schedule.decay_steps: {} is longer than the {} steps after the warmup in this run of {}; the decay takes "
        "those {} (it begins where the warmup ends)",
        s.decay_steps, total_steps_ - s.warmup_steps, total_steps_, total_steps_ - s.warmup_steps);
  flops_per_token_ = flops_per_token(replica_->model().spec(), config_.data.seq_len);

  log_start(steps_per_epoch);
  progress_ = std::make_unique<ProgressView>(config_.logging, total_steps_, rank == 0);
  timeline_ = std::make_unique<StepTimeline>(on_gpu, ops_->stream());
}

Trainer::~Trainer() = default;

void Trainer::make_run_dir() {
  const int rank = runtime_->topology().world_rank;
  bool existed = false;
  run_dir_lock_ = std::make_unique<DirLock>();
  run_dir_ = pick_and_make_run_dir(config_, runtime_->world(), rank, &existed, *run_dir_lock_);
  failure_record::enable(run_dir_, runtime_->world());  // a fatal error from here on leaves RUN_DIR/failures/rank_N.json
  // A directory this start made holds nothing to lose: config.toml goes in at once (job scripts see the run has
  // started). Into one that existed (an earlier run's, or the user's), nothing before start() has validated the run.
  if (!options_.run_dir_existed.value_or(existed)) {
    write_config_toml();
    config_written_ = true;
  }
}

void Trainer::write_config_toml() const {
  if (runtime_->topology().world_rank != 0) return;
  // A generated run directory is recorded as the run's logging.run_dir: `train -c RUN_DIR/config.toml --resume auto`
  // continues the run in it (with run_dir = "" it made a new directory and trained from step 0).
  std::string toml = resolved_toml_;
  if (config_.logging.run_dir.empty()) {
    TrainConfig recorded = config_;
    recorded.logging.run_dir = fs::absolute(run_dir_).lexically_normal().string();
    toml = to_toml(recorded);
  }
  write_file_whole((fs::path(run_dir_) / "config.toml").string(),
                   fmt::format("{} ({})\n{}", kConfigTomlMark, options_.config_source, toml), "the resolved configuration");
}

void Trainer::start() {
  if (started_) return;
  started_ = true;
  for (TrainerHooks* h : hooks_) h->on_start(*this);
  // A checkpoint of a step whose validation was due (every eval_every steps, and the last) was saved after it: a
  // resumed start does not validate that step again (a finished run resumed wrote a second "eval" record of its end).
  if (state_.step > 0 && (due(config_.schedule.eval_every) || state_.step >= total_steps_)) last_eval_step_ = state_.step;
  commit_run_dir();
}

void Trainer::commit_run_dir() {
  if (runtime_->topology().world_rank != 0) return;
  if (!config_written_) write_config_toml();
  remove_own_result(run_dir_);  // this start writes its own when it ends; until then there is none
  metrics_ = std::make_unique<MetricsWriter>((fs::path(run_dir_) / config_.logging.metrics_file).string(),
                                             config_.logging.tensorboard ? run_dir_ : std::string());
  for (const std::string& line : pending_events_) metrics_->write(line);
  pending_events_.clear();
}

bool Trainer::keep_run_dir() {
  if (runtime_->topology().world_rank != 0) return true;
  if (run_dir_lost_ || !metrics_) return !run_dir_lost_;
  const std::string lock_path = (fs::path(run_dir_) / kRunDirLockFile).string();
  const bool dir_gone = run_dir_lock_ && run_dir_lock_->held() && !run_dir_lock_->holds(lock_path);
  const bool metrics_gone = metrics_->removed();
  if (!dir_gone && !metrics_gone) return true;
  const std::string moved_to = dir_gone ? fs::path(run_dir_lock_->now_at()).parent_path().string() : std::string();
  const std::string metrics_path = (fs::path(run_dir_) / config_.logging.metrics_file).string();
  try {
    if (dir_gone) {
      require_writable_dir("logging.run_dir", run_dir_, DirProbe::Create);
      std::string holder, written;
      if (run_dir_lock_->take(lock_path, "logging.run_dir", run_dir_, holder, written) == DirLock::Taken::HeldByAnother) {
        run_dir_lost_ = true;
        metrics_.reset();
        log::error(
            "logging.run_dir {} was {} while this run held it, and another run has claimed it since ({}): this run "
            "writes nothing more there (no metrics, no result.json), so that the two runs' files are not mixed; its "
            "checkpoints go on in {}",
            run_dir_, moved_to.empty() ? "removed" : "moved to " + moved_to, holder, config_.checkpoint.dir);
        return false;
      }
      write_config_toml();
    }
    if (metrics_gone)
      metrics_ = std::make_unique<MetricsWriter>(metrics_path, config_.logging.tensorboard ? run_dir_ : std::string());
    if (!metrics_gone)
      log::warn("logging.run_dir {}: its lock file was removed while this run held it: locked again", run_dir_);
    else if (!dir_gone)
      log::warn("train: {} (or the TensorBoard event file) was removed while this run wrote it: opened again after step {}",
                metrics_path, state_.step);
    else if (!moved_to.empty())
      log::warn(
          "logging.run_dir {} was moved to {} while this run held it, with its config.toml and metrics up to step {}: "
          "made again, locked again and given config.toml; the metrics go on there from step {}",
          run_dir_, moved_to, state_.step - 1, state_.step);
    else
      log::warn(
          "logging.run_dir {} was removed while this run held it (its metrics up to step {} went with it): made again, "
          "locked again and given config.toml, so that no second run takes it; the metrics go on from step {}",
          run_dir_, state_.step - 1, state_.step);
  } catch (const Error& e) {
    // The weights matter more than their log: training goes on, its metrics dropped as on a full disk.
    log::error("logging.run_dir {}: removed while this run held it, and cannot be made again ({}); training goes on",
               run_dir_, e.what());
  }
  return true;
}

void Trainer::record_event(const std::string& json_line) {
  if (metrics_) metrics_->write(json_line);
  else if (runtime_->topology().world_rank == 0)  // before start() opened the metrics
    pending_events_.push_back(json_line);
}

void Trainer::log_start(int64_t steps_per_epoch) const {
  if (runtime_->topology().world_rank != 0) return;
  const model::ModelSpec& spec = replica_->model().spec();
  const DeviceMesh& mesh = replica_->mesh();
  log::info("train: resolved configuration ({}):\n{}", options_.config_source, resolved_toml_);
  log::info(
      "train: model {:.2f}M parameters ({:.3g} GFLOP per token), mesh {} x {} ({}), {} ranks x micro-batch {} x {} "
      "accumulation = {} sequences of {} tokens per step; {} steps ({} per epoch of {}); MFU against {}; "
      "device {}, collectives over {}; {} host thread(s) per rank; run directory {}",
      static_cast<double>(spec.num_params()) / 1e6, flops_per_token_ / 1e9, mesh.replicate_size(), mesh.shard_size(),
      sharding_strategy_name(config_.fsdp.engine.strategy), runtime_->topology().world_size, micro_batch_, accumulation_,
      config_.data.global_batch_size, config_.data.seq_len, total_steps_, steps_per_epoch, config_.data.describe(),
      mfu_.label(), runtime_->device().describe(), replica_->comm_backend().describe(), runtime_->host_threads(), run_dir_);
  if (sources_.size() > 1) {
    const data::MixedSource& mix = loader_->source();
    for (size_t k = 0; k < mix.size(); ++k)
      log::info("train: data source {} ({}): {}", k, mix.dataset(k).path(), mix.share(k));
  }
}

void Trainer::add_hooks(TrainerHooks* hooks) { hooks_.push_back(hooks); }

void Trainer::restore(const TrainerState& s) {
  drop_read_ahead();  // read from where the loader was; it seeks below
  state_ = s;
  // The saved position in samples, which mean the same data at any world size and micro-batch size; the
  // micro-batch index only where the checkpoint predates the sample count.
  if (s.sampler_samples >= 0) {
    const data::DistributedSampler& sampler = loader_->sampler();
    const auto samples = static_cast<uint64_t>(s.sampler_samples);
    state_.sampler = sampler.position_after(s.sampler.epoch, samples);
    const uint64_t here = sampler.samples_before(state_.sampler);
    // Every rank works the position out alike; rank 0 says it, once for the job.
    if (runtime_->topology().world_rank == 0) {
      if (state_.sampler.epoch != s.sampler.epoch)
        log::warn("train: the checkpoint stopped {} samples into epoch {}, past this run's epoch of {}: starting epoch {}",
                  samples, s.sampler.epoch, sampler.micro_batches_per_epoch() * sampler.samples_before({0, 1}),
                  state_.sampler.epoch);
      else if (here != samples)
        log::warn(
            "train: the checkpoint stopped {} samples into epoch {}, not a multiple of this run's {} per micro-step "
            "(data.global_batch_size changed?): resuming at sample {}",
            samples, s.sampler.epoch, sampler.samples_before({0, 1}), here);
      else if (state_.sampler.index != s.sampler.index)
        log::info(
            "train: resuming {} samples into epoch {}: micro-batch {} at this run's {} ranks x {} sequences ({} in the "
            "saving run)",
            samples, s.sampler.epoch, state_.sampler.index, sampler.options().dp_size, sampler.options().micro_batch_size,
            s.sampler.index);
    }
    state_.sampler_samples = static_cast<int64_t>(sampler.samples_before(state_.sampler));
  }
  loader_->seek(state_.sampler);
  adamw_->set_steps(s.optimizer_steps);
}

}  // namespace shardtrain::train
