// Preemption: SIGUSR1 (Slurm's `--signal=B:USR1@N` warning) or SIGTERM (a time limit, scancel) asks the
// run to stop; so do SIGINT (Ctrl-C at a terminal) and SIGHUP (the terminal closed), which ended a run started
// without mpirun at once, without a save (exit 130 or 129); a second SIGINT ends the process at once. Every rank's flag rides in the step's own all-reduce (TrainerHooks::agreed_slots: no collective
// of its own), so all ranks agree; after that step the run saves a checkpoint and stops, and the process exits
// with ExitCode::Requeue (75) so the job script can requeue itself; the requeued job resumes with --resume auto.
#pragma once

#include <mpi.h>
#include <signal.h>

#include <iterator>

#include "shardtrain/train/trainer.hpp"

namespace shardtrain::train {

class PreemptionHooks final : public TrainerHooks {
 public:
  // Installs the handlers of the stop signals (kStopSignals; they only set a flag); the previous ones are restored
  // on destruction. Made first thing in `train`: a signal during the start-up must not end a rank with the
  // default action (exit 138, no result.json) where exit code 75 is promised.
  PreemptionHooks();
  // The same handlers from now on, before there is a PreemptionHooks (and before MPI_Init and the device's and
  // NCCL's start, which take minutes on a large job): a signal then is kept, and the PreemptionHooks made later
  // reports it (stop_before_start) instead of forgetting it. Called first thing in main(), before the command line
  // is read: mpirun passes a SIGUSR1 on to ranks that have only just started (their handler installed after the
  // parse, such a signal ended them with 138 instead of 75).
  static void catch_signals_from_now();
  // For a command that does not stop on a signal (all but train): the default actions back, and a signal caught since
  // catch_signals_from_now delivered again, so that it ends the process as it would have.
  static void release_early_signals();
  ~PreemptionHooks() override;
  PreemptionHooks(const PreemptionHooks&) = delete;
  PreemptionHooks& operator=(const PreemptionHooks&) = delete;

  void on_step_end(Trainer& trainer, const StepMetrics& metrics) override;
  // [SIGUSR1 received, SIGTERM, SIGINT or SIGHUP received] on this rank, summed over the world with the step's values.
  size_t agreed_slots() const override { return 2; }
  void contribute(std::span<double> mine) override;
  void agreed(std::span<const double> sums) override;
  // Collective over `world`: whether a signal reached any rank before the first step (while the model, the data and
  // the checkpoint directory were being set up). Then the run is preempted with nothing new to save: `train`
  // stops at once with exit code 75 instead of training a step first.
  bool stop_before_start(MPI_Comm world);
  // Collective over the trainer's world, after a run that was not preempted: a stop signal that reached a rank after the
  // last step's agreement (during the final validation or save, which nothing reads the flag in) is said by rank 0:
  // the run finished all the same, exit 0. Unsaid, a launcher that announced "exit code 75" on passing it on
  // (jobs/launch.sh) was contradicted without a word. One agreed at the last step was said then (finishing_).
  void say_signal_after_the_last_step(Trainer& trainer);
  bool preempted() const { return preempted_; }
  int signal() const { return signal_; }
  // The signals that stop a run, and their names in messages ("SIGINT (Ctrl-C)").
  static constexpr int kStopSignals[] = {SIGUSR1, SIGTERM, SIGINT, SIGHUP};
  static const char* signal_label(int sig);

 private:
  int agreed_signal_ = 0;  // the last step's agreed signal (0: none)
  bool preempted_ = false;
  bool finishing_ = false;  // a signal at the last step: the run finishes instead (no requeue)
  int signal_ = 0;
  struct ::sigaction old_[std::size(kStopSignals)]{};
};

}  // namespace shardtrain::train
