// A run's inputs, opened and checked the same way by the Trainer and by `shardtrain check`.
#include "shardtrain/train/inputs.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/optim/schedule.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/config_io.hpp"

namespace fs = std::filesystem;

namespace shardtrain::train {

std::vector<data::MixtureComponent> open_data_sources(const TrainConfig& c) {
  std::vector<data::MixtureComponent> out;
  for (const data::MixtureEntry& e : c.data.sources()) {
    auto ds = std::make_shared<data::TokenDataset>(data::TokenDataset::open(e.path));
    if (ds->info().vocab_size > c.model.vocab_size)
      throw ConfigError(
          fmt::format("model.vocab_size: {} is smaller than the vocabulary of {} ({}, tokenizer {}); expected at least {}",
                      c.model.vocab_size, e.path, ds->info().vocab_size, ds->info().tokenizer_name, ds->info().vocab_size));
    out.push_back({std::move(ds), e.weight});
  }
  return out;
}

int64_t planned_steps(const TrainConfig& c, int64_t steps_per_epoch) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t tokens_per_step = static_cast<int64_t>(c.data.global_batch_size) * c.data.seq_len;  // < 2^62
  // The run's tokens are counted in int64 (TrainerState::tokens_seen, metrics): its last step's count must fit.
  const int64_t most_steps = kMax / tokens_per_step;
  int64_t steps = kMax;
  std::string_view key = "schedule.max_steps";  // the limit reached first (validate() requires one)
  bool limited = false;
  const auto limit = [&](int64_t s, std::string_view k) {
    if (!limited || s < steps) steps = s, key = k, limited = true;
  };
  if (c.schedule.max_steps > 0) limit(c.schedule.max_steps, "schedule.max_steps");
  if (c.schedule.max_tokens > 0) {  // rounded up, without the overflow of max_tokens + tokens_per_step - 1
    const int64_t s = c.schedule.max_tokens / tokens_per_step + (c.schedule.max_tokens % tokens_per_step != 0 ? 1 : 0);
    limit(s, "schedule.max_tokens");
  }
  if (c.schedule.epochs > 0) {  // saturated: epochs x steps per epoch may pass 2^63
    const int64_t s = steps_per_epoch <= 0                         ? 0
                      : c.schedule.epochs > kMax / steps_per_epoch ? kMax
                                                                   : c.schedule.epochs * steps_per_epoch;
    limit(s, "schedule.epochs");
  }
  if (steps <= most_steps) return steps;
  const std::string per_step = fmt::format("{} tokens (data.global_batch_size x data.seq_len)", tokens_per_step);
  const char* beyond = "more tokens than the 2^63 - 1 a run can count";
  if (key == "schedule.max_tokens")
    throw ConfigError(fmt::format("schedule.max_tokens: {} rounds up to {} steps of {}, {}; expected at most {}",
                                  c.schedule.max_tokens, steps, per_step, beyond, most_steps * tokens_per_step));
  if (key == "schedule.epochs")
    throw ConfigError(fmt::format("schedule.epochs: {} epochs of {} steps of {} are {}; expected at most {}",
                                  c.schedule.epochs, steps_per_epoch, per_step, beyond, most_steps / steps_per_epoch));
  throw ConfigError(fmt::format("schedule.max_steps: {} steps of {} are {}; expected at most {}", c.schedule.max_steps,
                                per_step, beyond, most_steps));
}

int64_t global_batches_per_epoch(const TrainConfig& c, const std::vector<data::MixtureComponent>& sources) {
  uint64_t samples = 0;
  std::vector<std::string> paths;
  for (const auto& s : sources) {
    samples += data::SampleSource(*s.dataset, data::DatasetSplit::Train, c.data.layout, c.data.seq_len).num_samples();
    paths.push_back(s.dataset->path());
  }
  const auto global = static_cast<uint64_t>(c.data.global_batch_size);
  if (samples < global)  // as the loader says it (data::MixedSource::require_global_batch)
    throw DataError(fmt::format("{}: the train split has {} samples of {} tokens, fewer than one global batch of {}",
                                data::describe_sources(paths), samples, c.data.seq_len, global));
  return static_cast<int64_t>(samples / global);  // drop_last
}

