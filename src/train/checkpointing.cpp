// Resume and periodic saves through the checkpoint layer.
#include "shardtrain/train/checkpointing.hpp"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace fs = std::filesystem;

namespace shardtrain::train {

CheckpointHooks::CheckpointHooks(const Trainer& trainer)
    : dir_(trainer.config().checkpoint.dir.empty() ? (fs::path(trainer.run_dir()) / "checkpoints").string()
                                                    : trainer.config().checkpoint.dir) {}

std::string CheckpointHooks::tokenizer_json(const Trainer& trainer) const {
  const data::DatasetInfo& info = trainer.dataset().info();
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& c : trainer.sources()) sources.push_back({{"path", c.dataset->path()}, {"weight", c.weight}});
  return nlohmann::json{{"name", info.tokenizer_name},
                        {"hash", info.tokenizer_hash},
                        {"path", info.tokenizer_path},
                        {"format", info.tokenizer_format},
                        {"vocab_size", info.vocab_size},
                        {"eot_id", info.eot_id ? int64_t{*info.eot_id} : int64_t{-1}},
                        {"bot_id", info.bot_id ? int64_t{*info.bot_id} : int64_t{-1}},
                        {"dataset", trainer.dataset().path()},
                        {"sources", sources}}
      .dump();
}

void CheckpointHooks::on_start(Trainer& trainer) {
  resume(trainer);
  const auto& c = trainer.config().checkpoint;
  if (resumed_from_.empty() && !c.init_from.empty()) {
    auto source = checkpoint::open_tensor_source(c.init_from);
    checkpoint::import_weights(trainer.engine(), *source,
                               c.cpu_ram_efficient_loading ? checkpoint::ImportMode::NodeLeaderReads
                                                           : checkpoint::ImportMode::EveryRankReadsItsSlices);
  }
}

void CheckpointHooks::resume(Trainer& trainer) {
  const std::string& resume = trainer.config().checkpoint.resume;
  if (resume.empty()) return;
  std::string path = resume;
  if (resume == "auto") {
    path = checkpoint::find_latest(dir_);
    if (path.empty()) {
      log::info("checkpoint: resume = auto and no complete checkpoint in {}: starting from scratch", dir_);
      return;
    }
  } else if (!checkpoint::is_complete(path)) {
    const std::string latest = checkpoint::find_latest(path);  // a directory of checkpoints: its newest
    if (!latest.empty()) path = latest;
  }
  // The tokens in the dataset must be the ones the checkpoint's model was trained on.
  checkpoint::CheckpointReader reader(path);
  if (!reader.tokenizer().empty()) {
    const auto saved = nlohmann::json::parse(reader.tokenizer(), nullptr, false);
    const std::string hash = saved.is_object() ? saved.value("hash", std::string()) : std::string();
    const std::string& current = trainer.dataset().info().tokenizer_hash;
    if (!hash.empty() && !current.empty() && hash != current) {
      throw CheckpointError(fmt::format("{}: trained with tokenizer {} ({}), but data.path {} was tokenized with {} ({}); "
                                        "use a dataset prepared with the checkpoint's tokenizer",
                                        path, saved.value("name", std::string("?")), hash, trainer.dataset().path(),
                                        trainer.dataset().info().tokenizer_name, current));
    }
    // Other data than the checkpoint's (a new mixture for a final phase, or a slip): allowed, and said.
    if (saved.is_object() && saved.contains("sources") && saved["sources"].is_array()) {
      std::vector<std::pair<std::string, double>> before, now;
      for (const auto& e : saved["sources"])
        if (e.is_object()) before.emplace_back(e.value("path", std::string()), e.value("weight", 0.0));
      for (const auto& c : trainer.sources()) now.emplace_back(c.dataset->path(), c.weight);
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
      if (!same && trainer.runtime().topology().world_rank == 0)
        log::warn("checkpoint: {} was trained on {}; this run reads {}: the sampler position is kept, so the samples that "
                  "follow come from the new data",
                  path, describe(before), describe(now));
    }
  }
  const checkpoint::LoadResult r = checkpoint::load(trainer.engine(), &trainer.optimizer(), reader);
  TrainerState state = trainer_state_from_json(r.trainer_state, path);
  if (!r.optimizer_loaded) state.optimizer_steps = 0;
  trainer.restore(state);
  resumed_from_ = path;
  last_saved_step_ = state.step;
  log::info("checkpoint: resumed from {} at step {} ({} tokens seen)", path, state.step, state.tokens_seen);
}

checkpoint::SaveMeta CheckpointHooks::meta_for(const Trainer& trainer) const {
  checkpoint::SaveMeta meta;
  meta.step = trainer.state().step;
  meta.trainer_state = trainer_state_to_json(trainer.state());
  meta.config_toml = trainer.resolved_config_toml();
  meta.tokenizer = tokenizer_json(trainer);
  return meta;
}

void CheckpointHooks::save(Trainer& trainer) {
  if (async_.pending()) last_saved_ = async_.wait();
  const TrainerState& s = trainer.state();
  if (s.step == last_saved_step_) return;
  const checkpoint::SaveMeta meta = meta_for(trainer);
  const auto& c = trainer.config().checkpoint;
  last_saved_ = c.state_dict_type == StateDictType::Full
                    ? checkpoint::save_full(trainer.engine(), dir_, meta, c.keep_last)
                    : checkpoint::save_sharded(trainer.engine(), trainer.optimizer(), dir_, meta, c.keep_last);
  last_saved_step_ = s.step;
}

void CheckpointHooks::save_async(Trainer& trainer) {
  const TrainerState& s = trainer.state();
  if (s.step == last_saved_step_) return;
  const auto& c = trainer.config().checkpoint;
  async_.start(trainer.engine(), trainer.optimizer(), dir_, meta_for(trainer), c.keep_last);  // waits for the previous one
  last_saved_step_ = s.step;
}

void CheckpointHooks::on_step_end(Trainer& trainer, const StepMetrics&) {
  if (async_.pending()) {  // every rank asks at every step end until all have written their files
    const std::string published = async_.poll();
    if (!published.empty()) last_saved_ = published;
  }
  const auto& c = trainer.config().checkpoint;
  const bool periodic = c.every_n_steps > 0 && trainer.state().step % c.every_n_steps == 0;
  if (trainer.save_requested()) {  // preemption: published before the run stops
    save(trainer);
    trainer.clear_save_request();
  } else if (periodic) {
    if (c.async_save && c.state_dict_type == StateDictType::Sharded) {
      save_async(trainer);
    } else {
      save(trainer);
    }
  }
}

void CheckpointHooks::on_end(Trainer& trainer) {
  if (async_.pending()) last_saved_ = async_.wait();
  if (trainer.config().checkpoint.every_n_steps > 0 || trainer.save_requested()) save(trainer);
}

}  // namespace shardtrain::train
