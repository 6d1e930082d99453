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

# The launcher in a process group of its own (job control on while it starts): Ctrl-C on a terminal reaches the
# foreground group, this script, and not mpirun, which would end the job on it. Its stdin is not the terminal
# then (a background group reading it would be stopped): shardtrain reads none.
set -m
if [[ -t 0 ]]; then "$@" </dev/null & else "$@" & fi
child=$!
set +m
signalled=0
interrupts=0
on_stop() {
  signalled=1
  echo "launch.sh: $1 received: asking the ranks to save a checkpoint and stop (exit code 75)" >&2
  kill -USR1 "$child" 2>/dev/null
}
on_interrupt() {
  interrupts=$((interrupts + 1))
  if ((interrupts >= 2)); then
    signalled=1
    echo "launch.sh: second SIGINT: stopping without waiting for the save" >&2
    kill -TERM "$child" 2>/dev/null
  else
    on_stop SIGINT
  fi
}
trap 'on_stop SIGTERM' TERM
trap 'on_stop SIGUSR1' USR1
trap on_interrupt INT
while true; do
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
