// The field table of TrainConfig (config_io.hpp): every key with its type, help and accessors. Each
// entry's accessor is one generic lambda that returns a reference into the config, for reading and writing.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/config_io.hpp"

namespace shardtrain::train {
namespace {

template <typename T>
T narrow_int(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      (v > 0 && static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
    throw ConfigError(
        fmt::format("{} does not fit ({}..{})", v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  return static_cast<T>(v);
}

struct Table {
  std::vector<ConfigField> fields;
  std::string section;

  template <typename Ref>
  void integer(std::string key, std::string help, Ref ref) {
    using T = std::remove_reference_t<decltype(ref(std::declval<TrainConfig&>()))>;
    ConfigField f{section, std::move(key), FieldType::Int, std::move(help), {}, {}};
    f.get = [ref](const TrainConfig& c) -> FieldValue { return static_cast<int64_t>(ref(c)); };
    f.set = [ref](TrainConfig& c, const FieldValue& v) {
      const int64_t x = std::get<int64_t>(v);
      if constexpr (std::is_unsigned_v<T>) {
        if (x < 0) throw ConfigError(fmt::format("expected 0 or more, got {}", x));
        ref(c) = static_cast<T>(x);
      } else {
        ref(c) = narrow_int<T>(x);
      }
    };
    fields.push_back(std::move(f));
  }
  template <typename Ref>
  void real(std::string key, std::string help, Ref ref) {
    ConfigField f{section, std::move(key), FieldType::Float, std::move(help), {}, {}};
    f.get = [ref](const TrainConfig& c) -> FieldValue { return static_cast<double>(ref(c)); };
    f.set = [ref](TrainConfig& c, const FieldValue& v) {
      const double x = std::get<double>(v);
      if (!std::isfinite(x)) throw ConfigError(fmt::format("expected a finite number, got {}", x));
      ref(c) = x;
    };
    fields.push_back(std::move(f));
  }
  template <typename Ref>
  void boolean(std::string key, std::string help, Ref ref) {
    ConfigField f{section, std::move(key), FieldType::Bool, std::move(help), {}, {}};
    f.get = [ref](const TrainConfig& c) -> FieldValue { return static_cast<bool>(ref(c)); };
    f.set = [ref](TrainConfig& c, const FieldValue& v) { ref(c) = std::get<bool>(v); };
    fields.push_back(std::move(f));
  }
  template <typename Ref>
  void text(std::string key, std::string help, Ref ref) {
    ConfigField f{section, std::move(key), FieldType::String, std::move(help), {}, {}};
    f.get = [ref](const TrainConfig& c) -> FieldValue { return std::string(ref(c)); };
    f.set = [ref](TrainConfig& c, const FieldValue& v) { ref(c) = std::get<std::string>(v); };
    fields.push_back(std::move(f));
  }
  // An enum stored as its name: parse throws ConfigError/UsageError for an unknown name.
  template <typename Ref, typename Parse, typename Name>
  void choice(std::string key, std::string help, Ref ref, Parse parse, Name name) {
    ConfigField f{section, std::move(key), FieldType::String, std::move(help), {}, {}};
    f.get = [ref, name](const TrainConfig& c) -> FieldValue { return std::string(name(ref(c))); };
    f.set = [ref, parse](TrainConfig& c, const FieldValue& v) { ref(c) = parse(std::get<std::string>(v)); };
    fields.push_back(std::move(f));
  }
  void add(ConfigField f) {
    f.section = section;
    fields.push_back(std::move(f));
  }
};

const char* progress_style_name(ProgressStyle s) {
  switch (s) {
    case ProgressStyle::Auto: return "auto";
    case ProgressStyle::Bar: return "bar";
    case ProgressStyle::Lines: return "lines";
    case ProgressStyle::Off: return "off";
  }
  return "?";
}
ProgressStyle parse_progress_style(std::string_view s) {
  for (ProgressStyle p : {ProgressStyle::Auto, ProgressStyle::Bar, ProgressStyle::Lines, ProgressStyle::Off})
    if (s == progress_style_name(p)) return p;
  throw ConfigError(fmt::format("unknown progress style '{}' (expected auto, bar, lines or off)", s));
}

DivergencePolicy parse_divergence_policy(std::string_view s) {
  for (DivergencePolicy p : {DivergencePolicy::Stop, DivergencePolicy::Rollback})
    if (s == divergence_policy_name(p)) return p;
  throw ConfigError(fmt::format("unknown divergence policy '{}' (expected stop or rollback)", s));
}

// Dtype names as configs spell them.
const char* config_dtype_name(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F32 ? "fp32" : dtype_name(t); }
// param_dtype and reduce_dtype: only what the engine computes and reduces in (the other dtypes are storage's).
DType parse_compute_dtype(const std::string& s) {
  for (const char* name : {"fp32", "f32", "float32", "float"})
    if (s == name) return DType::F32;
  for (const char* name : {"bf16", "bfloat16"})
    if (s == name) return DType::BF16;
  throw ConfigError(fmt::format("unknown or unsupported dtype '{}' (expected fp32 or bf16)", s));
}

// One field a line, as a table reads (clang-format 14 would break each lambda argument onto lines of its own).
// clang-format off
std::vector<ConfigField> build_fields() {
  Table t;
  t.section = "model";
  t.integer("vocab_size", "tokenizer vocabulary (must cover the dataset's vocab_size)", [](auto& c) -> auto& { return c.model.vocab_size; });
  t.integer("max_position_embeddings", "longest sequence (RoPE table)", [](auto& c) -> auto& { return c.model.max_position_embeddings; });
  t.integer("hidden_size", "model width D", [](auto& c) -> auto& { return c.model.hidden_size; });
  t.integer("intermediate_size", "MLP width", [](auto& c) -> auto& { return c.model.intermediate_size; });
  t.integer("num_hidden_layers", "decoder layers", [](auto& c) -> auto& { return c.model.num_hidden_layers; });
  t.integer("num_attention_heads", "query heads", [](auto& c) -> auto& { return c.model.num_attention_heads; });
  t.integer("num_key_value_heads", "key/value heads (GQA)", [](auto& c) -> auto& { return c.model.num_key_value_heads; });
  t.real("rms_norm_eps", "RMSNorm epsilon", [](auto& c) -> auto& { return c.model.rms_norm_eps; });
  t.real("rope_theta", "RoPE base", [](auto& c) -> auto& { return c.model.rope_theta; });
  t.choice("rope_scaling", "RoPE frequency scaling: default (none), linear or llama3 (Hugging Face's rope_type)",
           [](auto& c) -> auto& { return c.model.rope_scaling; }, [](const std::string& s) { return ops::parse_rope_scaling(s); },
           [](ops::RopeScaling s) { return ops::rope_scaling_name(s); });
  t.real("rope_factor", "linear and llama3 scaling: the factor", [](auto& c) -> auto& { return c.model.rope_factor; });
  t.real("rope_low_freq_factor", "llama3 scaling: low_freq_factor", [](auto& c) -> auto& { return c.model.rope_low_freq_factor; });
  t.real("rope_high_freq_factor", "llama3 scaling: high_freq_factor", [](auto& c) -> auto& { return c.model.rope_high_freq_factor; });
  t.integer("rope_original_max_position_embeddings", "llama3 scaling: the pretraining's context length",
            [](auto& c) -> auto& { return c.model.rope_original_max_position_embeddings; });
  t.boolean("tie_word_embeddings", "lm_head shares embed_tokens.weight", [](auto& c) -> auto& { return c.model.tie_word_embeddings; });
  t.integer("init_seed", "seed of the counter-based parameter init", [](auto& c) -> auto& { return c.model.init_seed; });
  t.choice("init_scheme", "reset_parameters (the seed's) or scaled", [](auto& c) -> auto& { return c.model.init_scheme; },
           [](const std::string& s) { return model::parse_init_scheme(s); }, [](model::InitScheme s) { return model::init_scheme_name(s); });
  t.real("init_std", "scaled init: standard deviation", [](auto& c) -> auto& { return c.model.init_std; });

  t.section = "fsdp";
  t.real("collective_timeout", "seconds a collective may take before the hang watchdog ends the job (0 = off)",
         [](auto& c) -> auto& { return c.fsdp.collective_timeout; });
  t.real("startup_timeout",
         "seconds a stage of the start-up may take (opening the data, NCCL's start, a resume's load excepted) before the "
         "job is ended (0 = off)",
         [](auto& c) -> auto& { return c.fsdp.startup_timeout; });
  t.choice("comm_backend", "auto (NCCL when each rank has its own GPU), mpi or nccl", [](auto& c) -> auto& { return c.fsdp.comm_backend; },
           [](const std::string& s) {
             if (s != "auto" && s != "mpi" && s != "nccl")
               throw ConfigError(fmt::format("unknown backend '{}' (expected auto, mpi or nccl)", s));
             return parse_comm_backend(s);
           },
           [](CommBackendPreference p) { return comm_backend_preference_name(p); });
  t.choice("strategy", "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 (or 1-5)",
           [](auto& c) -> auto& { return c.fsdp.engine.strategy; },
           [](const std::string& s) { return parse_sharding_strategy(s); }, [](ShardingStrategy s) { return sharding_strategy_name(s); });
  t.integer("shard_size", "hybrid: ranks per shard group (0 = ranks per node)", [](auto& c) -> auto& { return c.fsdp.engine.shard_size; });
  {
    ConfigField f{"", "reshard_after_forward", FieldType::BoolOrAuto, "true, false, or \"auto\" (the strategy's)", {}, {}};
    f.get = [](const TrainConfig& c) -> FieldValue {
      if (!c.fsdp.engine.reshard_after_forward) return std::string("auto");
      return *c.fsdp.engine.reshard_after_forward;
    };
    f.set = [](TrainConfig& c, const FieldValue& v) {
      if (std::holds_alternative<bool>(v)) c.fsdp.engine.reshard_after_forward = std::get<bool>(v);
      else c.fsdp.engine.reshard_after_forward.reset();
    };
    t.add(std::move(f));
  }
  t.choice("auto_wrap_policy", "TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP", [](auto& c) -> auto& { return c.fsdp.engine.wrap.policy; },
           [](const std::string& s) { return fsdp::parse_wrap_policy(s); }, [](fsdp::WrapPolicy p) { return fsdp::wrap_policy_name(p); });
  {
    ConfigField f{"", "transformer_layer_cls_to_wrap", FieldType::StringList,
                  "module classes that start a unit: LlamaDecoderLayer, LlamaAttention, LlamaMLP, Embedding", {}, {}};
    f.get = [](const TrainConfig& c) -> FieldValue {
      std::vector<std::string> out;
      for (auto m : c.fsdp.engine.wrap.transformer_layer_cls) out.emplace_back(model::module_class_name(m));
      return out;
    };
    f.set = [](TrainConfig& c, const FieldValue& v) {
      std::vector<model::ModuleClass> cls;
      for (const auto& s : std::get<std::vector<std::string>>(v)) cls.push_back(model::parse_module_class(s));
      c.fsdp.engine.wrap.transformer_layer_cls = std::move(cls);
    };
    t.add(std::move(f));
  }
  t.integer("min_num_params", "SIZE_BASED_WRAP: elements per unit", [](auto& c) -> auto& { return c.fsdp.engine.wrap.min_num_params; });
  t.choice("param_dtype", "fp32 or bf16: gathered and computed with", [](auto& c) -> auto& { return c.fsdp.engine.param_dtype; },
           parse_compute_dtype, config_dtype_name);
  t.choice("reduce_dtype", "fp32 or bf16: gradients reduced in", [](auto& c) -> auto& { return c.fsdp.engine.reduce_dtype; },
           parse_compute_dtype, config_dtype_name);
  t.boolean("offload_params", "master, grad and Adam shards in host memory", [](auto& c) -> auto& { return c.fsdp.engine.offload_params; });
  t.integer("forward_prefetch", "units gathered ahead in forward", [](auto& c) -> auto& { return c.fsdp.engine.forward_prefetch; });
  t.integer("backward_prefetch", "units gathered ahead in backward", [](auto& c) -> auto& { return c.fsdp.engine.backward_prefetch; });
  t.choice("grad_accumulation", "reduce_each, all_reduce_last or no_sync", [](auto& c) -> auto& { return c.fsdp.engine.accumulation; },
           [](const std::string& s) { return fsdp::parse_grad_accumulation(s); },
           [](fsdp::GradAccumulation g) { return fsdp::grad_accumulation_name(g); });
  t.boolean("activation_checkpointing", "recompute each decoder layer in backward",
            [](auto& c) -> auto& { return c.fsdp.engine.activation_checkpointing; });
  t.boolean("grads_in_activation_memory", "gradient shards in activation memory backward is done with (one micro-batch per step)",
            [](auto& c) -> auto& { return c.fsdp.engine.grads_in_activation_memory; });
  t.boolean("sync_module_states", "broadcast replica 0's shards after init", [](auto& c) -> auto& { return c.fsdp.engine.sync_module_states; });
  t.integer("num_processes", "expected MPI world size (0 = any)", [](auto& c) -> auto& { return c.fsdp.num_processes; });
  t.integer("num_machines", "expected node count (0 = any)", [](auto& c) -> auto& { return c.fsdp.num_machines; });

  t.section = "optim";
  t.real("lr", "peak learning rate", [](auto& c) -> auto& { return c.optim.adamw.lr; });
  t.real("beta1", "AdamW beta1", [](auto& c) -> auto& { return c.optim.adamw.beta1; });
  t.real("beta2", "AdamW beta2", [](auto& c) -> auto& { return c.optim.adamw.beta2; });
  t.real("eps", "AdamW epsilon", [](auto& c) -> auto& { return c.optim.adamw.eps; });
  t.real("weight_decay", "decoupled weight decay", [](auto& c) -> auto& { return c.optim.adamw.weight_decay; });
  t.choice("decay", "all, exempt_norms (transformers' Trainer) or exempt_norms_and_embeddings",
           [](auto& c) -> auto& { return c.optim.adamw.decay; }, [](const std::string& s) { return optim::parse_decay_scope(s); },
           [](optim::DecayScope d) { return optim::decay_scope_name(d); });
  t.real("max_grad_norm", "clip the global grad norm to this (0 = off)", [](auto& c) -> auto& { return c.optim.max_grad_norm; });
  t.integer("max_consecutive_nonfinite", "skipped steps in a row (non-finite, or loss spikes) that make a divergence",
            [](auto& c) -> auto& { return c.optim.max_consecutive_nonfinite; });
  t.real("loss_spike_factor", "skip a step whose loss exceeds this x the recent mean (0 = off; else > 1)",
         [](auto& c) -> auto& { return c.optim.loss_spike_factor; });
  t.integer("loss_spike_window", "updated steps in the recent mean of loss_spike_factor", [](auto& c) -> auto& { return c.optim.loss_spike_window; });
  t.choice("on_divergence", "stop (exit 9) or rollback (to the newest checkpoint, skipping the data since)",
           [](auto& c) -> auto& { return c.optim.on_divergence; }, [](const std::string& s) { return parse_divergence_policy(s); },
           divergence_policy_name);
  t.integer("max_rollbacks", "rollbacks in the run's life before a divergence stops it", [](auto& c) -> auto& { return c.optim.max_rollbacks; });
  t.integer("rollback_skip_steps", "global batches skipped past the diverged step's data on a rollback",
            [](auto& c) -> auto& { return c.optim.rollback_skip_steps; });

  t.section = "schedule";
  t.choice("kind", "cosine, constant, linear or wsd", [](auto& c) -> auto& { return c.schedule.lr.kind; },
           [](const std::string& s) { return optim::parse_schedule_kind(s); }, [](optim::ScheduleKind k) { return optim::schedule_kind_name(k); });
  t.integer("warmup_steps", "linear warmup steps", [](auto& c) -> auto& { return c.schedule.lr.warmup_steps; });
  t.real("warmup_start_factor", "warmup starts at this fraction of lr, in [0, 1] (0: transformers' warmups)", [](auto& c) -> auto& { return c.schedule.lr.warmup_start_factor; });
  t.real("min_lr", "the decay's floor (eta_min)", [](auto& c) -> auto& { return c.schedule.lr.min_lr; });
  t.integer("decay_steps", "wsd: final decay length (0 = 20% of the steps after warmup)", [](auto& c) -> auto& { return c.schedule.lr.decay_steps; });
  t.integer("max_steps", "stop after this many optimizer steps (0 = no limit)", [](auto& c) -> auto& { return c.schedule.max_steps; });
  t.integer("max_tokens", "stop after this many input tokens (0 = no limit)", [](auto& c) -> auto& { return c.schedule.max_tokens; });
  t.integer("epochs", "stop after this many passes over the train split (0 = no limit)", [](auto& c) -> auto& { return c.schedule.epochs; });
  t.integer("eval_every", "validation loss every N steps (0 = only at the end)", [](auto& c) -> auto& { return c.schedule.eval_every; });
  t.integer("eval_batches", "micro-batches per rank per evaluation (0 = never evaluate)",
            [](auto& c) -> auto& { return c.schedule.eval_batches; });

  t.section = "data";
  t.text("path", "the prepared dataset (HDF5 from prepare-data)", [](auto& c) -> auto& { return c.data.path; });
  {
    ConfigField f{"", "mixture", FieldType::StringList,
                  "instead of path: several prepared datasets sampled in shares, \"PATH:WEIGHT\" each", {}, {}};
    f.get = [](const TrainConfig& c) -> FieldValue { return c.data.mixture; };
    f.set = [](TrainConfig& c, const FieldValue& v) { c.data.mixture = std::get<std::vector<std::string>>(v); };
    t.add(std::move(f));
  }
  t.choice("layout", "packed or padded", [](auto& c) -> auto& { return c.data.layout; },
           [](const std::string& s) {
             try {
               return data::parse_batch_layout(s);
             } catch (const Error& e) {
               throw ConfigError(e.what());
             }
           },
           [](data::BatchLayout l) { return data::batch_layout_name(l); });
  t.boolean("document_mask", "packed: attention and positions restart at each document (false: causal over the row)",
            [](auto& c) -> auto& { return c.data.document_mask; });
  t.integer("seq_len", "tokens per sequence", [](auto& c) -> auto& { return c.data.seq_len; });
  t.integer("micro_batch_size", "sequences per rank per micro-batch (0 = global / world)", [](auto& c) -> auto& { return c.data.micro_batch_size; });
  t.integer("global_batch_size", "sequences per optimizer step", [](auto& c) -> auto& { return c.data.global_batch_size; });
  t.integer("seed", "sampler shuffle seed", [](auto& c) -> auto& { return c.data.seed; });
  t.boolean("shuffle", "shuffle samples each epoch", [](auto& c) -> auto& { return c.data.shuffle; });
  t.integer("prefetch", "micro-batches the loader keeps ready", [](auto& c) -> auto& { return c.data.prefetch; });

  t.section = "checkpoint";
  t.text("dir", "checkpoint directory (\"\" = <run_dir>/checkpoints)", [](auto& c) -> auto& { return c.checkpoint.dir; });
  t.integer("every_n_steps", "save every N steps (0 = never periodically)", [](auto& c) -> auto& { return c.checkpoint.every_n_steps; });
  t.integer("keep_last", "checkpoints kept (0 = all)", [](auto& c) -> auto& { return c.checkpoint.keep_last; });
  t.integer("keep_every", "also keep every checkpoint whose step is a multiple of N (0 = none)",
            [](auto& c) -> auto& { return c.checkpoint.keep_every; });
  t.integer("max_failed_saves", "periodic saves that may fail in a row while training goes on (0 = the first ends the run)",
            [](auto& c) -> auto& { return c.checkpoint.max_failed_saves; });
  t.real("save_timeout", "seconds a save may take before the job is ended: a stuck file system (0 = off)",
         [](auto& c) -> auto& { return c.checkpoint.save_timeout; });
  t.choice("state_dict_type", "SHARDED_STATE_DICT or FULL_STATE_DICT", [](auto& c) -> auto& { return c.checkpoint.state_dict_type; },
           [](const std::string& s) { return parse_state_dict_type(s); }, [](StateDictType s) { return state_dict_type_name(s); });
  t.text("resume", "\"\" (fresh), \"auto\" (newest in dir) or a checkpoint path", [](auto& c) -> auto& { return c.checkpoint.resume; });
  t.text("init_from", "weights to start from (checkpoint, consolidated .h5 or Hugging Face directory)",
         [](auto& c) -> auto& { return c.checkpoint.init_from; });
  t.boolean("cpu_ram_efficient_loading", "init_from: one rank per node reads, the others receive",
            [](auto& c) -> auto& { return c.checkpoint.cpu_ram_efficient_loading; });
  t.boolean("async_save", "periodic SHARDED_STATE_DICT saves: snapshot to host memory, write while training goes on",
            [](auto& c) -> auto& { return c.checkpoint.async_save; });

  t.section = "logging";
  t.text("name", "run name (\"\" = the config file's stem; a plain name, no '/')", [](auto& c) -> auto& { return c.logging.name; });
  t.text("run_dir", "run directory (\"\" = <runs_root>/<name>-<timestamp>)", [](auto& c) -> auto& { return c.logging.run_dir; });
  t.text("runs_root", "where run directories are made", [](auto& c) -> auto& { return c.logging.runs_root; });
  t.integer("log_every", "plain progress lines every N steps", [](auto& c) -> auto& { return c.logging.log_every; });
  t.choice("progress", "auto (bar on a terminal, lines otherwise), bar, lines or off", [](auto& c) -> auto& { return c.logging.progress; },
           [](const std::string& s) { return parse_progress_style(s); }, progress_style_name);
  t.text("metrics_file", "JSON lines, inside the run directory", [](auto& c) -> auto& { return c.logging.metrics_file; });
  t.boolean("tensorboard", "also TensorBoard event files (events.out.tfevents.*) in the run directory",
            [](auto& c) -> auto& { return c.logging.tensorboard; });
  t.real("peak_flops", "per-rank peak FLOP/s for MFU (0 = a GPU's datasheet figure, else the best of several measured matmuls)", [](auto& c) -> auto& { return c.logging.peak_flops; });
  return std::move(t.fields);
}
// clang-format on

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = build_fields();  // immutable after first use
  return fields;
}

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = {"model", "fsdp", "optim", "schedule", "data", "checkpoint", "logging"};
  return sections;
}

const ConfigField* find_config_field(std::string_view section, std::string_view key) {
  for (const ConfigField& f : config_fields())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

}  // namespace shardtrain::train
