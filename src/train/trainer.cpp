// Trainer construction: run directory, mesh, model, engine, optimizer, loaders, schedule (trainer.hpp).
// The loop itself is in loop.cpp.
#include "shardtrain/train/trainer.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>

#include "shardtrain/ops/cpu_ops.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/ops/peak.hpp"
#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/inputs.hpp"
#include "shardtrain/train/progress_view.hpp"
#include "shardtrain/train/rank_agreement.hpp"

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
  return j.dump();
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
    if (j.at("sampler").contains("samples")) s.sampler_samples = j.at("sampler").at("samples").get<int64_t>();  // since 2026-11-24
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
    throw CheckpointError(fmt::format("{}: trainer state{}: {}", source, field.empty() ? "" : " field '" + field + "'", e.what()));
  }
  return s;
}

const char* rank_fault_name(RankFault::Kind k) {
  switch (k) {
    case RankFault::Kind::Stall: return "stall";
    case RankFault::Kind::Kill: return "kill";
    case RankFault::Kind::Freeze: return "freeze";
    case RankFault::Kind::DeviceError: return "device_error";
    case RankFault::Kind::MachineCheck: return "mce";
  }
  return "?";
}

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan plan;
  auto bad = [&](const std::string& why) {
    return UsageError(fmt::format(
        "SHARDTRAIN_FAULT='{}': {} (expected faults separated by ';', each nan_grad:STEP[,STEP|,FIRST-LAST...], "
        "bad_data:FIRST-LAST, slow_update:MS, slow_step:MS, stall:RANK@STEP, kill:RANK@STEP, freeze:RANK@STEP, device_error:RANK@STEP or "
        "mce:RANK@STEP, the last five optionally @NODE)",
        spec, why));
  };
  // A whole non-negative number, or a usage error naming `what`.
  auto number = [&](const std::string& text, const std::string& what) -> int64_t {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(text, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (text.empty() || used != text.size() || v < 0 || !std::isdigit(static_cast<unsigned char>(text[0])))
      throw bad(fmt::format("not a {}: '{}'", what, text));
    return v;
  };
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(';', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon), arg = colon == std::string::npos ? std::string() : item.substr(colon + 1);
    if (colon == std::string::npos) throw bad(fmt::format("unknown fault '{}'", item));
    if (name == "stall" || name == "kill" || name == "freeze" || name == "device_error" || name == "mce") {
      const size_t at = arg.find('@');
      if (at == std::string::npos) throw bad(fmt::format("expected {}:RANK@STEP, got '{}'", name, item));
      RankFault f;
      f.kind = name == "stall"  ? RankFault::Kind::Stall
               : name == "kill" ? RankFault::Kind::Kill
               : name == "freeze" ? RankFault::Kind::Freeze
               : name == "mce"    ? RankFault::Kind::MachineCheck
                                  : RankFault::Kind::DeviceError;
      f.rank = static_cast<int>(number(arg.substr(0, at), "rank"));
      const size_t node_at = arg.find('@', at + 1);
      f.step = number(arg.substr(at + 1, node_at == std::string::npos ? std::string::npos : node_at - at - 1), "step number");
      if (node_at != std::string::npos) {
        f.node = arg.substr(node_at + 1);
        if (f.node.empty()) throw bad(fmt::format("expected a node name after the second '@', got '{}'", item));
      }
      if (f.step < 1) throw bad(fmt::format("steps count from 1: '{}'", item));
      plan.rank_faults.push_back(f);
      continue;
    }
    if (name == "slow_update") {
      plan.slow_update_ms = static_cast<int>(std::min<int64_t>(number(arg, "delay in milliseconds"), 60'000));
      continue;
    }
    if (name == "slow_step") {
      plan.slow_step_ms = static_cast<int>(std::min<int64_t>(number(arg, "delay in milliseconds"), 60'000));
      continue;
    }
    if (name == "bad_data") {
      const size_t dash = arg.find('-');
      const auto first = static_cast<uint64_t>(number(arg.substr(0, dash), "sample number"));
      const auto last = dash == std::string::npos ? first : static_cast<uint64_t>(number(arg.substr(dash + 1), "sample number"));
      if (last < first) throw bad(fmt::format("expected bad_data:FIRST-LAST with FIRST <= LAST, got '{}'", item));
      plan.bad_samples.emplace_back(first, last);
      continue;
    }
    if (name != "nan_grad") throw bad(fmt::format("unknown fault '{}'", name));
    size_t start = 0;
    while (start <= arg.size()) {
      size_t comma = arg.find(',', start);
      if (comma == std::string::npos) comma = arg.size();
      const std::string range = arg.substr(start, comma - start);
      start = comma + 1;
      const size_t dash = range.find('-');
      const int64_t first = number(range.substr(0, dash), "step number");
      const int64_t last = dash == std::string::npos ? first : number(range.substr(dash + 1), "step number");
      if (first < 1 || last < first) throw bad("steps count from 1: " + range);
      for (int64_t s = first; s <= last; ++s) plan.nan_grad_steps.push_back(s);
    }
  }
  return plan;
}

bool FaultPlan::nan_grad_at(int64_t step) const {
  return std::find(nan_grad_steps.begin(), nan_grad_steps.end(), step) != nan_grad_steps.end();
}

bool FaultPlan::bad_data_in(uint64_t epoch, uint64_t first, uint64_t count) const {
  if (epoch != 0 || count == 0) return false;
  for (const auto& [a, b] : bad_samples)
    if (first <= b && a < first + count) return true;
  return false;
}

const RankFault* FaultPlan::rank_fault_at(int rank, int64_t step) const {
  for (const RankFault& f : rank_faults) {
    if (f.rank == rank && f.step == step && (f.node.empty() || f.node == failure_record::node_name())) return &f;
  }
  return nullptr;
}

void FaultPlan::check_ranks(int world_size) const {
  for (const RankFault& f : rank_faults) {
    if (f.rank >= world_size)
      throw UsageError(fmt::format("SHARDTRAIN_FAULT: {}:{}@{} names rank {}, but the world has ranks 0-{}", rank_fault_name(f.kind), f.rank,
                                   f.step, f.rank, world_size - 1));
  }
}

namespace {

// Rank 0 picks and creates the run directory; every rank gets its name (or rank 0's error).
std::string make_run_dir(const TrainConfig& c, MPI_Comm world, int rank) {
  std::string dir, error;
  if (rank == 0) {
    try {
      if (!c.logging.run_dir.empty()) {
        dir = c.logging.run_dir;
      } else {
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char stamp[32];
        std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        const std::string name = c.logging.name.empty() ? "run" : c.logging.name;
        dir = (fs::path(c.logging.runs_root) / fmt::format("{}-{}", name, stamp)).string();
        for (int k = 2; fs::exists(dir); ++k) dir = (fs::path(c.logging.runs_root) / fmt::format("{}-{}-{}", name, stamp, k)).string();
      }
      fs::create_directories(dir);
      // A resumed run's directory may hold the failure records of the run before it (failure_record.hpp). They
      // go now, before any rank can write one of this run's: every rank enables its records after this.
      fs::remove_all(fs::path(dir) / "failures");
    } catch (const std::exception& e) {
      error = fmt::format("logging.run_dir: cannot create '{}': {}", dir, e.what());
    }
  }
  std::string payload = error.empty() ? "D" + dir : "E" + error;
  int n = static_cast<int>(payload.size());
  ST_CHECK_MPI(MPI_Bcast(&n, 1, MPI_INT, 0, world));
  payload.resize(static_cast<size_t>(n));
  ST_CHECK_MPI(MPI_Bcast(payload.data(), n, MPI_CHAR, 0, world));
  if (payload[0] == 'E') throw IoError(payload.substr(1));
  return payload.substr(1);
}

}  // namespace

Trainer::Trainer(const Runtime& runtime, const TrainConfig& config, TrainerOptions options)
    : runtime_(&runtime), config_(config), options_(std::move(options)), last_val_loss_(std::numeric_limits<double>::quiet_NaN()) {
  const Topology& topo = runtime.topology();
  config_.validate();
  config_.validate_for_world(topo.world_size, topo.node_count);
  options_.faults.check_ranks(topo.world_size);
  const int W = topo.world_size, rank = topo.world_rank;
  resolved_toml_ = to_toml(config_);
  check_ranks_agree_on_config(runtime.world(), resolved_toml_);  // before any collective a difference could mismatch

  const bool eval_only = options_.evaluation_only;
  if (!eval_only) {
    run_dir_ = make_run_dir(config_, runtime.world(), rank);
    failure_record::enable(run_dir_, runtime.world());  // a fatal error from here on leaves RUN_DIR/failures/rank_N.json
  }
  if (rank == 0 && !eval_only) {
    std::ofstream out(fs::path(run_dir_) / "config.toml");
    out << "# resolved configuration of this run (" << options_.config_source << ")\n" << resolved_toml_;
    if (!out) throw IoError(fmt::format("{}/config.toml: cannot write the resolved configuration", run_dir_));
  }

  // The datasets (data.path, or each source of data.mixture): every rank maps them and checks each against
  // the model; the loader checks that a mixture's sources share one tokenizer.
  sources_ = open_data_sources(config_);
  check_ranks_agree_on_data(runtime.world(), sources_);

  // The peak MFU is reported against (mfu.hpp): on a GPU its datasheet figure, with a bf16 matmul measured
  // through the backend itself beside it; on the CPU the best of several sgemms at the step's thread count,
  // before the backend sets its thread count, bounded by the CPU's ceiling. Evaluation reports no MFU.
  const bool on_gpu = runtime.device().is_cuda();
  const int threads = runtime.host_threads();
  ops_ = on_gpu ? ops::make_cuda_ops() : nullptr;
  if (!eval_only) {
    // logging.peak_flops set: nothing is measured (the tests set it to start faster).
    double gflops = config_.logging.peak_flops > 0 ? 0.0
                    : on_gpu ? ops::measure_matmul_flops(*ops_, DType::BF16, 8192, 5) * 1e-9
                             : ops::measure_cpu_sgemm(threads, 1024, 5).best_gflops;
    ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &gflops, 1, MPI_DOUBLE, MPI_SUM, runtime.world()));
    const ops::CpuCeiling ceiling = on_gpu ? ops::CpuCeiling{} : ops::cpu_fp32_ceiling(threads);
    // The ranks' mean, so every rank reports the same MFU.
    mfu_ = MfuMeter::choose(config_.logging.peak_flops, on_gpu, runtime.device().name, gflops / W * 1e9, ceiling.flops_per_s,
                            ceiling.how);
  }
  if (!on_gpu) ops_ = ops::make_cpu_ops({threads});
  ops_->defer_loss(true);  // the losses of a step's micro-batches are read once, after the last one

  mesh_ = std::make_unique<DeviceMesh>(runtime.world(), topo, MeshSpec{config_.fsdp.engine.strategy, config_.fsdp.engine.shard_size});
  const CommBackendChoice backend = choose_comm_backend(runtime, config_.fsdp.comm_backend);
  comms_ = std::make_unique<MeshComms>(*mesh_, backend.backend, on_gpu ? MemorySpace::Device : MemorySpace::Host);
  watchdog_ = std::make_unique<CollectiveWatchdog>(std::chrono::duration<double>(config_.fsdp.collective_timeout));
  comms_->set_watchdog(watchdog_.get());
  model::ModelOptions mopts;
  mopts.activation_dtype = config_.fsdp.engine.param_dtype;
  mopts.checkpointing = config_.fsdp.engine.activation_checkpointing ? model::Checkpointing::PerLayer : model::Checkpointing::None;
  model_ = std::make_unique<model::LlamaModel>(config_.model, *ops_, mopts);
  engine_ = std::make_unique<fsdp::FsdpEngine>(*model_, *mesh_, *comms_, *ops_, config_.fsdp.engine, ledger_);
  engine_->set_watchdog(watchdog_.get());
  engine_->initialize(config_.model.init_seed);  // and sync_module_states when the config asks for it
  if (!eval_only) {
    adamw_ = std::make_unique<optim::AdamW>(*engine_, config_.optim.adamw, &ledger_);
    // CPU offload on a GPU: the host update runs beside the next forward, each unit's upload waiting for its
    // own shard only (optim::AdamW::step_async). On the CPU backend the cores are the compute: no overlap.
    async_update_ = on_gpu && config_.fsdp.engine.offload_params;
    if (async_update_) engine_->set_pending_writes(adamw_.get());
    adamw_->set_async_delay(std::chrono::milliseconds(options_.faults.slow_update_ms));
  }

  // Every rank of the mesh is a data-parallel rank.
  micro_batch_ = config_.micro_batch_size_for(W);
  accumulation_ = config_.accumulation_steps_for(W);
  data::LoaderOptions lo;
  lo.split = data::DatasetSplit::Train;
  lo.layout = config_.data.layout;
  lo.seq_len = config_.data.seq_len;
  lo.micro_batch_size = micro_batch_;
  lo.global_batch_size = config_.data.global_batch_size;
  lo.dp_rank = rank;
  lo.dp_size = W;
  lo.seed = config_.data.seed;
  lo.shuffle = config_.data.shuffle;
  lo.prefetch = static_cast<size_t>(config_.data.prefetch);
  if (!eval_only) loader_ = std::make_unique<data::Loader>(sources_, lo);

  if (config_.schedule.eval_batches > 0 || eval_only) {
    data::LoaderOptions eo = lo;
    eo.split = eval_only ? options_.eval_split : data::DatasetSplit::Validation;
    eo.global_batch_size = micro_batch_ * W;
    eo.shuffle = false;
    eo.prefetch = 2;
    // Each source's validation split on its own (so a mixture reports a loss per source); a source with
    // fewer held-out samples than one evaluation batch is left out, with a warning.
    const bool mixed = sources_.size() > 1;
    for (const auto& c : sources_) {
      const std::string& path = c.dataset->path();
      size_t samples = 0;
      try {
        samples = data::SampleSource(*c.dataset, eo.split, eo.layout, eo.seq_len).num_samples();
      } catch (const DataError& e) {
        log::warn("train: {}: {}", e.what(), mixed ? "the validation loss leaves this source out" : "no validation loss");
        continue;
      }
      if (samples < static_cast<size_t>(eo.global_batch_size)) {
        log::warn("{}: the {} split of {} has {} samples, fewer than one evaluation batch of {}: {}", eval_only ? "evaluate" : "train",
                  data::dataset_split_name(eo.split), path, samples, eo.global_batch_size,
                  eval_only ? "not evaluated" : mixed ? "the validation loss leaves this source out" : "no validation loss");
        continue;
      }
      EvalSource e;
      e.loader = std::make_unique<data::Loader>(c.dataset, eo);
      const auto per_epoch = static_cast<int64_t>(e.loader->micro_batches_per_epoch());
      const int64_t wanted = eval_only ? options_.eval_micro_batches : config_.schedule.eval_batches;
      e.micro_batches = wanted > 0 ? std::min<int64_t>(wanted, per_epoch) : per_epoch;
      e.weight = c.weight;
      eval_sources_.push_back(std::move(e));
    }
    if (eval_only && eval_sources_.empty())
      throw DataError(fmt::format("{}: no source has {} {} samples, one evaluation batch (micro-batch {} x {} ranks)", config_.data.describe(),
                                  eo.global_batch_size, data::dataset_split_name(eo.split), micro_batch_, W));
    if (mixed && eval_sources_.empty()) log::warn("train: no validation loss: no source has enough validation samples");
  }
  if (eval_only) {
    progress_ = std::make_unique<ProgressView>(config_.logging, 0, false);
    return;
  }
  const int64_t steps_per_epoch = static_cast<int64_t>(loader_->sampler().global_batches_per_epoch());

  // The run's length: the first of max_steps, max_tokens, epochs.
  tokens_per_step_ = static_cast<int64_t>(config_.data.global_batch_size) * config_.data.seq_len;
  total_steps_ = planned_steps(config_, steps_per_epoch);
  schedule_ = std::make_unique<optim::LrSchedule>(config_.schedule.lr, config_.optim.adamw.lr, total_steps_);
  flops_per_token_ = flops_per_token(model_->spec(), config_.data.seq_len);

  if (rank == 0) {
    metrics_ = std::make_unique<MetricsWriter>((fs::path(run_dir_) / config_.logging.metrics_file).string(),
                                               config_.logging.tensorboard ? run_dir_ : std::string());
    log::info("train: resolved configuration ({}):\n{}", options_.config_source, resolved_toml_);
    log::info("train: model {:.2f}M parameters ({:.3g} GFLOP per token), mesh {} x {} ({}), {} ranks x micro-batch {} x {} "
              "accumulation = {} sequences of {} tokens per step; {} steps ({} per epoch of {}); MFU against {}; "
              "device {}, collectives over {}; {} host thread(s) per rank; run directory {}",
              static_cast<double>(model_->spec().num_params()) / 1e6, flops_per_token_ / 1e9, mesh_->replicate_size(), mesh_->shard_size(),
              sharding_strategy_name(config_.fsdp.engine.strategy), W, micro_batch_, accumulation_, config_.data.global_batch_size,
              config_.data.seq_len, total_steps_, steps_per_epoch, config_.data.describe(), mfu_.label(), runtime.device().describe(), backend.describe(),
              runtime.host_threads(), run_dir_);
  }
  if (rank == 0 && sources_.size() > 1) {
    const data::MixedSource& mix = loader_->source();
    for (size_t k = 0; k < mix.size(); ++k)
      log::info("train: data source {} ({}): {}", k, mix.dataset(k).path(), mix.share(k));
  }
  progress_ = std::make_unique<ProgressView>(config_.logging, total_steps_, rank == 0);
  timeline_ = std::make_unique<StepTimeline>(on_gpu);
}

Trainer::~Trainer() = default;

void Trainer::add_hooks(TrainerHooks* hooks) { hooks_.push_back(hooks); }

optim::AdamW& Trainer::optimizer() {
  if (!adamw_) throw InternalError("train: an evaluation-only trainer has no optimizer");
  adamw_->wait();
  return *adamw_;
}

std::vector<Trainer::EvalPlan> Trainer::eval_plan() const {
  std::vector<EvalPlan> plan;
  for (const EvalSource& e : eval_sources_)
    plan.push_back({e.loader->source().dataset(0).path(), e.micro_batches,
                    e.micro_batches * micro_batch_ * runtime_->topology().world_size,
                    static_cast<int64_t>(e.loader->source().num_samples()), e.weight});
  return plan;
}

void Trainer::restore(const TrainerState& s) {
  if (options_.evaluation_only) throw InternalError("train: restore() on an evaluation-only trainer");
  state_ = s;
  // The saved position in samples, which mean the same data at any world size and micro-batch size; the
  // micro-batch index only where the checkpoint predates the sample count.
  if (s.sampler_samples >= 0) {
    const data::DistributedSampler& sampler = loader_->sampler();
    const auto samples = static_cast<uint64_t>(s.sampler_samples);
    state_.sampler = sampler.position_after(s.sampler.epoch, samples);
    const uint64_t here = sampler.samples_before(state_.sampler);
    if (state_.sampler.epoch != s.sampler.epoch)
      log::warn("train: the checkpoint stopped {} samples into epoch {}, past this run's epoch of {}: starting epoch {}", samples,
                s.sampler.epoch, sampler.micro_batches_per_epoch() * sampler.samples_before({0, 1}), state_.sampler.epoch);
    else if (here != samples)
      log::warn("train: the checkpoint stopped {} samples into epoch {}, not a multiple of this run's {} per micro-step "
                "(data.global_batch_size changed?): resuming at sample {}", samples, s.sampler.epoch, sampler.samples_before({0, 1}), here);
    else if (state_.sampler.index != s.sampler.index)
      log::info("train: resuming {} samples into epoch {}: micro-batch {} at this run's {} ranks x {} sequences ({} in the saving run)",
                samples, s.sampler.epoch, state_.sampler.index, sampler.options().dp_size, sampler.options().micro_batch_size,
                s.sampler.index);
    state_.sampler_samples = static_cast<int64_t>(sampler.samples_before(state_.sampler));
  }
  loader_->seek(state_.sampler);
  adamw_->set_steps(s.optimizer_steps);
}

}  // namespace shardtrain::train
