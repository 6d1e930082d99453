// Preemption: SIGUSR1 (Slurm's `--signal=B:USR1@N` warning) or SIGTERM (a time limit, scancel) asks the
// run to stop. Every rank checks at each step boundary, all ranks agree (an all-reduce of the flag), the
// run saves a checkpoint and stops, and the process exits with ExitCode::Requeue (75) so the job script
// can requeue itself; the requeued job resumes with --resume auto.
#pragma once

#include <mpi.h>
#include <signal.h>

#include "shardtrain/train/trainer.hpp"

namespace shardtrain::train {

class PreemptionHooks final : public TrainerHooks {
 public:
  // Installs the SIGUSR1 and SIGTERM handlers (they only set a flag); the previous ones are restored
  // on destruction.
  explicit PreemptionHooks(MPI_Comm world);
  ~PreemptionHooks() override;
  PreemptionHooks(const PreemptionHooks&) = delete;
  PreemptionHooks& operator=(const PreemptionHooks&) = delete;

  void on_step_end(Trainer& trainer, const StepMetrics& metrics) override;
  bool preempted() const { return preempted_; }
  int signal() const { return signal_; }

 private:
  MPI_Comm world_;
  bool preempted_ = false;
  int signal_ = 0;
  struct ::sigaction old_usr1_ {};
  struct ::sigaction old_term_ {};
};

}  // namespace shardtrain::train
