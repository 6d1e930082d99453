// TrainConfig validation: the one place a configuration is checked (config.hpp).
#include "shardtrain/train/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "shardtrain/mesh/mesh_layout.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/run_dir.hpp"

namespace shardtrain::train {

namespace {

void expect(bool ok, std::string_view key, const std::string& what) {
  if (!ok) throw ConfigError(fmt::format("{}: {}", key, what));
}

// Beyond 2^50 parameters (16 PiB of fp32 training state) no machine holds a model, and element counts near
// 2^53 lose exactness in double: such sizes are mistakes, refused before any spec or buffer is built.
constexpr double kMaxParameters = 1125899906842624.0;  // 2^50
constexpr int64_t kMaxLayers = 65536;

}  // namespace

// The size key that makes a model too large: the one furthest above its usual value (LlamaConfig's defaults).
std::string largest_model_size_key(const model::LlamaConfig& m) {
  const model::LlamaConfig usual;
  struct Size {
    const char* key;
    int64_t value, usual;
  };
  const Size sizes[] = {{"num_hidden_layers", m.num_hidden_layers, usual.num_hidden_layers},
                        {"hidden_size", m.hidden_size, usual.hidden_size},
                        {"intermediate_size", m.intermediate_size, usual.intermediate_size},
                        {"vocab_size", m.vocab_size, usual.vocab_size},
                        {"max_position_embeddings", m.max_position_embeddings, usual.max_position_embeddings}};
  const auto ratio = [](const Size& s) { return static_cast<double>(s.value) / static_cast<double>(s.usual); };
  const Size& top = *std::max_element(std::begin(sizes), std::end(sizes),
                                      [&](const Size& x, const Size& y) { return ratio(x) < ratio(y); });
  return fmt::format("model.{} = {}", top.key, top.value);
}

double model_parameter_estimate(const model::LlamaConfig& model) {
  // (V, D) embedding, (D) final norm, (V, D) lm_head unless tied; per layer: two (D) norms, q and o (D, D),
  // k and v (kv_dim, D), gate, up and down (I, D).
  const auto d = static_cast<double>(model.hidden_size), v = static_cast<double>(model.vocab_size);
  const double kv_dim = static_cast<double>(model.num_key_value_heads) * d / static_cast<double>(model.num_attention_heads);
  const double layer = 2 * d + 2 * d * d + 2 * d * kv_dim + 3 * d * static_cast<double>(model.intermediate_size);
  return v * d * (model.tie_word_embeddings ? 1 : 2) + d + static_cast<double>(model.num_hidden_layers) * layer;
}

void validate_model_size(const model::LlamaConfig& model) {
  // The model's description (its units, their tensors) is built per layer before any memory estimate can run.
  expect(model.num_hidden_layers <= kMaxLayers, "model.num_hidden_layers",
         fmt::format("{} is beyond the {} layers a model may have (the deepest trained ones have a few hundred)",
                     model.num_hidden_layers, kMaxLayers));
  expect(model.max_position_embeddings <= std::numeric_limits<int32_t>::max(), "model.max_position_embeddings",
         fmt::format("{} is beyond the int32 positions the model computes with (at most {})", model.max_position_embeddings,
                     std::numeric_limits<int32_t>::max()));
  if (const double params = model_parameter_estimate(model); params > kMaxParameters)
    throw ConfigError(
        fmt::format("{}: the model would have {:.3g} parameters, more than the 2^50 = {:.3g} any machine could hold "
                    "(16 bytes each in training)",
                    largest_model_size_key(model), params, kMaxParameters));
}

double TrainConfig::parameter_estimate() const { return model_parameter_estimate(model); }

void TrainConfig::validate_memory(int shard_ranks, double memory_bytes, std::string_view memory_name) const {
  const double params = parameter_estimate();
  // fp32 weights, gradients and both Adam moments: a lower bound (no buffers, no activations).
  const double state = 16 * params / std::max(shard_ranks, 1);
  if (state <= memory_bytes) return;
  throw ConfigError(
      fmt::format("{}: the model has {:.3g} parameters, whose fp32 weights, gradients and Adam state take "
                  "{} per rank over {} shard rank(s); {} has {} for this rank",
                  largest_model_size_key(model), params, format_bytes(static_cast<uint64_t>(std::min(state, 1.8e19))),
                  shard_ranks, memory_name, format_bytes(static_cast<uint64_t>(memory_bytes))));
}

namespace {

// Two spellings of one dataset ("data.h5", "./data.h5", a symbolic link to it): one file when both exist,
// else the same absolute path once "." and ".." are resolved.
bool same_dataset_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a == b) return true;
  std::error_code ea, eb;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ea) && !ea;
  return fs::absolute(a, ea).lexically_normal() == fs::absolute(b, eb).lexically_normal();
}

}  // namespace

