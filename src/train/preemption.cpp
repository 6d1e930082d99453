// Signal flag, agreement in the step's own all-reduce, save-and-stop.
#include "shardtrain/train/preemption.hpp"

#include <csignal>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {
namespace {

// A signal handler can only reach process-wide state, and may only store to a lock-free atomic: this
// flag is the one global of the training loop, written by the handler and read at step boundaries.
volatile std::sig_atomic_t g_signal = 0;
bool g_caught_early = false;  // catch_signals_from_now ran: g_signal already holds what arrived since

extern "C" void on_preemption_signal(int sig) { g_signal = sig; }

void install(struct ::sigaction* old_usr1, struct ::sigaction* old_term) {
  struct ::sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, old_usr1);
  ::sigaction(SIGTERM, &sa, old_term);
}

}  // namespace

void PreemptionHooks::catch_signals_from_now() {
  g_signal = 0;
  g_caught_early = true;
  install(nullptr, nullptr);
}

void PreemptionHooks::release_early_signals() {
  g_caught_early = false;
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (const int sig = g_signal; sig != 0) std::raise(sig);
}

PreemptionHooks::PreemptionHooks() {
  if (!g_caught_early) g_signal = 0;
  install(&old_usr1_, &old_term_);
}

PreemptionHooks::~PreemptionHooks() {
  ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

bool PreemptionHooks::stop_before_start(MPI_Comm world) {
  int sig[2] = {g_signal == SIGUSR1 ? 1 : 0, g_signal == SIGTERM ? 1 : 0};
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sig, 2, MPI_INT, MPI_MAX, world));
  agreed_signal_ = sig[1] ? SIGTERM : sig[0] ? SIGUSR1 : 0;
  if (agreed_signal_ == 0) return false;
  preempted_ = true;
  signal_ = agreed_signal_;
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  if (rank == 0)  // the ranks agreed: one line for the job
    log::warn(
        "preemption: {} received during the start-up, before the first step: stopping with nothing new to save "
        "(exit code 75: requeue)",
        signal_ == SIGUSR1 ? "SIGUSR1" : "SIGTERM");
  return true;
}

void PreemptionHooks::contribute(std::span<double> mine) {
  const int sig = static_cast<int>(g_signal);
  mine[0] = sig == SIGUSR1 ? 1.0 : 0.0;
  mine[1] = sig == SIGTERM ? 1.0 : 0.0;
}

void PreemptionHooks::agreed(std::span<const double> sums) {
  // Signals reach ranks at different moments: SIGTERM if any rank has one, else SIGUSR1 if any has that (the
  // larger signal number, as before), so all stop after the same step.
  agreed_signal_ = sums[1] > 0 ? SIGTERM : sums[0] > 0 ? SIGUSR1 : 0;
}

void PreemptionHooks::on_step_end(Trainer& trainer, const StepMetrics&) {
  const int sig = agreed_signal_;
  if (sig == 0 || preempted_ || finishing_) return;
  const bool rank0 = trainer.runtime().topology().world_rank == 0;  // the ranks agreed: one line for the job
  if (trainer.state().step >= trainer.total_steps()) {
    // The last step: the run ends here anyway (its final validation and save); a stop would only ask for a requeue
    // that trains nothing.
    finishing_ = true;
    if (rank0)
      log::warn("preemption: {} received at the last step ({}): the run finishes as it would have (exit code 0)",
                sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM", trainer.state().step);
    return;
  }
  preempted_ = true;
  signal_ = sig;
  if (rank0)
    log::warn("preemption: {} received, saving a checkpoint after step {} and stopping (exit code 75: requeue)",
              sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM", trainer.state().step);
  trainer.request_save();
  trainer.request_stop();
}

}  // namespace shardtrain::train