int64_t check_run_length(const TrainConfig& c, const std::vector<data::MixtureComponent>& sources) {
  const int64_t per_epoch = global_batches_per_epoch(c, sources);
  const int64_t total = planned_steps(c, per_epoch);
  // A rollback seeks past rollback_skip_steps global batches: more than the run or an epoch holds is a slip.
  const int64_t most = std::max(total, per_epoch);
  if (c.optim.on_divergence == DivergencePolicy::Rollback && c.optim.rollback_skip_steps > most)
    throw ConfigError(fmt::format(
        "optim.rollback_skip_steps: {} global batches to skip after a rollback, more than this run's {} steps and an "
        "epoch's {} global batches; expected at most {}",
        c.optim.rollback_skip_steps, total, per_epoch, most));
  // The schedule over that length (a warmup as long as a run that epochs or max_tokens ends): the trainer builds
  // it after the run directory is made, and `check` builds none; here both refuse it before anything is made.
  optim::LrSchedule(c.schedule.lr, c.optim.adamw.lr, total);
  return total;
}

std::string checkpoint_dir_for(const TrainConfig& c, const std::string& run_dir) {
  return c.checkpoint.dir.empty() ? (fs::path(run_dir) / "checkpoints").string() : c.checkpoint.dir;
}

std::string resolve_resume_path(const std::string& resume, const std::string& dir) {
  if (resume.empty()) return {};
  if (resume == "auto") return checkpoint::find_latest(dir);
  std::error_code ec;
  if (fs::is_regular_file(resume, ec)) {
    const fs::path file(resume);
    const std::string name = file.filename().string(), ext = file.extension().string();
    const bool in_checkpoint = name == "index.h5" || name == "DONE" || (name.rfind("rank_", 0) == 0 && ext == ".h5");
    throw CheckpointError(fmt::format(
        "{}: is a file; --resume takes a checkpoint folder (step_N, with index.h5 and DONE), the checkpoint directory "
        "above them, or a run directory{}",
        resume,
        in_checkpoint ? fmt::format("; the checkpoint is its folder, {}", file.parent_path().string())
        : ext == ".h5" || ext == ".safetensors"
            ? "; to start a new run from the weights in this file, use --checkpoint.init_from instead (AdamW starts fresh)"
            : ""));
  }
  if (!checkpoint::is_complete(resume)) {
    const std::string latest = checkpoint::find_latest(resume);  // a directory of checkpoints: its newest
    if (!latest.empty()) return latest;
    // a run directory: its checkpoints folder's newest (what `--logging.run_dir RUN_DIR --resume auto` continues)
    const std::string in_run = checkpoint::find_latest((fs::path(resume) / "checkpoints").string());
    if (!in_run.empty()) return in_run;
  }
  return resume;  // the reader says what is wrong with it, if anything
}

void check_weights_tokenizer(const std::string& weights, const std::string& tokenizer_json,
                             const data::TokenDataset& dataset) {
  const std::string& current = dataset.info().tokenizer_hash;
  if (current.empty()) return;  // a dataset that records no tokenizer: nothing to compare with
  // Rank 0 says it, once for the job: every rank reads the same weights.
  const auto unchecked = [&](const std::string& why) {
    if (log::config().rank == 0)
      log::warn("{}: {}: whether it was trained on the tokenizer of data.path {} ({}) cannot be checked", weights, why,
                dataset.path(), dataset.info().tokenizer_name);
  };
  if (tokenizer_json.empty()) {
    unchecked("no tokenizer recorded (a Hugging Face directory without tokenizer.json, or weights saved without one)");
    return;
  }
  const auto saved = nlohmann::json::parse(tokenizer_json, nullptr, false);
  const auto text = [&saved](const char* key) {
    return saved.is_object() && saved.contains(key) && saved[key].is_string() ? saved[key].get<std::string>()
                                                                              : std::string();
  };
  std::string hash = text("hash"), encoding = text("encoding_hash"), name = text("name");
  if (hash.empty() && !text("path").empty()) {
    // A Hugging Face directory records no hash, only the tokenizer.json it ships: that file is the model's tokenizer,
    // and its hashes the identity the dataset records (check_tokenizer_matches does the same for `generate`).
    try {
      const auto shipped = data::Tokenizer::load(text("path"));
      hash = shipped.hash();
      encoding = shipped.encoding_hash();
      name = text("path");
    } catch (const DataError& e) {
      unchecked(fmt::format("its tokenizer cannot be read ({})", e.what()));
      return;
    }
  }
  if (!hash.empty() && !data::same_tokenizer(hash, encoding, current, dataset.info().tokenizer_encoding_hash)) {
    throw CheckpointError(
        fmt::format("{}: trained with tokenizer {} ({}), but data.path {} was tokenized with {} ({}); "
                    "use a dataset prepared with the checkpoint's tokenizer",
                    weights, name.empty() ? "?" : name, hash, dataset.path(), dataset.info().tokenizer_name, current));
  }
}

void check_resume_tokenizer(const checkpoint::CheckpointReader& reader, const data::TokenDataset& dataset) {
  check_weights_tokenizer(reader.path(), reader.tokenizer(), dataset);
}

