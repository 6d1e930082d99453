#!/usr/bin/env python3
"""jobs/slurm/submit.sh with Slurm's client tools and shardtrain played by scripts (no Slurm, no root, seconds):
sbatch records each submission (its options, directory and the variables the jobs read) and answers job ids
from 100 up, or refuses an option listed in FAKE_SBATCH_REFUSE as sbatch refuses a typo; scancel and
`scontrol release` are recorded; `scontrol show job N` names the job's output file; `shardtrain check` (the
preflight) records its command line and directory. Each case asserts what was queued, held, released or
cancelled, the run directory, the exit code and the message:
1. a run directory of its own per submission, also for two in the same second (-2, -3), absolute, and made
   new; a named RUN_DIR is used as it is (a deliberate resubmission), and the preflight resumes only there;
2. the scripts found from SHARDTRAIN_HOME (or submit.sh's own repository) when run outside the repository;
3. a refused submission after others (an EVAL_SBATCH_ARGS typo, a partition the training job may not use with
   PREPARE=1): the jobs queued before are cancelled (they were held: none ran), the run directory removed, the
   exit code 2; when scancel fails too, the jobs are listed;
4. --chdir: the preflight and every job run in that directory, the run directory is made there, and the
   follow line names the training job's real output file;
5. typos in LAUNCHER, GPU_BIND, VERIFY_DATA, MAX_RESTARTS and EVALUATE, and a --time the --signal warning does
   not fit in: refused before anything is checked or queued;
6. sbatch options without a job script: the default script, not "no such job script"."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

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
  show) sleep "${FAKE_SHOW_SLEEP:-0}"; echo "JobId=$3 JobName=x"; echo "   StdOut=/shared/logs/out-$3.txt"; echo "   Power=" ;;
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

# ---- 1. a run directory of its own, even in the same second -------------------------------------------------
env = Env("same-second")
dirs = []
for i in range(3):
    env.reset()
    rc, out, err = env.submit(SINGLE, *OPTS, TRAIN_ARGS=f"--optim.lr {i + 1}e-3")
    calls = env.sbatch_calls()
    run_dir = calls[0]["env"]["RUN_DIR"] if calls else None
    dirs.append(run_dir)
    check(rc == 0 and len(calls) == 2 and f"training job 100 ({SINGLE}), run directory {run_dir}" in out, f"submission {i}: exit {rc}: {out} {err}")
    if calls:
        train, consolidate = calls
        check(train["env"]["ST_RUN_DIR_GENERATED"] == run_dir and train["env"]["CHECKPOINT_DIR"] == f"{run_dir}/checkpoints"
              and train["env"]["OUTPUT"] == f"{run_dir}/hf", f"submission {i}: the jobs' directories: {train['env']}")
        check("--hold" in train["argv"] and f"--dependency=afterok:100" in consolidate["argv"] and "scontrol release 100" in env.calls()
              and consolidate["argv"][-1] == os.path.join(SOURCE, "jobs", "slurm", "consolidate.sbatch"),
              f"submission {i}: training held until consolidation is queued, then released: {calls} {env.calls()}")
        check(all("--resume" not in c for c in env.checks()), f"submission {i}: a new run: the preflight does not resume: {env.checks()}")
want = [os.path.join(env.home, "runs", "sweep-20261128-033034" + suffix) for suffix in ("", "-2", "-3")]
check(dirs == want and all(os.path.isdir(d) for d in want), f"three submissions in one second, three run directories: {dirs}")
# RUN_DIR named: used as it is (relative to where the jobs run, made absolute), a resubmission that resumes.
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="runs/sweep-20261128-033034")
calls = env.sbatch_calls()
check(rc == 0 and calls and calls[0]["env"]["RUN_DIR"] == want[0] and calls[0]["env"]["ST_RUN_DIR_GENERATED"] is None
      and all("--resume auto" in c for c in env.checks()), f"a named RUN_DIR: exit {rc}: {calls[:1]} {env.checks()}: {err}")
env.close()

# ---- 2. outside the repository: the scripts from SHARDTRAIN_HOME, or from submit.sh's own repository ------------
env = Env("elsewhere")
for home in (SOURCE, None):
    env.reset()
    rc, out, err = env.submit(SINGLE, *OPTS, SHARDTRAIN_HOME=home)
    calls = env.sbatch_calls()
    check(rc == 0 and len(calls) == 2 and calls[1]["argv"][-1] == os.path.join(SOURCE, "jobs", "slurm", "consolidate.sbatch")
          and calls[0]["env"]["SHARDTRAIN_HOME"] == SOURCE, f"SHARDTRAIN_HOME={home} from {env.home}: exit {rc}: {calls}: {err}")
env.close()

# ---- 3. a submission refused half-way: what was queued is cancelled, nothing ran, the run directory is gone ------
env = Env("refused")
rc, out, err = env.submit(SINGLE, *OPTS, EVALUATE="1", EVAL_SBATCH_ARGS="--ntask-per-node=2", FAKE_SBATCH_REFUSE="--ntask-per-node=2")
check(rc == 2 and "sbatch: error: invalid option or value: --ntask-per-node=2" in err
      and "[shardtrain submit] error: not submitted: sbatch refused the evaluation job (its message is above)" in err
      and "cancelled the job(s) this submission had queued (held: none had started): 100 101" in err
      and "scancel 100 101" in env.calls() and not any(c.startswith("scontrol release") for c in env.calls())
      and "training job" not in out and not os.path.exists(os.path.join(env.home, "runs")),
      f"an EVAL_SBATCH_ARGS typo: exit {rc}: {env.calls()}: {out} {err}")
env.reset()
corpus = os.path.join(env.home, "corpus.txt")
open(corpus, "w").write("text\n")
open(os.path.join(env.home, "tok.json"), "w").write("{}\n")
rc, out, err = env.submit(SINGLE, *OPTS, "--partition=gpu", PREPARE="1", INPUT=corpus, TOKENIZER="tok.json", DATASET="data/new.h5",
                          FAKE_SBATCH_REFUSE="--partition=gpu")
calls = env.sbatch_calls()
check(rc == 2 and len(calls) == 1 and calls[0]["argv"][-1].endswith("prepare-data.sbatch") and "--hold" in calls[0]["argv"]
      and "scancel 100" in env.calls() and not any(c.startswith("scontrol release") for c in env.calls())
      and not os.path.exists(os.path.join(env.home, "data", "new.h5")), f"PREPARE=1, training refused: exit {rc}: {calls} {env.calls()}: {err}")
# PREPARE=1 with a --dependency of the user's (it replaced the wait for the data: training started before it existed),
# and a DATASET with a space (two words in TRAIN_ARGS): refused before anything is queued.
for extra, env_extra, code, message in (
        (["--dependency=afterany:7"], {}, 2, "PREPARE=1: the training job waits for the preparation (--dependency=afterok:PREP); "
         "--dependency=afterany:7 would replace that"),
        ([], {"DATASET": "data/my new.h5"}, 3, "DATASET=data/my new.h5: PREPARE=1 passes it to the training job in TRAIN_ARGS")):
    env.reset()
    rc, out, err = env.submit(SINGLE, *OPTS, *extra, PREPARE="1", INPUT=corpus, TOKENIZER="tok.json",
                              **{"DATASET": "data/new.h5", **env_extra})
    check(rc == code and message in err and not env.sbatch_calls(), f"PREPARE=1 {extra} {env_extra}: exit {rc}: {err}")
# A run continued by a second submission into its RUN_DIR, whose hf export exists: no consolidation job (it failed,
# never overwriting); a script among the options (sbatch ran it instead) and --wait (held jobs: a wait without end).
env.reset()
os.makedirs(os.path.join(env.home, "continued", "hf"))
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="continued")
calls = env.sbatch_calls()
check(rc == 0 and len(calls) == 1 and "/continued/hf exists (an earlier consolidation of this run): no consolidation job queued" in out + err
      and re.search(r"consolidation job \d", out) is None, f"a continued run with its export: exit {rc}: {calls}: {out} {err}")
for extra, message in ((["--wait"], "--wait: submit.sh queues held jobs"),
                       ([SINGLE], f"'{SINGLE}' among the sbatch options: sbatch would run it")):
    env.reset()
    rc, out, err = env.submit(*OPTS, *extra)
    check(rc == 2 and message in err and not env.sbatch_calls(), f"{extra}: exit {rc}: {err}")
# A % in RUN_DIR is itself in the jobs' --output (sbatch read "%x" in it as the job's name: the log went elsewhere).
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="drop-10%x")
calls = env.sbatch_calls()
check(rc == 0 and len(calls) == 2 and any(a.endswith("drop-10%%x/consolidate-%j.out") for a in calls[1]["argv"]),
      f"a % in RUN_DIR: exit {rc}: {calls}: {err}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="named", EVALUATE="1", FAKE_SBATCH_REFUSE=os.path.join(SOURCE, "jobs", "slurm", "evaluate.sbatch"),
                          FAKE_SCANCEL_RC="1")
check(rc == 2 and "could not cancel the job(s) this submission queued: 100 101; cancel them with scancel 100 101" in err
      and not os.path.exists(os.path.join(env.home, "named")), f"scancel failing too: the jobs are listed: exit {rc}: {err}")
# A named RUN_DIR whose folders above it did not exist: they go with it (mkdir -p made them, and they were left).
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="deep/er/run", EVALUATE="1", FAKE_SBATCH_REFUSE=os.path.join(SOURCE, "jobs", "slurm", "evaluate.sbatch"))
check(rc == 2 and not os.path.exists(os.path.join(env.home, "deep")), f"a refused submission removes the folders it made: exit {rc}: {os.listdir(env.home)}")
os.makedirs(os.path.join(env.home, "kept"))
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, RUN_DIR="kept/new/run", EVALUATE="1", FAKE_SBATCH_REFUSE=os.path.join(SOURCE, "jobs", "slurm", "evaluate.sbatch"))
check(rc == 2 and os.path.isdir(os.path.join(env.home, "kept")) and os.listdir(os.path.join(env.home, "kept")) == [],
      f"a folder that was there stays: exit {rc}: {os.listdir(env.home)}")
# Ctrl-C once the jobs are queued and released: they stay queued, and the message says so (it said "not submitted").
env.reset()
e = dict(os.environ, PATH=f"{env.bin}:{os.environ['PATH']}", FAKE_LOG=env.log, CONFIG="configs/sweep.toml",
         SHARDTRAIN_BIN=os.path.join(env.bin, "shardtrain"), SHARDTRAIN_HOME=SOURCE, FAKE_SHOW_SLEEP="30")
for k in ("RUN_DIR", "EVALUATE", "PREPARE", "OUTPUT"):
    e.pop(k, None)
p = subprocess.Popen([SUBMIT, SINGLE, *OPTS], cwd=env.home, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                     start_new_session=True)
deadline = time.time() + 30
while time.time() < deadline and not any(c.startswith("scontrol show") for c in env.calls()):
    time.sleep(0.05)
os.killpg(p.pid, signal.SIGINT)
out, err = p.communicate(timeout=30)
check(p.returncode == 130 and "interrupted after the jobs were queued: they stay queued (squeue -j 100,101; scancel 100,101 cancels them)" in err
      and "not submitted" not in err and not any(c.startswith("scancel") for c in env.calls()),
      f"Ctrl-C after the release: exit {p.returncode}: {env.calls()}: {err}")
env.close()

# ---- 4. --chdir: one directory for the preflight and every job ------------------------------------------------
env = Env("chdir")
os.makedirs(os.path.join(env.home, "project"))
rc, out, err = env.submit(SINGLE, *OPTS, "--chdir=project", EVALUATE="1")
calls = env.sbatch_calls()
project = os.path.join(env.home, "project")
run_dir = os.path.join(project, "runs", "sweep-20261128-033034")
check(rc == 0 and len(calls) == 3 and all(c["argv"][-2] == f"--chdir={project}" for c in calls)
      and calls[0]["env"]["RUN_DIR"] == run_dir and os.path.isdir(run_dir) and env.checks() and env.checks()[0].startswith(project + "|")
      and calls[2]["env"]["OUTPUT_JSON"] == f"{run_dir}/eval.json",
      f"--chdir=project: every job, the run directory and the preflight there: exit {rc}: {calls}: {env.checks()}: {err}")
check("follow: squeue -j 100,101,102 ; tail -f /shared/logs/out-100.txt" in out, f"the follow line names the real output file: {out}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, "--chdir", "nowhere")
check(rc == 2 and "--chdir=nowhere: no such directory" in err and not env.sbatch_calls(), f"--chdir to nowhere: exit {rc}: {err}")
env.close()

# ---- 5. typos refused before anything is checked or queued -----------------------------------------------------
env = Env("typos")
for argv, extra, code, message in (
        ([], dict(LAUNCHER="mpiexec"), 3, "LAUNCHER=mpiexec: expected srun or mpirun"),
        ([], dict(GPU_BIND="gpu"), 3, "GPU_BIND=gpu: expected node"),
        ([], dict(VERIFY_DATA="yes"), 3, "VERIFY_DATA=yes: expected auto, 1 or 0"),
        ([], dict(MAX_RESTARTS="08"), 3, "MAX_RESTARTS=08: expected a whole number, without leading zeros"),
        ([], dict(EVALUATE="yes"), 3, "EVALUATE=yes: expected 1"),
        (["--time=5"], {}, 3, "--time=5 (300 s) is not longer than the warning --signal=B:USR1@300 gives before it (300 s;"),
        (["-t", "0:300"], {}, 3, "--time=0:300 (300 s) is not longer than the warning"),
        (["--time=10", "--signal=B:USR1@600"], {}, 3, "--time=10 (600 s) is not longer than the warning --signal=B:USR1@600"),
        # sbatch's input variables, between the script's lines and the options: they were not looked at.
        (["--time=10"], dict(SBATCH_SIGNAL="B:USR1@600"), 3, "--time=10 (600 s) is not longer than the warning --signal=B:USR1@600"),
        ([], dict(SBATCH_TIMELIMIT="5"), 3, "--time=5 (300 s) is not longer than the warning --signal=B:USR1@300"),
        # The jobs read their settings from the environment sbatch passes on; without it each stopped at its start.
        (["--export=NONE"], {}, 2, "--export=NONE: the jobs read CONFIG, RUN_DIR, TRAIN_ARGS"),
        (["--export", "CONFIG,RUN_DIR"], {}, 2, "--export CONFIG,RUN_DIR: the jobs read CONFIG"),
        ([], dict(SBATCH_EXPORT="NIL"), 2, "SBATCH_EXPORT=NIL: the jobs read CONFIG"),
        (["--no-requeue"], {}, 2, "--no-requeue: the training job requeues itself"),
        ([], dict(SBATCH_NO_REQUEUE="1"), 2, "SBATCH_NO_REQUEUE=1: the training job requeues itself"),
        ([], dict(SBATCH_WAIT="1"), 2, "SBATCH_WAIT=1: sbatch would wait for the held jobs")):
    env.reset()
    rc, out, err = env.submit(SINGLE, *OPTS, *argv, **extra)
    check(rc == code and message in err and not env.sbatch_calls() and not env.checks() and not os.path.exists(os.path.join(env.home, "runs")),
          f"{argv} {extra}: exit {rc}, expected {code} and {message!r}, nothing checked or queued: {env.sbatch_calls()}: {err}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, "--time=6", "--signal=B:USR1@60")
check(rc == 0 and len(env.sbatch_calls()) == 2, f"--time=6 with a 60 s warning is accepted: exit {rc}: {err}")
env.reset()
rc, out, err = env.submit(SINGLE, *OPTS, "--export=ALL,FOO=1")
check(rc == 0 and len(env.sbatch_calls()) == 2, f"--export=ALL,FOO=1 is accepted: exit {rc}: {err}")
env.close()

# ---- 6. options without a script: the default script --------------------------------------------------------
env = Env("no-script")
rc, out, err = env.submit("--nodes=1", "--ntasks-per-node=2", "--time=60")
calls = env.sbatch_calls()
check(rc == 0 and calls and calls[0]["argv"][-1] == MULTI and "--nodes=1" in calls[0]["argv"], f"options first: the default script: exit {rc}: {calls}: {err}")
env.reset()
rc, out, err = env.submit("jobs/slurm/no-such.sbatch", "--nodes=1")
check(rc == 2 and "jobs/slurm/no-such.sbatch: no such job script (usage: " in err and not env.sbatch_calls(), f"a missing script: exit {rc}: {err}")
env.close()

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all submit.sh checks passed")