std::vector<data::MixtureEntry> DataSection::sources() const {
  if (mixture.empty()) return {data::MixtureEntry{path, 1.0}};
  return parse_mixture(mixture, [](size_t i) { return fmt::format("data.mixture[{}]", i); });
}

std::vector<data::MixtureEntry> parse_mixture(const std::vector<std::string>& entries,
                                              const std::function<std::string(size_t)>& field_of) {
  std::vector<data::MixtureEntry> out;
  double weight_sum = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string field = field_of(i);
    out.push_back(data::parse_mixture_entry(entries[i], field));
    weight_sum += out.back().weight;
    for (size_t j = 0; j < i; ++j) {
      if (out[j].path == out.back().path)
        throw ConfigError(
            fmt::format("{}: {} is listed twice (as {} too); give it one weight", field, out.back().path, field_of(j)));
      if (same_dataset_file(out[j].path, out.back().path))
        throw ConfigError(fmt::format("{}: {} is the same file as {} ({}); give it one weight", field, out.back().path,
                                      field_of(j), out[j].path));
    }
  }
  // Only the ratios matter, but they are computed as w / sum: a sum past the largest double makes every share 0.
  expect(std::isfinite(weight_sum), "data.mixture",
         fmt::format("the weights sum to {} (each is finite, their sum is not); expected weights whose sum is a finite "
                     "number, such as 0.7 and 0.3 (only their ratios matter)",
                     weight_sum));
  return out;
}

const char* divergence_policy_name(DivergencePolicy p) { return p == DivergencePolicy::Rollback ? "rollback" : "stop"; }

std::string DataSection::describe() const {
  if (mixture.empty()) return path;
  std::vector<std::string> paths;
  for (const auto& e : sources()) paths.push_back(e.path);
  return data::describe_sources(paths);
}

namespace {

// The keys `shardtrain evaluate` reads: the model (the weights' own), the mesh and engine, the data, and the deadline
// of a load (StartupWatch's checkpoint stage). The schedule, optimizer, checkpointing, logging and the training batch
// are a training run's: a saved run config or a --config's values for them are not evaluate's to refuse.
bool used_by_evaluation(const ConfigField& f) {
  return f.section == "model" || f.section == "fsdp" || f.section == "data" ||
         (f.section == "checkpoint" && f.key == "save_timeout");
}

}  // namespace

void TrainConfig::validate_finite_floats(bool evaluation) const {
  // Every float key is a finite number ("inf" and "nan" parse as floats, and would train to non-finite weights).
  for (const ConfigField& f : config_fields())
    if (f.type == FieldType::Float && (!evaluation || used_by_evaluation(f)))
      if (const double x = std::get<double>(f.get(*this)); !std::isfinite(x))
        throw ConfigError(fmt::format("{}.{}: expected a finite number, got {}", f.section, f.key, x));
}