namespace {

// The configuration the checkpoint records, or none (a checkpoint without one, or of a version this build cannot read:
// nothing to compare with).
std::optional<TrainConfig> saved_config(const checkpoint::CheckpointReader& reader) {
  if (reader.config_toml().empty()) return std::nullopt;
  TrainConfig saved;
  try {
    apply_toml_text(saved, reader.config_toml(), reader.path() + ": config");
  } catch (const Error&) {
    return std::nullopt;
  }
  return saved;
}

// "KEY THEN (this run: NOW)" for each key that differs, comma-separated.
class KeyChanges {
 public:
  template <typename T>
  void add(std::string_view key, const T& then, const T& now) {
    if (then != now) text_ += fmt::format("{}{} {} (this run: {})", text_.empty() ? "" : ", ", key, then, now);
  }
  bool empty() const { return text_.empty(); }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// What the checkpoint's sampler position was taken with and this run has otherwise: data.seq_len, data.layout,
// data.seed, data.shuffle (from the configuration the checkpoint records). The position is a count of samples into
// the epoch's order, and each of these changes which samples that order holds.
KeyChanges position_key_changes(const checkpoint::CheckpointReader& reader, const TrainConfig& config) {
  KeyChanges keys;
  const std::optional<TrainConfig> found = saved_config(reader);
  if (!found) return keys;
  const DataSection &a = found->data, &b = config.data;
  const auto layout = [](data::BatchLayout l) { return fmt::format("\"{}\"", data::batch_layout_name(l)); };
  keys.add("data.seq_len", a.seq_len, b.seq_len);
  keys.add("data.layout", layout(a.layout), layout(b.layout));
  keys.add("data.shuffle", a.shuffle, b.shuffle);
  if (a.shuffle == b.shuffle && b.shuffle) keys.add("data.seed", a.seed, b.seed);  // unshuffled, the seed is unused
  return keys;
}

// The sentences, "; "-joined.
std::string joined(const std::vector<std::string>& said) {
  std::string text;
  for (const std::string& s : said) text += (text.empty() ? "" : "; ") + s;
  return text;
}

}  // namespace

std::string resume_schedule_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config,
                                   const std::vector<data::MixtureComponent>& sources, int64_t total_steps, int64_t step) {
  const std::optional<TrainConfig> found = saved_config(reader);
  // A run with no step left trains at no rate: "step N+1 trains at lr X" would name a step that never comes.
  if (!found || sources.empty() || total_steps <= 0 || step >= total_steps) return {};
  const TrainConfig& saved = *found;
  int64_t saved_total = 0;
  try {
    saved_total = planned_steps(saved, global_batches_per_epoch(saved, sources));
  } catch (const Error&) {
    return {};  // a length that no longer fits the data: nothing to compare with
  }
  const double then = optim::LrSchedule(saved.schedule.lr, saved.optim.adamw.lr, saved_total).lr(step);
  const double now = optim::LrSchedule(config.schedule.lr, config.optim.adamw.lr, total_steps).lr(step);
  if (std::abs(then - now) <= 1e-12 * std::max(std::abs(then), std::abs(now))) return {};
  KeyChanges keys;
  const optim::ScheduleConfig &a = saved.schedule.lr, &b = config.schedule.lr;
  keys.add("optim.lr", saved.optim.adamw.lr, config.optim.adamw.lr);
  keys.add("schedule.kind", std::string(optim::schedule_kind_name(a.kind)), std::string(optim::schedule_kind_name(b.kind)));
  keys.add("schedule.warmup_steps", a.warmup_steps, b.warmup_steps);
  keys.add("schedule.warmup_start_factor", a.warmup_start_factor, b.warmup_start_factor);
  keys.add("schedule.min_lr", a.min_lr, b.min_lr);
  keys.add("schedule.decay_steps", a.decay_steps, b.decay_steps);
  keys.add("the run's length in steps", saved_total, total_steps);
  const std::string list = keys.text();
  return fmt::format(
      "{}: the learning-rate schedule is not the saving run's ({}): step {} trains at lr {:.6g}, where the saving run's "
      "schedule had {:.6g}; the run follows this configuration's schedule from here",
      reader.path(), list, step + 1, now, then);
}

