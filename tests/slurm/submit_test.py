#!/usr/bin/env python3
"""jobs/slurm/submit.sh with Slurm's client tools and shardtrain played by scripts (no Slurm, no root, seconds):
sbatch records each submission (its options, directory and the variables the jobs read) and answers job ids
from 100 up, or refuses an option listed in FAKE_SBATCH_REFUSE as sbatch refuses a typo; scancel and
`scontrol release` are recorded; `scontrol show job N` names the job's output file; `shardtrain check` (the
preflight) records its command line and directory. Each case asserts what was queued, held, released or
cancelled, the exit code and the message: typos in LAUNCHER, GPU_BIND, VERIFY_DATA, MAX_RESTARTS and EVALUATE,
and a --time the --signal warning does not fit in, are refused before anything is checked or queued (the jobs
would refuse them after their queue wait)."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
SUBMIT = os.path.join(SOURCE, "jobs", "slurm", "submit.sh")
MULTI = os.path.join(SOURCE, "jobs", "slurm", "train-multi-node.sbatch")
SINGLE = os.path.join(SOURCE, "jobs", "slurm", "train-single-node.sbatch")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


FAKE_SBATCH = r"""#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_LOG"] + ".sbatch"
n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
argv = sys.argv[1:]
refuse = os.environ.get("FAKE_SBATCH_REFUSE", "").split()
for a in argv:
    if a in refuse:
        print(f"sbatch: error: invalid option or value: {a}", file=sys.stderr)
        sys.exit(1)
keys = ("RUN_DIR", "CHECKPOINT_DIR", "OUTPUT", "OUTPUT_JSON", "ST_RUN_DIR_GENERATED", "SHARDTRAIN_HOME", "SHARDTRAIN_BIN", "TRAIN_ARGS")
with open(log, "a") as f:
    f.write(json.dumps({"id": 100 + n, "argv": argv, "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}}) + "\n")
print(100 + n)
"""
FAKE_SCANCEL = r"""#!/bin/bash
echo "scancel $*" >> "$FAKE_LOG"
exit "${FAKE_SCANCEL_RC:-0}"
"""
FAKE_SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
case "$1" in
  show) echo "JobId=$3 JobName=x"; echo "   StdOut=/shared/logs/out-$3.txt"; echo "   Power=" ;;
  release) exit "${FAKE_RELEASE_RC:-0}" ;;
esac
"""
FAKE_SHARDTRAIN = r"""#!/bin/bash
echo "$PWD|$*" >> "$FAKE_LOG.check"
exit "${FAKE_CHECK_RC:-0}"
"""
FAKE_DATE = r"""#!/bin/bash
if [[ "$1" == "+%Y%m%d-%H%M%S" ]]; then echo 20261128-033034; else exec /bin/date "$@"; fi
"""


class Env:
    def __init__(self, name):
        self.root = tempfile.mkdtemp(prefix=f"submit-{name}-")
        self.bin = os.path.join(self.root, "bin")
        os.makedirs(self.bin)
        for tool, text in (("sbatch", FAKE_SBATCH), ("scancel", FAKE_SCANCEL), ("scontrol", FAKE_SCONTROL),
                           ("shardtrain", FAKE_SHARDTRAIN), ("date", FAKE_DATE)):
            path = os.path.join(self.bin, tool)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, stat.S_IRWXU)
        self.log = os.path.join(self.root, "calls")
        self.home = os.path.join(self.root, "home")  # where the user stands
        os.makedirs(self.home)

    def submit(self, *argv, cwd=None, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RUN_DIR", "CHECKPOINT_DIR", "OUTPUT", "LAUNCHER", "GPU_BIND",
                                                                       "VERIFY_DATA", "TRAIN_ARGS", "RESTART_ON", "MAX_RESTARTS", "ST_",
                                                                       "PREPARE", "EVALUATE", "EVAL_", "SHARDTRAIN", "PREFLIGHT", "GPU_MEMORY"))}
        e.update(PATH=f"{self.bin}:{os.environ['PATH']}", FAKE_LOG=self.log, CONFIG="configs/sweep.toml",
                 SHARDTRAIN_BIN=os.path.join(self.bin, "shardtrain"), SHARDTRAIN_HOME=SOURCE)
        e.update({k: v for k, v in env.items() if v is not None})
        for k in [k for k, v in env.items() if v is None]:
            e.pop(k, None)
        p = subprocess.run([SUBMIT, *argv], cwd=cwd or self.home, env=e, capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def sbatch_calls(self):
        path = self.log + ".sbatch"
        return [json.loads(l) for l in open(path)] if os.path.exists(path) else []

    def calls(self):
        return open(self.log).read().splitlines() if os.path.exists(self.log) else []

    def checks(self):
        path = self.log + ".check"
        return open(path).read().splitlines() if os.path.exists(path) else []

    def reset(self):
        for suffix in ("", ".sbatch", ".check"):
            if os.path.exists(self.log + suffix):
                os.remove(self.log + suffix)

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


OPTS = ["--nodes=1", "--ntasks-per-node=2"]

# ---- typos refused before anything is checked or queued -----------------------------------------------------
env = Env("typos")
for argv, extra, code, message in (
        ([], dict(LAUNCHER="mpiexec"), 3, "LAUNCHER=mpiexec: expected srun or mpirun"),
        ([], dict(GPU_BIND="gpu"), 3, "GPU_BIND=gpu: expected node"),
        ([], dict(VERIFY_DATA="yes"), 3, "VERIFY_DATA=yes: expected auto, 1 or 0"),
        ([], dict(MAX_RESTARTS="08"), 3, "MAX_RESTARTS=08: expected a whole number, without leading zeros"),
        ([], dict(EVALUATE="yes"), 3, "EVALUATE=yes: expected 1"),
        (["--time=5"], {}, 3, "--time=5 (300 s) is not longer than the warning --signal=B:USR1@300 gives before it (300 s;"),
        (["-t", "0:300"], {}, 3, "--time=0:300 (300 s) is not longer than the warning"),
        (["--time=10", "--signal=B:USR1@600"], {}, 3, "--time=10 (600 s) is not longer than the warning --signal=B:USR1@600")):
    env.reset()
    rc, out, err = env.submit(SINGLE, *OPTS, *argv, **extra)
    check(rc == code and message in err and not env.sbatch_calls() and not env.checks() and not os.path.exists(os.path.join(env.home, "runs")),
          f"{argv} {extra}: exit {rc}, expected {code} and {message!r}, nothing checked or queued: {env.sbatch_calls()}: {err}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, LAUNCHER="srun", GPU_BIND="task", VERIFY_DATA="0", MAX_RESTARTS="10", EVALUATE="0")
check(rc == 0 and len(env.sbatch_calls()) == 2 and len(env.checks()) == 1, f"good settings are accepted: exit {rc}: {err}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, "--time=6", "--signal=B:USR1@60")
check(rc == 0 and len(env.sbatch_calls()) == 2, f"--time=6 with a 60 s warning is accepted: exit {rc}: {err}")
env.close()

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all submit.sh checks passed")
