// A run's inputs, opened and checked the same way by the Trainer and by `shardtrain check`.
#include "shardtrain/train/inputs.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/runtime/error.hpp"

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
  const int64_t tokens_per_step = static_cast<int64_t>(c.data.global_batch_size) * c.data.seq_len;
  int64_t steps = std::numeric_limits<int64_t>::max();
  if (c.schedule.max_steps > 0) steps = std::min(steps, c.schedule.max_steps);
  if (c.schedule.max_tokens > 0) steps = std::min(steps, (c.schedule.max_tokens + tokens_per_step - 1) / tokens_per_step);
  if (c.schedule.epochs > 0) steps = std::min(steps, c.schedule.epochs * steps_per_epoch);
  return steps;
}

std::string checkpoint_dir_for(const TrainConfig& c, const std::string& run_dir) {
  return c.checkpoint.dir.empty() ? (fs::path(run_dir) / "checkpoints").string() : c.checkpoint.dir;
}

std::string resolve_resume_path(const std::string& resume, const std::string& dir) {
  if (resume.empty()) return {};
  if (resume == "auto") return checkpoint::find_latest(dir);
  if (!checkpoint::is_complete(resume)) {
    const std::string latest = checkpoint::find_latest(resume);  // a directory of checkpoints: its newest
    if (!latest.empty()) return latest;
  }
  return resume;  // the reader says what is wrong with it, if anything
}

void check_weights_tokenizer(const std::string& weights, const std::string& tokenizer_json,
                             const data::TokenDataset& dataset) {
  if (tokenizer_json.empty()) return;
  const auto saved = nlohmann::json::parse(tokenizer_json, nullptr, false);
  const std::string hash = saved.is_object() ? saved.value("hash", std::string()) : std::string();
  const std::string& current = dataset.info().tokenizer_hash;
  if (!hash.empty() && !current.empty() && hash != current) {
    throw CheckpointError(fmt::format(
        "{}: trained with tokenizer {} ({}), but data.path {} was tokenized with {} ({}); "
        "use a dataset prepared with the checkpoint's tokenizer",
        weights, saved.value("name", std::string("?")), hash, dataset.path(), dataset.info().tokenizer_name, current));
  }
}

void check_resume_tokenizer(const checkpoint::CheckpointReader& reader, const data::TokenDataset& dataset) {
  check_weights_tokenizer(reader.path(), reader.tokenizer(), dataset);
}

std::string resume_data_change(const checkpoint::CheckpointReader& reader,
                               const std::vector<data::MixtureComponent>& sources) {
  const auto saved = nlohmann::json::parse(reader.tokenizer().empty() ? "{}" : reader.tokenizer(), nullptr, false);
  if (!saved.is_object() || !saved.contains("sources") || !saved["sources"].is_array()) return {};
  std::vector<std::pair<std::string, double>> before, now;
  for (const auto& e : saved["sources"])
    if (e.is_object()) before.emplace_back(e.value("path", std::string()), e.value("weight", 0.0));
  for (const auto& c : sources) now.emplace_back(c.dataset->path(), c.weight);
  auto describe = [](const std::vector<std::pair<std::string, double>>& v) {
    std::string out;
    for (const auto& [p, w] : v) out += fmt::format("{}{}:{}", out.empty() ? "" : ", ", p, w);
    return out;
  };
  auto same_file = [](const std::string& a, const std::string& b) {  // however the path is spelled
    std::error_code ea, eb;
    return a == b || fs::weakly_canonical(a, ea) == fs::weakly_canonical(b, eb);
  };
  bool same = before.size() == now.size();
  for (size_t i = 0; same && i < now.size(); ++i)
    same = same_file(before[i].first, now[i].first) && before[i].second == now[i].second;
  if (same) return {};
  return fmt::format(
      "{} was trained on {}; this run reads {}: the sampler position is kept, so the samples that follow come from the new data",
      reader.path(), describe(before), describe(now));
}

}  // namespace shardtrain::train
