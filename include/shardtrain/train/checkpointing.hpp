// Checkpointing of a training run, per the [checkpoint] config: resume at start (a path, or "auto":
// the newest complete checkpoint in checkpoint.dir), otherwise start from init_from's weights when set
// (a checkpoint, a consolidated file or a Hugging Face directory), a save every every_n_steps and at
// the end, and a save whenever the trainer is asked for one (preemption). With checkpoint.async_save the
// periodic sharded saves are written on a thread while training goes on and published at a later step
// end; a requested save and the final one are synchronous. A periodic save that fails (a full disk, a file
// system error: IoError, the same on every rank) is logged and recorded in the metrics, and training goes on,
// up to checkpoint.max_failed_saves in a row; a failed requested or final save ends the run. After a divergence
// with optim.on_divergence = rollback, the newest checkpoint is loaded again. Attached as Trainer hooks.
// At start, rank 0 says what a checkpoint takes and whether the directory's file system holds it, and removes
// what killed saves left there (incomplete step directories). A checkpoint of non-finite weights is never saved;
// one saved during a streak of skipped steps is marked Diverging, and the rotation keeps the newest Healthy one.
// `resume = auto` falls back past damaged checkpoints to the newest one that loads, says so and sets them aside.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/runtime/deadline.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::train {

class CheckpointHooks final : public TrainerHooks {
 public:
  // checkpoint.dir, or <run_dir>/checkpoints when it is empty.
  explicit CheckpointHooks(const Trainer& trainer);

  void on_start(Trainer& trainer) override;
  void on_step_end(Trainer& trainer, const StepMetrics& metrics) override;
  void on_end(Trainer& trainer) override;
  // The newest complete checkpoint of dir() (or, with none there yet, the one the run resumed from), loaded
  // with its AdamW states; a full-state-dict checkpoint has none, so the optimizer starts fresh. When the run
  // went back to that checkpoint before and has saved none since, the newest one older than it: weights that
  // diverged again from the same checkpoint were probably already on their way there when it was saved.
  std::optional<RollbackPoint> load_rollback_point(Trainer& trainer) override;

  const std::string& dir() const { return dir_; }
  // The run's claim on dir(), renewed before each save (CheckpointDirClaim::renew); none: saves do not look.
  void set_claim(CheckpointDirClaim* claim) { claim_ = claim; }
  const std::string& last_saved() const { return last_saved_; }
  const std::string& resumed_from() const { return resumed_from_; }
  // The newer checkpoints `resume = auto` found damaged and passed over, newest first.
  struct Fallback {
    std::string checkpoint, set_aside_as, error;
  };
  const std::vector<Fallback>& resume_fallbacks() const { return fallbacks_; }
  // The newer complete checkpoints a run resumed from an older one renamed PATH.superseded (rank 0's list).
  const std::vector<Fallback>& superseded() const { return superseded_; }

 private:
  enum class SaveCause { Periodic, Requested, Final };
  void resume(Trainer& trainer);
  void set_aside_newer(Trainer& trainer);  // after an explicit resume: the newer checkpoints renamed, never deleted
  // Loads `path` for a resume: the state to restore, or CheckpointDamaged (the trainer state too, when it does not parse).
  TrainerState load_for_resume(Trainer& trainer, const std::string& path);
  // Collective: whether this save may go ahead. Non-finite weights are never saved: a periodic save is skipped (logged
  // and recorded), a requested or final one ends the run (training diverged).
  bool weights_savable(Trainer& trainer, SaveCause cause);
  void save(Trainer& trainer, SaveCause cause);  // synchronous: published when it returns (waits for an async save first)
  void save_async(Trainer& trainer);             // checkpoint.async_save: published by a later on_step_end or on_end
  void wait_async(Trainer& trainer);  // the asynchronous save in flight, published or failed (within save_timeout)
  // Runs a periodic save's part (the save of step `step`, or publishing an asynchronous one); an IoError from
  // it counts as a failed save (failed_save), any other error ends the run.
  template <typename Fn>
  void periodic(Trainer& trainer, int64_t step, Fn&& fn);
  // A requested (stop signal) or final save: its IoError ends the run, recorded and naming the newest checkpoint.
  void last_save(Trainer& trainer, SaveCause cause);
  // Counts and records a failed save (a checkpoint_failed line in metrics.jsonl, every one); a failed requested or final
  // save, or one past checkpoint.max_failed_saves, ends the run (IoError naming the newest checkpoint).
  void failed_save(Trainer& trainer, int64_t step, const std::string& why, SaveCause cause = SaveCause::Periodic);
  void published(const std::string& path);
  void report_space(Trainer& trainer) const;
  checkpoint::SaveMeta meta_for(const Trainer& trainer) const;
  std::string tokenizer_json(const Trainer& trainer) const;

  std::string dir_;
  CheckpointDirClaim* claim_ = nullptr;
  mutable std::string tokenizer_json_;  // the same at every save of the run: made once (it hashes the datasets' records)
  std::string last_saved_, resumed_from_;
  std::vector<Fallback> fallbacks_, superseded_;
  int64_t last_saved_step_ = -1;  // the newest step saved or being saved (-1 after a failed save)
  int failed_saves_ = 0;          // periodic saves failed in a row
  bool giving_up_ = false;        // failed_save threw the run's end: a save around it (a nested wait) does not count it
  int64_t async_step_ = -1;       // the step of the asynchronous save in flight
  // checkpoint.save_timeout for the asynchronous save in flight, from its start to its publication
  std::unique_ptr<Deadline> async_deadline_;
  checkpoint::AsyncSave async_;
};

}  // namespace shardtrain::train
