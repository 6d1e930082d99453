// `shardtrain consolidate` and `shardtrain checkpoint info`: offline (no MPI) tools on checkpoints.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/checkpoint/export.hpp"
#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::cli {
namespace {

struct ConsolidateOptions {
  std::string checkpoint, output, format = "hdf5", dtype = "fp32", tokenizer;
  double max_shard_gib = 2.0;
  bool tokenizer_unchecked = false;
  bool max_shard_given = false;
};

// A checkpoint, or a directory of checkpoints (a run's checkpoint.dir): its newest complete one, said on stderr. A
// path that is neither stays as it is, for the reader to say what it is.
std::string checkpoint_or_newest(const std::string& path) {
  if (checkpoint::is_complete(path)) return path;
  const std::string latest = checkpoint::find_latest(path);
  if (latest.empty()) return path;
  std::fprintf(stderr, "%s: a folder of checkpoints; its newest complete one is %s\n", path.c_str(), latest.c_str());
  return latest;
}

// `work(checkpoint)` on checkpoint_or_newest(path); with a folder of checkpoints, again on its new newest (a few times)
// when the one taken lost its DONE marker while it was read: a running job's rotation (keep_last) removed it, and
// the error blamed damage ("use an older checkpoint") where a newer one stood.
template <typename Work>
int on_checkpoint_or_newest(const std::string& path, Work work) {
  for (int attempt = 1;; ++attempt) {
    const std::string chosen = checkpoint_or_newest(path);
    try {
      return work(chosen);
    } catch (const Error&) {
      std::error_code ec;
      if (chosen == path || attempt == 5 || std::filesystem::exists(std::filesystem::path(chosen) / "DONE", ec)) throw;
      std::fprintf(stderr, "%s: removed while it was read (a running job's rotation?); the folder's newest again\n",
                   chosen.c_str());
    }
  }
}

int consolidate_one(const std::string& path, const std::string& output, checkpoint::ExportOptions e);

int run_consolidate(const ConsolidateOptions& o) {
  checkpoint::ExportOptions e;
  e.format = checkpoint::parse_export_format(o.format);
  e.dtype = parse_dtype(o.dtype);
  e.tokenizer = o.tokenizer;
  if (o.tokenizer_unchecked) {
    if (o.tokenizer.empty()) throw UsageError("--tokenizer-unchecked: only with --tokenizer");
    e.tokenizer_check = checkpoint::TokenizerCheck::LoadOnly;
  }
  // Below one MiB a safetensors file would hold a handful of values; a negative or non-finite size is a typo.
  if (!(o.max_shard_gib >= 1.0 / 1024 && o.max_shard_gib <= 1024 * 1024))
    throw UsageError(fmt::format("--max-shard-gib {}: expected a file size in GiB from 0.0009765625 (1 MiB) to 1048576",
                                 o.max_shard_gib));
  e.max_shard_bytes = static_cast<uint64_t>(o.max_shard_gib * (1ull << 30));
  // One HDF5 file is never split: the option was ignored without a word.
  if (o.max_shard_given && e.format == checkpoint::ExportFormat::Hdf5)
    throw UsageError("--max-shard-gib: only with --format safetensors (--format hdf5 writes one file)");
  return on_checkpoint_or_newest(o.checkpoint, [&](const std::string& path) { return consolidate_one(path, o.output, e); });
}

int consolidate_one(const std::string& path, const std::string& output, checkpoint::ExportOptions e) {
  if (e.tokenizer.empty() && e.format == checkpoint::ExportFormat::Safetensors) {
    // The tokenizer the checkpoint names, relative to the folder its run started in: found from here too.
    try {
      const auto j = nlohmann::json::parse(checkpoint::CheckpointReader(path).tokenizer(), nullptr, false);
      const std::string recorded = j.is_object() ? j.value("path", std::string()) : std::string();
      if (const std::string found = resolve_recorded_path(recorded, path); found != recorded) e.recorded_tokenizer = found;
    } catch (const Error&) {
      // consolidate() reports an unreadable checkpoint itself
    }
  }
  const checkpoint::ExportSummary s = checkpoint::consolidate(path, output, e);
  std::printf("consolidated %s -> %s: %lld tensors, %.1f MiB in %d file(s), %s\n", path.c_str(), output.c_str(),
              static_cast<long long>(s.tensors), static_cast<double>(s.bytes) / (1 << 20), s.files, dtype_name(e.dtype));
  if (!s.tokenizer_note.empty()) std::printf("tokenizer: %s\n", s.tokenizer_note.c_str());
  return 0;
}

int info_one(const std::string& path, bool verify) {
  checkpoint::CheckpointReader r(path);
  int64_t total = 0;
  std::string out = fmt::format("checkpoint {}\n  type {}, step {}, saved by {}\n", r.path(), state_dict_type_name(r.type()),
                                r.step(), r.mesh_description());
  const model::LlamaConfig& c = r.model_config();
  out += fmt::format("  model: vocab {}, hidden {}, intermediate {}, layers {}, heads {} (kv {}), tied {}\n", c.vocab_size,
                     c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                     c.tie_word_embeddings);
  out += fmt::format("  files: {}\n  optimizer states: {} (AdamW step {})\n", fmt::join(r.files(), ", "),
                     r.has_optimizer() ? "yes" : "no", r.optimizer_steps());
  out +=
      fmt::format("  tokenizer: {}\n  trainer state: {}\n", r.tokenizer().empty() ? "-" : r.tokenizer(), r.trainer_state());
  const checkpoint::MetadataSummary& m = r.metadata();  // checked on opening: a mismatch never gets here
  if (m.files_unrecorded == 0)
    out += fmt::format("  metadata: ok ({} attributes, layouts and links in {} files match their checksums)\n", m.entries,
                       m.files_checked);
  else
    out += fmt::format("  metadata: NOT CHECKED in {} of {} files (saved before metadata checksums existed){}\n",
                       m.files_unrecorded, m.files_unrecorded + m.files_checked,
                       m.files_checked ? fmt::format("; {} entries in the others match", m.entries) : std::string());
  for (const checkpoint::TensorInfo& t : r.tensors()) {
    out += fmt::format("  {:<52} {:<14} {:>10}\n", t.name, fmt::format("({})", fmt::join(t.shape, ", ")), t.numel);
    total += t.numel;
  }
  out += fmt::format("  {} tensors, {} parameters\n", r.tensors().size(), total);
  std::fputs(out.c_str(), stdout);
  if (verify) {
    const int64_t n = r.verify_checksums();
    std::printf("  checksums: ok (%lld elements read, every chunk's Fletcher32 verified)\n", static_cast<long long>(n));
  }
  if (!r.config_toml().empty()) std::printf("  config:\n%s\n", r.config_toml().c_str());
  return 0;
}

int run_info(const std::string& path, bool verify) {
  return on_checkpoint_or_newest(path, [&](const std::string& chosen) { return info_one(chosen, verify); });
}

}  // namespace

