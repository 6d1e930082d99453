// Checkpointing of a training run, per the [checkpoint] config: resume at start (a path, or "auto":
// the newest complete checkpoint in checkpoint.dir), otherwise start from init_from's weights when set
// (a checkpoint, a consolidated file or a Hugging Face directory), a save every every_n_steps and at
// the end, and a save whenever the trainer is asked for one (preemption). Attached as Trainer hooks.
#pragma once

#include <string>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/train/trainer.hpp"

namespace shardtrain::train {

class CheckpointHooks final : public TrainerHooks {
 public:
  // checkpoint.dir, or <run_dir>/checkpoints when it is empty.
  explicit CheckpointHooks(const Trainer& trainer);

  void on_start(Trainer& trainer) override;
  void on_step_end(Trainer& trainer, const StepMetrics& metrics) override;
  void on_end(Trainer& trainer) override;

  const std::string& dir() const { return dir_; }
  const std::string& last_saved() const { return last_saved_; }
  const std::string& resumed_from() const { return resumed_from_; }

 private:
  void resume(Trainer& trainer);
  void save(Trainer& trainer);
  std::string tokenizer_json(const Trainer& trainer) const;

  std::string dir_;
  std::string last_saved_, resumed_from_;
  int64_t last_saved_step_ = -1;
};

}  // namespace shardtrain::train
