"""What the Slurm tests that run lib.sh without a Slurm share: the failure list their checks add to, and a fake
scontrol that logs each call to $FAKE_LOG and answers `show job` from FAKE_STATE, FAKE_REASON, FAKE_TIMELIMIT and
FAKE_EXC (ExcNodeList), `requeue` with SIGTERM to its caller (as Slurm ends a requeued job's batch script) or
FAKE_REQUEUE_RC, and `update` with FAKE_UPDATE_RC."""
import os
import stat

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
case "$1 $2" in
  "show job") echo "JobId=$SLURM_JOB_ID JobName=shardtrain JobState=${FAKE_STATE:-RUNNING} Reason=${FAKE_REASON:-None} TimeLimit=${FAKE_TIMELIMIT:-UNLIMITED} Partition=debug ExcNodeList=${FAKE_EXC:-(null)} NodeList=node1" ;;
  "show hostnames") tr ',' '\n' <<<"$3" ;;
  requeue*) [[ "${FAKE_REQUEUE_RC:-0}" == 0 ]] || exit "$FAKE_REQUEUE_RC"; kill -TERM "$PPID" ;;
  update*) exit "${FAKE_UPDATE_RC:-0}" ;;
esac
"""


def write_tools(bin_dir, tools):
    """Writes each (name, script text) of `tools` into bin_dir as an executable."""
    for name, text in tools:
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