void TrainConfig::validate_shared() const {
  model.validate();
  validate_model_size(model);
  fsdp.engine.validate();
  if (fsdp.engine.wrap.policy == fsdp::WrapPolicy::TransformerBased)
    expect(!fsdp.engine.wrap.transformer_layer_cls.empty(), "fsdp.transformer_layer_cls_to_wrap",
           "expected at least one class for TRANSFORMER_BASED_WRAP");
  expect(fsdp.engine.wrap.min_num_params > 0, "fsdp.min_num_params",
         fmt::format("expected a positive count, got {}", fsdp.engine.wrap.min_num_params));
  expect(fsdp.num_processes >= 0, "fsdp.num_processes",
         fmt::format("expected 0 (any) or a rank count, got {}", fsdp.num_processes));
  expect(fsdp.collective_timeout >= 0, "fsdp.collective_timeout",
         fmt::format("expected 0 (no watchdog) or seconds, got {}", fsdp.collective_timeout));
  expect(fsdp.startup_timeout >= 0, "fsdp.startup_timeout",
         fmt::format("expected 0 (off) or seconds, got {}", fsdp.startup_timeout));
  expect(fsdp.num_machines >= 0, "fsdp.num_machines",
         fmt::format("expected 0 (any) or a node count, got {}", fsdp.num_machines));

  expect(!data.path.empty() || !data.mixture.empty(), "data.path",
         "expected the dataset file written by `shardtrain prepare-data` (or data.mixture: \"PATH:WEIGHT\" entries)");
  expect(data.path.empty() || data.mixture.empty(), "data.mixture",
         fmt::format("set data.path or data.mixture, not both (data.path is {})", data.path));
  (void)data.sources();  // every mixture entry parses, and none is listed twice
  expect(data.seq_len >= 1, "data.seq_len", fmt::format("expected 1 or more, got {}", data.seq_len));
  expect(data.seq_len <= model.max_position_embeddings, "data.seq_len",
         fmt::format("{} is longer than model.max_position_embeddings = {}", data.seq_len, model.max_position_embeddings));
  expect(data.micro_batch_size >= 0, "data.micro_batch_size",
         fmt::format("expected 0 (global / world) or more, got {}", data.micro_batch_size));
  expect(data.global_batch_size >= 1, "data.global_batch_size",
         fmt::format("expected 1 or more, got {}", data.global_batch_size));
  expect(std::isfinite(checkpoint.save_timeout) && checkpoint.save_timeout >= 0, "checkpoint.save_timeout",
         fmt::format("expected 0 (off) or seconds, got {}", checkpoint.save_timeout));
}

void TrainConfig::validate_for_evaluation() const {
  validate_finite_floats(true);
  validate_shared();
}