Command add_consolidate_command(CLI::App& parent) {
  auto o = std::make_shared<ConsolidateOptions>();
  Command c;
  c.app = parent.add_subcommand("consolidate",
                                "merge a checkpoint into full tensors: one HDF5 file, or a Hugging Face directory");
  c.app->add_option("checkpoint", o->checkpoint, "a checkpoint directory (or a run's checkpoint directory: its newest)")
      ->required();
  c.app->add_option("--output,-o", o->output, "output file (hdf5) or directory (safetensors); never overwritten")
      ->required()
      ->check(outside_checkpoints_check());
  c.app->add_option("--format", o->format, "hdf5 or safetensors")->capture_default_str();
  c.app->add_option("--dtype", o->dtype, "fp32 or bf16")->check(float_dtype_check())->capture_default_str();
  c.app->add_option("--tokenizer", o->tokenizer,
                    "safetensors: tokenizer to ship, which must be the checkpoint's (default: the one it names)");
  c.app->add_flag("--tokenizer-unchecked", o->tokenizer_unchecked,
                  "ship --tokenizer without comparing it with the checkpoint's (another file form of the same vocabulary)");
  c.app->add_option("--max-shard-gib", o->max_shard_gib, "safetensors: split files above this size")->capture_default_str();
  c.launch = Launch::Offline;
  c.run = [o, app = c.app](Runtime*) {
    o->max_shard_given = app->get_option("--max-shard-gib")->count() > 0;
    return run_consolidate(*o);
  };
  return c;
}

Command add_checkpoint_command(CLI::App& parent) {
  auto path = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  Command c;
  c.app = parent.add_subcommand("checkpoint", "inspect checkpoints");
  CLI::App* info = c.app->add_subcommand("info", "print step, config, tensors and sizes; --verify reads every checksum");
  info->add_option("path", *path, "a checkpoint directory (step_N), or a directory of them (its newest complete one)")
      ->required();
  info->add_flag("--verify", *verify, "read every dataset so HDF5 verifies its Fletcher32 checksums");
  c.app->require_subcommand(1);
  c.launch = Launch::Offline;
  c.run = [path, verify](Runtime*) { return run_info(*path, *verify); };
  return c;
}

}  // namespace shardtrain::cli
