// Signal flag, agreement in the step's own all-reduce, save-and-stop.
#include "shardtrain/train/preemption.hpp"

#include <unistd.h>

#include <csignal>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {
namespace {

// A signal handler can only reach process-wide state, and may only store to a lock-free atomic: this
// flag is the one global of the training loop, written by the handler and read at step boundaries.
volatile std::sig_atomic_t g_signal = 0;
bool g_caught_early = false;  // catch_signals_from_now ran: g_signal already holds what arrived since

// SIGTERM and what a terminal sends: they stop a run as SIGTERM does (SIGUSR1 is the warning before a time limit).
bool terminating(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGHUP; }

extern "C" void on_preemption_signal(int sig) {
  if (sig == SIGINT) {
    if (g_signal == SIGINT) {  // a second Ctrl-C: now, as the first line said (the newest complete checkpoint stays)
      ::signal(SIGINT, SIG_DFL);
      ::raise(SIGINT);
      return;
    }
    // write(2) is what a handler may call; the step may take minutes before the save begins.
    static const char kSaying[] =
        "\nshardtrain: Ctrl-C: saving a checkpoint after this step, then stopping (exit code 75); Ctrl-C again stops at "
        "once, without that save\n";
    [[maybe_unused]] const ssize_t n = ::write(2, kSaying, sizeof kSaying - 1);
  }
  g_signal = sig;
}

void install(struct ::sigaction* old) {
  struct ::sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(PreemptionHooks::kStopSignals); ++i)
    ::sigaction(PreemptionHooks::kStopSignals[i], &sa, old ? &old[i] : nullptr);
}

}  // namespace

const char* PreemptionHooks::signal_label(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT (Ctrl-C)";
    case SIGHUP: return "SIGHUP (its terminal closed)";
    default: return "a signal";
  }
}

void PreemptionHooks::catch_signals_from_now() {
  g_signal = 0;
  g_caught_early = true;
  install(nullptr);
}

void PreemptionHooks::release_early_signals() {
  g_caught_early = false;
  for (const int sig : kStopSignals) std::signal(sig, SIG_DFL);
  if (const int sig = g_signal; sig != 0) std::raise(sig);
}

PreemptionHooks::PreemptionHooks() {
  if (!g_caught_early) g_signal = 0;
  install(old_);
}

PreemptionHooks::~PreemptionHooks() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &old_[i], nullptr);
}

bool PreemptionHooks::stop_before_start(MPI_Comm world) {
  const int mine = g_signal;
  int sig[2] = {mine == SIGUSR1 ? 1 : 0, terminating(mine) ? 1 : 0};
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sig, 2, MPI_INT, MPI_MAX, world));
  agreed_signal_ = sig[1] ? (terminating(mine) ? mine : SIGTERM) : sig[0] ? SIGUSR1 : 0;
  if (agreed_signal_ == 0) return false;
  preempted_ = true;
  signal_ = agreed_signal_;
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  if (rank == 0)  // the ranks agreed: one line for the job
    log::warn(
        "preemption: {} received during the start-up, before the first step: stopping with nothing new to save "
        "(exit code 75: requeue)",
        signal_label(signal_));
  return true;
}

void PreemptionHooks::contribute(std::span<double> mine) {
  const int sig = static_cast<int>(g_signal);
  mine[0] = sig == SIGUSR1 ? 1.0 : 0.0;
  mine[1] = terminating(sig) ? 1.0 : 0.0;
}

void PreemptionHooks::agreed(std::span<const double> sums) {
  // Signals reach ranks at different moments: SIGTERM if any rank has one, else SIGUSR1 if any has that (the
  // larger signal number, as before), so all stop after the same step.
  // This rank's own name for it where it has one (a Ctrl-C is said as such).
  const int sig = g_signal;
  agreed_signal_ = sums[1] > 0 ? (terminating(sig) ? sig : SIGTERM) : sums[0] > 0 ? SIGUSR1 : 0;
}

void PreemptionHooks::say_signal_after_the_last_step(Trainer& trainer) {
  double flags[2] = {0, 0};
  contribute(flags);
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_DOUBLE, MPI_SUM, trainer.runtime().world()));
  if (finishing_ || (flags[0] == 0 && flags[1] == 0) || trainer.runtime().topology().world_rank != 0) return;
  const int sig = g_signal;  // rank 0's own name for it where it has one
  log::warn(
      "preemption: {} received after the last step ({}), during the run's final validation or save: the run finished "
      "all the same (exit code 0, not 75: nothing is left to train)",
      sig != 0       ? signal_label(sig)
      : flags[1] > 0 ? "SIGTERM"
                     : "SIGUSR1",
      trainer.state().step);
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
                signal_label(sig), trainer.state().step);
    return;
  }
  preempted_ = true;
  signal_ = sig;
  if (rank0)
    log::warn("preemption: {} received, saving a checkpoint after step {} and stopping (exit code 75: requeue)",
              signal_label(sig), trainer.state().step);
  trainer.request_save();
  trainer.request_stop();
}

}  // namespace shardtrain::train