void TrainConfig::validate() const {
  validate_finite_floats(false);
  validate_shared();
  optim.adamw.validate();
  expect(std::isfinite(optim.max_grad_norm) && optim.max_grad_norm >= 0, "optim.max_grad_norm",
         fmt::format("expected 0 (no clipping) or a positive norm, got {}", optim.max_grad_norm));
  expect(optim.max_consecutive_nonfinite >= 1, "optim.max_consecutive_nonfinite",
         fmt::format("expected 1 or more, got {}", optim.max_consecutive_nonfinite));
  expect(optim.loss_spike_factor == 0 || (std::isfinite(optim.loss_spike_factor) && optim.loss_spike_factor > 1),
         "optim.loss_spike_factor", fmt::format("expected 0 (off) or a factor above 1, got {}", optim.loss_spike_factor));
  expect(optim.loss_spike_window >= 1, "optim.loss_spike_window",
         fmt::format("expected 1 or more, got {}", optim.loss_spike_window));
  expect(optim.max_rollbacks >= 0, "optim.max_rollbacks", fmt::format("expected 0 or more, got {}", optim.max_rollbacks));
  expect(optim.rollback_skip_steps >= 0, "optim.rollback_skip_steps",
         fmt::format("expected 0 or more, got {}", optim.rollback_skip_steps));
  if (optim.on_divergence == DivergencePolicy::Rollback)
    expect(checkpoint.every_n_steps > 0, "optim.on_divergence",
           "rollback goes back to the run's newest checkpoint: set checkpoint.every_n_steps to save some");

  schedule.lr.validate();
  expect(schedule.max_steps >= 0, "schedule.max_steps", fmt::format("expected 0 or more, got {}", schedule.max_steps));
  expect(schedule.max_tokens >= 0, "schedule.max_tokens", fmt::format("expected 0 or more, got {}", schedule.max_tokens));
  expect(schedule.epochs >= 0, "schedule.epochs", fmt::format("expected 0 or more, got {}", schedule.epochs));
  expect(schedule.max_steps > 0 || schedule.max_tokens > 0 || schedule.epochs > 0, "schedule.max_steps",
         "the run never ends: set at least one of schedule.max_steps, schedule.max_tokens, schedule.epochs");
  expect(schedule.eval_every >= 0, "schedule.eval_every", fmt::format("expected 0 or more, got {}", schedule.eval_every));
  expect(schedule.eval_batches >= 0, "schedule.eval_batches",
         fmt::format("expected 0 or more, got {}", schedule.eval_batches));
  expect(schedule.lr.min_lr <= optim.adamw.lr, "schedule.min_lr",
         fmt::format("{} is above the peak optim.lr {}", schedule.lr.min_lr, optim.adamw.lr));
  // A constant schedule too: its run ended inside the warmup, never at optim.lr, without a word.
  if (schedule.max_steps > 0)
    expect(
        schedule.lr.warmup_steps < schedule.max_steps, "schedule.warmup_steps",
        fmt::format("{} warmup steps leave nothing {} in schedule.max_steps = {}", schedule.lr.warmup_steps,
                    schedule.lr.kind == optim::ScheduleKind::Constant ? "at optim.lr (the warmup never ends)" : "to decay",
                    schedule.max_steps));

  if (data.micro_batch_size > 0)
    expect(data.global_batch_size % data.micro_batch_size == 0, "data.global_batch_size",
           fmt::format("{} is not a multiple of data.micro_batch_size = {}", data.global_batch_size, data.micro_batch_size));
  // Every buffer is made at start (data/loader.hpp): a few steps' worth is all the thread can use.
  expect(data.prefetch >= 1 && data.prefetch <= kMaxPrefetch, "data.prefetch",
         fmt::format("expected 1 to {} micro-batches kept ready (each is a buffer allocated at start), got {}", kMaxPrefetch,
                     data.prefetch));
  expect(!checkpoint.async_save || checkpoint.state_dict_type == StateDictType::Sharded, "checkpoint.async_save",
         "only SHARDED_STATE_DICT saves are asynchronous (FULL_STATE_DICT gathers every unit over the shard group); "
         "set checkpoint.state_dict_type = \"SHARDED_STATE_DICT\" or async_save = false");

  expect(checkpoint.every_n_steps >= 0, "checkpoint.every_n_steps",
         fmt::format("expected 0 or more, got {}", checkpoint.every_n_steps));
  expect(checkpoint.keep_last >= 0, "checkpoint.keep_last",
         fmt::format("expected 0 (all) or more, got {}", checkpoint.keep_last));
  expect(checkpoint.max_failed_saves >= 0, "checkpoint.max_failed_saves",
         fmt::format("expected 0 (the first failed save ends the run) or more, got {}", checkpoint.max_failed_saves));
  expect(checkpoint.keep_every >= 0, "checkpoint.keep_every",
         fmt::format("expected 0 (none) or more, got {}", checkpoint.keep_every));
  expect(
      checkpoint.keep_every == 0 || checkpoint.every_n_steps == 0 || checkpoint.keep_every % checkpoint.every_n_steps == 0,
      "checkpoint.keep_every",
      fmt::format(
          "{} is not a multiple of checkpoint.every_n_steps = {}: no periodic save would land on most of its milestones",
          checkpoint.keep_every, checkpoint.every_n_steps));

  expect(logging.log_every >= 1, "logging.log_every", fmt::format("expected 1 or more, got {}", logging.log_every));
  // A generated run directory is RUNS_ROOT/NAME-TIME: a name with a '/' or a ".." made it somewhere else.
  expect(logging.name.find('/') == std::string::npos, "logging.name",
         fmt::format("expected a plain name (the generated run directory is logging.runs_root/NAME-TIME), got \"{}\"",
                     logging.name));
  expect(std::isfinite(logging.peak_flops) && logging.peak_flops >= 0, "logging.peak_flops",
         fmt::format("expected 0 (the datasheet or a measured peak) or a FLOP/s figure, got {}", logging.peak_flops));
  // A plain name inside the run directory: the file is opened for appending, so a path could grow a user's file,
  // another run's, or one of the names the run directory's own files and folders have (run_dir.hpp).
  const std::string& mf = logging.metrics_file;
  expect(!mf.empty() && mf != "." && mf != ".." && mf.find('/') == std::string::npos && !is_reserved_run_dir_name(mf),
         "logging.metrics_file",
         fmt::format("expected a file name inside the run directory (no '/', and none of the names the run keeps there: "
                     "{}), got '{}'",
                     kReservedRunDirNames, mf));
  expect(!logging.runs_root.empty() || !logging.run_dir.empty(), "logging.runs_root", "expected a directory");
}

