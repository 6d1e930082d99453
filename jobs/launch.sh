#!/usr/bin/env bash
# jobs/launch.sh LAUNCHER ARGS...: runs a launcher (mpirun, srun) so that stopping it by hand ends in the status
# docs/exit-codes.md gives a preempted run, 75, instead of 1.
#
# Open MPI's mpirun (4.1) ends a job it receives SIGTERM or SIGINT (Ctrl-C) for itself: it passes SIGTERM to the
# ranks, which save a checkpoint and exit with 75, but mpirun then exits with 1 whatever they returned, and it
# refuses to forward SIGTERM instead (ess_base_forward_signals). It forwards SIGUSR1 and then exits with the
# ranks' own status. So this script passes SIGTERM and SIGINT on to the launcher as SIGUSR1: every rank saves
# after the current step and exits 75, and so does this script. A second SIGINT (Ctrl-C twice) passes SIGTERM:
# the launcher ends the job at once (its status, 1 for mpirun, as a stop without a save).
#
#   jobs/launch.sh mpirun -np 2 build/bin/shardtrain train --config configs/tiny-cpu.toml --resume auto
#
# Exit status: the launcher's (75 when the ranks saved and stopped on a signal). The Slurm scripts do the same
# in st_launch (jobs/slurm/lib.sh).
set -u
if (($# == 0)); then
  echo "usage: $0 LAUNCHER ARGS... (e.g. mpirun -np 2 build/bin/shardtrain train --config X)" >&2
  exit 2
fi

child=""
launcher=$(basename "$1")
signalled=0
interrupts=0
pending=""  # a stop that came while the ranks were starting: passed on once they catch it
held_since=0

# ranks_ready: every shardtrain process below mpirun (this machine's ranks) catches SIGUSR1 (SigCgt in
# /proc/PID/status). Its handler is set in main()'s first line, once the binary and its libraries are loaded (about
# 0.2 s for a CUDA build); a SIGUSR1 before that ends the rank (138, no checkpoint, no result.json), and one before
# mpirun has started them goes nowhere (the run then trains on). Other launchers (srun: the tasks are slurmstepd's)
# are not looked into.
ranks_ready() {
  case "$launcher" in mpirun | mpiexec | orterun) ;; *) return 0 ;; esac
  local queue=("$child") found=0 p k mask
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    for k in $(pgrep -P "$p" 2>/dev/null); do
      queue+=("$k")
      [[ "$(cat "/proc/$k/comm" 2>/dev/null)" == shardtrain ]] || continue
      found=1
      mask=$(awk '/^SigCgt:/ {print $2}' "/proc/$k/status" 2>/dev/null)
      [[ -n "$mask" ]] && (((16#$mask >> 9) & 1)) || return 1  # bit 9: SIGUSR1 (10)
    done
  done
  ((found))
}
pass_on() {
  if [[ -n "$child" ]] && ranks_ready; then
    kill -"$1" "$child" 2>/dev/null
  else
    echo "launch.sh: the ranks are still starting: the stop goes to them as soon as they can take it" >&2
    pending=$1
    held_since=$SECONDS
  fi
}
on_stop() {
  signalled=1
  echo "launch.sh: $1 received: asking the ranks to save a checkpoint and stop (exit code 75)" >&2
  pass_on USR1
}
on_interrupt() {
  interrupts=$((interrupts + 1))
  if ((interrupts >= 2)); then
    signalled=1
    echo "launch.sh: second SIGINT: stopping without waiting for the save" >&2
    [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null
  else
    on_stop SIGINT
  fi
}
# The stops are caught before the launcher starts: one that comes while it starts is held (pass_on), not lost.
# SIGPIPE ignored here (the launcher gets the default back, below): under `launch.sh ... 2>&1 | tee log`, a Ctrl-C ends
# tee first, and this script died of SIGPIPE writing its "received" line, before it passed the stop on (status 141;
# the job trained on unseen, holding its run directory).
trap '' PIPE
trap 'on_stop SIGTERM' TERM
trap 'on_stop SIGUSR1' USR1
trap on_interrupt INT
# The launcher in a process group of its own (job control on while it starts): Ctrl-C on a terminal reaches the
# foreground group, this script, and not mpirun, which would end the job on it. Its stdin is not the terminal
# then (a background group reading it would be stopped): shardtrain reads none.
set -m
if [[ -t 0 ]]; then (trap - PIPE && exec "$@") </dev/null & else (trap - PIPE && exec "$@") & fi
child=$!
set +m
while true; do
  if [[ -n "$pending" ]]; then
    # At most 15 s: a command that takes no stop (all but train) never catches it, and then gets it as it is.
    while kill -0 "$child" 2>/dev/null && ! ranks_ready && ((SECONDS - held_since < 15)); do sleep 0.1; done
    kill -"$pending" "$child" 2>/dev/null
    pending=""
  fi
  wait "$child"
  status=$?
  # wait returns early (above 128) when a trapped signal arrives; the launcher is still running then.
  if ((signalled)) && kill -0 "$child" 2>/dev/null; then
    signalled=0
    continue
  fi
  break
done
exit "$status"
