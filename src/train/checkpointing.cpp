// Resume and periodic saves through the checkpoint layer.
#include "shardtrain/train/checkpointing.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/inputs.hpp"

namespace shardtrain::train {

CheckpointHooks::CheckpointHooks(const Trainer& trainer)
    : dir_(checkpoint_dir_for(trainer.config(), trainer.run_dir())) {}

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
  const std::string path = resolve_resume_path(resume, dir_);
  if (path.empty()) {
    log::info("checkpoint: resume = auto and no complete checkpoint in {}: starting from scratch", dir_);
    return;
  }
  // The tokens in the dataset must be the ones the checkpoint's model was trained on.
  checkpoint::CheckpointReader reader(path);
  check_resume_tokenizer(reader, trainer.dataset());
  // Other data than the checkpoint's (a new mixture for a final phase, or a slip): allowed, and said.
  const std::string change = resume_data_change(reader, trainer.sources());
  if (!change.empty() && trainer.runtime().topology().world_rank == 0) log::warn("checkpoint: {}", change);
  const checkpoint::LoadResult r = checkpoint::load(trainer.engine(), &trainer.optimizer(), reader);
  TrainerState state = trainer_state_from_json(r.trainer_state, path);
  if (!r.optimizer_loaded) state.optimizer_steps = 0;
  trainer.restore(state);
  resumed_from_ = path;
  last_saved_step_ = state.step;
  log::info("checkpoint: resumed from {} at step {} ({} tokens seen)", path, state.step, state.tokens_seen);
}

std::optional<RollbackPoint> CheckpointHooks::load_rollback_point(Trainer& trainer) {
  if (async_.pending()) last_saved_ = async_.wait();  // an asynchronous save in flight is the newest
  const std::vector<std::pair<int64_t, std::string>> saved = checkpoint::complete_checkpoints(dir_);  // oldest first
  std::string path = saved.empty() ? resumed_from_ : saved.back().second;
  const int64_t again = trainer.state().last_rollback_to;
  if (!saved.empty() && saved.back().first == again) {
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->first < again) {
        log::warn("checkpoint: the run diverged again from step {} without a newer checkpoint: going back further, to step {}", again,
                  it->first);
        path = it->second;
        break;
      }
    }
  }
  if (path.empty()) return std::nullopt;
  checkpoint::CheckpointReader reader(path);
  optim::AdamW& adamw = trainer.optimizer();
  const checkpoint::LoadResult r = checkpoint::load(trainer.engine(), &adamw, reader);
  RollbackPoint point{trainer_state_from_json(r.trainer_state, path), path};
  if (!r.optimizer_loaded) {  // the diverged run's moments must not survive
    for (size_t i = 0; i < adamw.num_shards(); ++i) {
      const std::vector<float> zeros(static_cast<size_t>(adamw.numel(i)), 0.0f);
      adamw.write_state(i, optim::OptimState::ExpAvg, zeros);
      adamw.write_state(i, optim::OptimState::ExpAvgSq, zeros);
    }
    point.state.optimizer_steps = 0;
  }
  last_saved_step_ = point.state.step;
  return point;
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
                    ? checkpoint::save_full(trainer.engine(), dir_, meta, {c.keep_last, c.keep_every})
                    : checkpoint::save_sharded(trainer.engine(), trainer.optimizer(), dir_, meta, {c.keep_last, c.keep_every});
  last_saved_step_ = s.step;
}

void CheckpointHooks::save_async(Trainer& trainer) {
  const TrainerState& s = trainer.state();
  if (s.step == last_saved_step_) return;
  const auto& c = trainer.config().checkpoint;
  async_.start(trainer.engine(), trainer.optimizer(), dir_, meta_for(trainer), {c.keep_last, c.keep_every});  // waits for the previous one
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