int TrainConfig::micro_batch_size_for(int world_size) const {
  return data.micro_batch_size > 0 ? data.micro_batch_size : data.global_batch_size / world_size;
}

int TrainConfig::accumulation_steps_for(int world_size) const {
  // In 64 bits: micro-batch x world passes 2^31 (and wrapped to 0, a division by zero) with a large micro-batch.
  const int64_t per_micro_step = int64_t{micro_batch_size_for(world_size)} * world_size;
  return per_micro_step > 0 ? static_cast<int>(data.global_batch_size / per_micro_step) : 0;
}

void TrainConfig::validate_mesh_for_world(int world_size, int node_count) const {
  if (fsdp.num_processes > 0 && fsdp.num_processes != world_size)
    throw ConfigError(fmt::format("fsdp.num_processes: the config expects {} processes, but MPI started {} (mpirun -np {})",
                                  fsdp.num_processes, world_size, fsdp.num_processes));
  if (fsdp.num_machines > 0 && fsdp.num_machines != node_count)
    throw ConfigError(fmt::format("fsdp.num_machines: the config expects {} machines, but the job spans {} node(s)",
                                  fsdp.num_machines, node_count));
}

void TrainConfig::validate_evaluation_for_world(int world_size, int node_count) const {
  validate_mesh_for_world(world_size, node_count);
  // An evaluation batch is a micro-batch on each rank; no global batch is accumulated.
  if (micro_batch_size_for(world_size) < 1)
    throw ConfigError(
        fmt::format("data.global_batch_size: {} sequence(s) leave none to each of {} ranks (data.micro_batch_size "
                    "= 0 takes global / ranks); set data.micro_batch_size, the sequences per rank of an "
                    "evaluation batch",
                    data.global_batch_size, world_size));
}

void TrainConfig::validate_for_world(int world_size, int node_count) const {
  validate_mesh_for_world(world_size, node_count);
  const int mb = micro_batch_size_for(world_size);
  if (data.micro_batch_size == 0 && (data.global_batch_size % world_size != 0 || mb == 0))
    throw ConfigError(fmt::format("data.global_batch_size: {} sequences cannot be split evenly over {} ranks",
                                  data.global_batch_size, world_size));
  const int64_t per_micro_step = int64_t{mb} * world_size;  // 64 bits: the product of two ints
  if (per_micro_step > data.global_batch_size)
    throw ConfigError(fmt::format(
        "data.micro_batch_size: {} sequences per rank x {} ranks = {} per micro-step, more than data.global_batch_size = "
        "{}; expected at most {} (global batch / ranks)",
        mb, world_size, per_micro_step, data.global_batch_size, data.global_batch_size / world_size));
  if (data.global_batch_size % per_micro_step != 0)
    throw ConfigError(fmt::format("data.global_batch_size: {} is not a multiple of data.micro_batch_size x world = {} x {}",
                                  data.global_batch_size, mb, world_size));
}

}  // namespace shardtrain::train
