// Signal flag, agreement at step boundaries, save-and-stop.
#include "shardtrain/train/preemption.hpp"

#include <csignal>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {
namespace {

// A signal handler can only reach process-wide state, and may only store to a lock-free atomic: this
// flag is the one global of the training loop, written by the handler and read at step boundaries.
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_preemption_signal(int sig) { g_signal = sig; }

}  // namespace

PreemptionHooks::PreemptionHooks(MPI_Comm world) : world_(world) {
  g_signal = 0;
  struct ::sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, &old_usr1_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

PreemptionHooks::~PreemptionHooks() {
  ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

void PreemptionHooks::on_step_end(Trainer& trainer, const StepMetrics&) {
  // Signals reach ranks at different moments: agree on the largest, so all stop after the same step.
  int sig = static_cast<int>(g_signal);
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, world_));
  if (sig == 0 || preempted_) return;
  preempted_ = true;
  signal_ = sig;
  log::warn("preemption: {} received, saving a checkpoint after step {} and stopping (exit code 75: requeue)",
            sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM", trainer.state().step);
  trainer.request_save();
  trainer.request_stop();
}

}  // namespace shardtrain::train
