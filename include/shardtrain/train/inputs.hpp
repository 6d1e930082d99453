// What a run reads before its first step: its datasets, the length of the run, the checkpoint it resumes
// from. The Trainer and CheckpointHooks use these, and so does `shardtrain check` (offline, no MPI, on a
// login node or in a job before the ranks start), so the preflight and the run agree on every error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/checkpoint/reader.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/mixture.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

// data.path or each source of data.mixture, mapped, each checked against model.vocab_size (ConfigError);
// a missing or damaged file throws DataError naming it.
std::vector<data::MixtureComponent> open_data_sources(const TrainConfig& c);

// The run's length in optimizer steps: the first of schedule.max_steps, max_tokens and epochs reached. A length
// whose tokens would pass int64 (what the run counts them in) is a ConfigError naming the key that set it.
int64_t planned_steps(const TrainConfig& c, int64_t steps_per_epoch);
// Global batches in an epoch of the sources' train split (drop_last), without building the loader: DataError
// when there is not even one.
int64_t global_batches_per_epoch(const TrainConfig& c, const std::vector<data::MixtureComponent>& sources);
// Before anything is built (train, check): the run's length (planned_steps), the LR schedule over it (a warmup that
// fills it: ConfigError) and optim.rollback_skip_steps, at most the larger of that length and an epoch (a rollback
// seeks that far: ConfigError past it). Returns the length.
int64_t check_run_length(const TrainConfig& c, const std::vector<data::MixtureComponent>& sources);

// Where the run's checkpoints go: checkpoint.dir, or <run_dir>/checkpoints when it is empty.
std::string checkpoint_dir_for(const TrainConfig& c, const std::string& run_dir);

// The checkpoint that `checkpoint.resume` names: "" (no resume, or "auto" with no complete checkpoint in
// `dir`), the newest complete one for "auto", or the given path (a directory of checkpoints: its newest).
std::string resolve_resume_path(const std::string& resume, const std::string& dir);

// The checkpoint's model must have been trained on tokens of the dataset's tokenizer (CheckpointError).
void check_resume_tokenizer(const checkpoint::CheckpointReader& reader, const data::TokenDataset& dataset);
// The same for any weights: their tokenizer record's "hash", or for a Hugging Face directory (a record with a "path"
// and no hash) the hash of the tokenizer.json it ships. A record that is "" or names a file that cannot be read passes,
// with a warning (rank 0) that it cannot be checked; so does a dataset that records no tokenizer, silently.
void check_weights_tokenizer(const std::string& weights, const std::string& tokenizer_json,
                             const data::TokenDataset& dataset);

// "" when the run reads the data the checkpoint was trained on (the same files, however spelled, and
// weights) the same way; otherwise sentences saying what changed. Allowed (a new mixture for a last phase, a longer
// data.seq_len), but said: the data.seq_len, layout, seed and shuffle the checkpoint's position was taken with, and
// each file's train samples, decide which samples that position means (docs/training.md, "Resuming").
std::string resume_data_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config,
                               const std::vector<data::MixtureComponent>& sources);
// "" when the learning rate of the step after `step` (the checkpoint's) is the saving run's; otherwise a sentence
// naming the keys that changed the schedule (optim.lr, schedule.*, the run's length) and both rates. Allowed (a run
// extended past its first horizon), but said: the schedule is a function of the step and of these keys.
std::string resume_schedule_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config,
                                   const std::vector<data::MixtureComponent>& sources, int64_t total_steps, int64_t step);
// "" when AdamW's betas, eps, weight decay (and its scope) and the clipping are the saving run's; otherwise a sentence
// naming each that changed. Allowed, but said: the moments are loaded as saved and updated with the new settings.
std::string resume_optimizer_change(const checkpoint::CheckpointReader& reader, const TrainConfig& config);

}  // namespace shardtrain::train