std::string resume_optimizer_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config) {
  const std::optional<TrainConfig> found = saved_config(reader);
  if (!found) return {};
  const optim::AdamWConfig &a = found->optim.adamw, &b = config.optim.adamw;
  KeyChanges keys;
  keys.add("optim.beta1", a.beta1, b.beta1);
  keys.add("optim.beta2", a.beta2, b.beta2);
  keys.add("optim.eps", a.eps, b.eps);
  keys.add("optim.weight_decay", a.weight_decay, b.weight_decay);
  keys.add("optim.decay", std::string(optim::decay_scope_name(a.decay)), std::string(optim::decay_scope_name(b.decay)));
  keys.add("optim.max_grad_norm", found->optim.max_grad_norm, config.optim.max_grad_norm);
  if (keys.empty()) return {};
  return fmt::format(
      "{}: AdamW's settings are not the saving run's ({}): its moments are loaded as saved and updated with this run's "
      "settings from here",
      reader.path(), keys.text());
}

std::string resume_data_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config,
                               const std::vector<data::MixtureComponent>& sources) {
  const auto saved = nlohmann::json::parse(reader.tokenizer().empty() ? "{}" : reader.tokenizer(), nullptr, false);
  std::vector<std::string> said;
  const KeyChanges keys = position_key_changes(reader, config);
  if (!keys.empty()) {
    said.push_back(fmt::format(
        "{}: its data position (a count of samples into the epoch's order) was taken with {}: the same count means other "
        "samples now, so samples already trained on come again and others are skipped (set these back to continue the "
        "same data)",
        reader.path(), keys.text()));
  }
  if (!saved.is_object() || !saved.contains("sources") || !saved["sources"].is_array()) return joined(said);
  std::vector<std::pair<std::string, double>> before, now;
  std::vector<std::string> before_identity;
  for (const auto& e : saved["sources"]) {
    if (!e.is_object()) continue;
    before.emplace_back(e.value("path", std::string()), e.value("weight", 0.0));
    const auto id = e.find("identity");
    before_identity.push_back(id != e.end() && id->is_string() ? id->get<std::string>() : std::string());
  }
  for (const auto& c : sources) now.emplace_back(c.dataset->path(), c.weight);
  auto describe = [](const std::vector<std::pair<std::string, double>>& v) {
    std::string out;
    for (const auto& [p, w] : v) out += fmt::format("{}{}:{}", out.empty() ? "" : ", ", p, w);
    return out;
  };
  auto same_file = [](const std::string& a, const std::string& b) {  // however the path is spelled
    std::error_code ea, eb;
    // A recorded path went through json_text: a byte that is not UTF-8 is U+FFFD there, as in json_recorded(b).
    return a == b || a == json_recorded(b) || fs::weakly_canonical(a, ea) == fs::weakly_canonical(b, eb);
  };
  // The same file however its path is spelled, or the same content wherever it lies now: a relative path resumed from
  // another folder, a dataset copied elsewhere (the identity names no path). Both were once said to be new data.
  const auto same_source = [&](size_t i) {
    return same_file(before[i].first, now[i].first) ||
           (!before_identity[i].empty() && before_identity[i] == sources[i].dataset->identity());
  };
  bool same = before.size() == now.size();
  for (size_t i = 0; same && i < now.size(); ++i) same = same_source(i) && before[i].second == now[i].second;
  if (!same) {
    said.push_back(fmt::format(
        "{} was trained on {}; this run reads {}: the sampler position is kept, so the samples that follow come from the "
        "new data",
        reader.path(), describe(before), describe(now)));
  } else if (keys.empty()) {
    // The same files, read the same way: a file prepared again at its path (more documents, fewer, another order)
    // has another count of train samples, and the epoch's order is another permutation (since 2026-11-28 recorded).
    for (size_t i = 0; i < now.size(); ++i) {
      const auto& e = saved["sources"][i];
      if (!e.is_object()) continue;
      const auto recorded = e.find("train_samples");
      const auto identity = e.find("identity");
      const size_t samples =
          data::SampleSource(*sources[i].dataset, data::DatasetSplit::Train, config.data.layout, config.data.seq_len)
              .num_samples();
      if (recorded != e.end() && recorded->is_number_unsigned() && recorded->get<uint64_t>() != samples)
        said.push_back(fmt::format(
            "{}: {} held {} train samples of {} tokens when the checkpoint was saved, and holds {} now (prepared again?): "
            "the epoch's order is another one, so samples already trained on come again and others are skipped",
            reader.path(), now[i].first, recorded->get<uint64_t>(), config.data.seq_len, samples));
      else if (identity != e.end() && identity->is_string() &&
               identity->get<std::string>() != sources[i].dataset->identity())
        // as many samples, other tokens in them (inputs reordered, one replaced by another of the same size)
        said.push_back(fmt::format(
            "{}: {} is not the file the checkpoint was trained on (then: {}; now: {}; prepared again?): the same "
            "position holds other tokens, so tokens already trained on come again and others are skipped",
            reader.path(), now[i].first, identity->get<std::string>(), sources[i].dataset->identity()));
    }
  }
  return joined(said);
}

}  // namespace shardtrain::train
