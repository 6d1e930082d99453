#!/usr/bin/env python3
"""jobs/slurm/train-single-node.sbatch run by bash as Slurm runs it (SLURM_* variables set), with Slurm's tools
(scontrol, srun), the launcher (mpirun) and shardtrain played by scripts, in seconds and without root. The fakes
behave as the real ones do where the job depends on it:
- mpirun starts its rank after FAKE_LAUNCH_DELAY and forwards SIGUSR1 only to a rank that exists (a signal
  before then is lost, as Open MPI loses it); on SIGTERM it ends the rank with SIGTERM and exits 1 whatever the
  rank returned (Open MPI 4.1);
- the fake `shardtrain train` has no signal handler for FAKE_UP_DELAY (a process still loading: SIGUSR1 kills
  it), then catches SIGUSR1/SIGTERM, rewrites CHECKPOINT_DIR/.shardtrain.lock as the real one does after
  MPI_Init, trains FAKE_STEPS steps into metrics.jsonl, and on a signal saves step_N (DONE) and writes
  result.json "preempted" with exit 75;
- `shardtrain check` prints a report, and with FAKE_CHECK_WAIT runs until that file appears (a --verify-data of
  a large dataset); `plan` says ok;
- scontrol answers `show job` from FAKE_STATE, FAKE_REASON, FAKE_TIMELIMIT and signals the script with SIGTERM
  on `requeue`; srun runs its command once per node of FAKE_NODES_UP.
Each case asserts the exit code, whether the job requeued itself, what ran, and the line it logged:
1. a stop signal during the checks: no silent death, the check is stopped, the job requeues without launching;
2. a stop signal while the launcher starts: held until the rank is up, then passed on (mpirun would lose it);
3. a job-wide SIGTERM under mpirun: mpirun says 1, result.json says preempted: requeued as 75; when the job is
   being cancelled (COMPLETING) it is not requeued, and the log names the RUN_DIR that continues it;
4. two starts in a row that train nothing: the second ends the job instead of requeueing it again;
5. a --time the --signal warning does not fit in: refused at start, before any check;
6. a first start in a run directory holding checkpoints: refused unless RUN_DIR was named (then continued, and
   the log says from which checkpoint); requeues continue; a fresh first start runs without --resume;
7. LAUNCHER, GPU_BIND and VERIFY_DATA typos end the job before its mesh check and preflight;
8. the preflight's usage errors keep check's own words, and the mesh check (plan) takes TRAIN_ARGS as the run does
   (the real binary, with --shardtrain);
9. the directory probe on 2 nodes with a quote and a $(...) in the path: written, nothing executed;
10. consolidate.sbatch's default output: hf beside a run's checkpoint directory, hf-step_N beside the directory
    that holds one checkpoint given alone (not among the checkpoints)."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
LIB = os.path.join(SOURCE, "jobs", "slurm", "lib.sh")
SCRIPT = os.path.join(SOURCE, "jobs", "slurm", "train-single-node.sbatch")
parser = argparse.ArgumentParser()
parser.add_argument("--shardtrain", help="the real binary, for the preflight's messages (case 8)")
args, _ = parser.parse_known_args()
sys.path.insert(0, HERE)
from fake_slurm import SCONTROL as FAKE_SCONTROL, check, failures, write_tools  # noqa: E402

FAKE_SRUN = r"""#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
while [[ "$1" == --* ]]; do shift; done
for node in ${FAKE_NODES_UP-node1 node2}; do SLURMD_NODENAME=$node "$@"; done
"""
FAKE_MPIRUN = r"""#!/bin/bash
echo "mpirun $*" >> "$FAKE_LOG"
while (($#)); do case "$1" in -np | --map-by | --bind-to) shift 2 ;; --mca) shift 3 ;; *) break ;; esac; done
rank="" term=0 traps=0
trap '((++traps)); echo "mpirun: USR1" >> "$FAKE_LOG"; [[ -n "$rank" ]] && kill -USR1 "$rank"' USR1
trap '((++traps)); term=1; [[ -n "$rank" ]] && kill -TERM "$rank"' TERM
sleep "${FAKE_LAUNCH_DELAY:-0}"
"$@" &
rank=$!
while true; do
  n=$traps
  wait "$rank"
  rc=$?
  ((traps == n)) && break
  kill -0 "$rank" 2>/dev/null && continue
  wait "$rank" 2>/dev/null
  again=$?
  ((again != 127)) && rc=$again
  break
done
((term)) && exit 1
exit "$rc"
"""
FAKE_SHARDTRAIN = r"""#!/bin/bash
echo "$*" >> "$FAKE_LOG.bin"
cmd=$1
shift
run="" ckpt="" resume=""
while (($#)); do
  case "$1" in
    --logging.run_dir) run=$2; shift ;;
    --checkpoint.dir) ckpt=$2; shift ;;
    --resume) resume=$2; shift ;;
  esac
  shift
done
# No command substitution, pipeline or other subshell once the trap is set: a job-wide SIGTERM (killpg) reaching a
# subshell bash is still setting up, or the parser in the middle of one, ended it once with "unexpected EOF while
# looking for matching `)'" under the suite's load. newest sets n, the lock's time is $EPOCHREALTIME, and counting is
# (( )) rather than $(( )).
newest() { local d; n=""; for d in "$ckpt"/step_*; do [[ -f "$d/DONE" ]] && n=${d##*/}; done; }
case "$cmd" in
  plan)
    if [[ -n "${FAKE_PLAN_WAIT:-}" ]]; then
      touch "$FAKE_PLAN_WAIT.started"
      for _ in $(seq 300); do [[ -e "$FAKE_PLAN_WAIT" ]] && break; sleep 0.1; done
    fi
    echo "config: fake"; exit 0 ;;
  check)
    if [[ -n "${FAKE_CHECK_WAIT:-}" ]]; then
      touch "$FAKE_CHECK_WAIT.started"
      for _ in $(seq 300); do [[ -e "$FAKE_CHECK_WAIT" ]] && break; sleep 0.1; done
    fi
    echo "check: fake"
    echo "  config     ok: fake"
    newest
    if [[ "$resume" == auto && -n "$n" ]]; then echo "  resume     ok: $ckpt/$n: step $((10#${n#step_}))"; else echo "  resume     ok: off"; fi
    echo "check: ok"
    exit 0 ;;
  train)
    sleep "${FAKE_UP_DELAY:-0}"  # loading, no handler yet: a signal now kills it
    stop=0
    trap 'stop=1' USR1 TERM
    mkdir -p "$ckpt" "$run"
    printf 'host fake, pid %s, since %s, run directory %s' "$$" "$EPOCHREALTIME" "$run" > "$ckpt/.shardtrain.lock"
    start=0 from=""
    newest
    if [[ "$resume" == auto && -n "$n" ]]; then ((start = 10#${n#step_})); from="$ckpt/$n"; fi
    step=$start
    while ((step < ${FAKE_STEPS:-4} && ! stop)); do
      sleep "${FAKE_STEP_TIME:-0.05}"
      ((++step))
      echo "{\"kind\": \"train\", \"step\": $step, \"loss\": 1.0}" >> "$run/metrics.jsonl"
    done
    saved=$from status=finished code=0
    if ((stop)); then status=preempted code=75; fi
    if ((step > start)); then printf -v saved '%s/step_%08d' "$ckpt" "$step"; mkdir -p "$saved"; touch "$saved/DONE"; fi
    {
      echo "{"
      echo "  \"exit_code\": $code,"
      if [[ -n "$saved" ]]; then echo "  \"last_checkpoint\": \"$saved\","; else echo "  \"last_checkpoint\": null,"; fi
      [[ -n "$from" ]] && echo "  \"resumed_from\": \"$from\","
      echo "  \"status\": \"$status\","
      echo "  \"step\": $step"
      echo "}"
    } > "$run/result.json"
    exit "$code" ;;
esac
"""


class Job:
    """One run of the training script in a fresh directory (the submit directory: RUN_DIR's default is relative)."""

    def __init__(self, name):
        self.root = tempfile.mkdtemp(prefix=f"job-{name}-")
        self.name = name
        self.bin = os.path.join(self.root, "bin")
        os.makedirs(self.bin)
        write_tools(self.bin, (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN), ("mpirun", FAKE_MPIRUN),
                               ("shardtrain", FAKE_SHARDTRAIN)))
        self.log = os.path.join(self.root, "calls")
        self.out_path = os.path.join(self.root, "job.out")
        self.config = os.path.join(self.root, "tiny.toml")
        open(self.config, "w").write("[model]\n")
        self.proc = None

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def start(self, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RUN_DIR", "CHECKPOINT_DIR", "LAUNCHER", "GPU_BIND",
                                                                       "VERIFY_DATA", "TRAIN_ARGS", "RESTART_ON", "MAX_RESTARTS", "ST_",
                                                                       "STRATEGY", "SHARD_SIZE", "GPU_MEMORY"))}
        e.update(PATH=f"{self.bin}:{os.environ['PATH']}", FAKE_LOG=self.log, SLURM_JOB_ID="42", SLURM_JOB_NAME="shardtrain",
                 SLURM_JOB_NUM_NODES="1", SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NODELIST="node1",
                 SLURM_RESTART_COUNT="0", SHARDTRAIN_HOME=SOURCE, SHARDTRAIN_BIN=os.path.join(self.bin, "shardtrain"),
                 CONFIG=self.config, GPU_MEMORY="0")
        e.update({k: v for k, v in env.items() if v is not None})
        self.out = open(self.out_path, "w")
        # A session of its own: a job-wide signal (scancel) is a signal to the whole process group.
        self.proc = subprocess.Popen(["bash", SCRIPT], cwd=self.root, env=e, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def text(self):
        return open(self.out_path, errors="replace").read()

    def wait_for(self, cond, what, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return True
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        check(False, f"{self.name}: {what} did not happen: {self.text()[-1500:]}")
        return False

    def finish(self, timeout=30):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
            check(False, f"{self.name}: the job did not end in {timeout} s")
        self.out.close()
        calls = open(self.log).read().splitlines() if os.path.exists(self.log) else []
        bin_calls = open(self.log + ".bin").read().splitlines() if os.path.exists(self.log + ".bin") else []
        print(f"{self.name}: exit {rc}")
        return rc, self.text(), calls, bin_calls

    def run(self, **env):
        return self.start(**env).finish()

    def restarts_log(self, run_dir="runs/shardtrain-42"):
        p = self.path(run_dir, "restarts.log")
        return open(p).read().splitlines() if os.path.exists(p) else []

    def make_checkpoint(self, run_dir, step):
        d = self.path(run_dir, "checkpoints", f"step_{step:08d}")
        os.makedirs(d)
        open(os.path.join(d, "DONE"), "w").close()

    def close(self):
        if not failures:  # after a failed check the directories stay, for a look (their names are in the messages)
            shutil.rmtree(self.root, ignore_errors=True)


def requeued(calls):
    return "scontrol requeue 42" in calls


def trained(bin_calls):
    return [c for c in bin_calls if c.startswith("train ")]


# ---- 1a. a job-wide SIGTERM while plan checks the mesh: plan dies of it too; that is the signal, not a bad config
# (it ended the job with exit 3 and an empty reason).
job = Job("stop-in-plan")
job.start(FAKE_PLAN_WAIT=job.path("never"))
if job.wait_for(lambda: os.path.exists(job.path("never.started")), "plan started"):
    os.killpg(job.proc.pid, signal.SIGTERM)  # Slurm signals every process of the job
rc, out, calls, bins = job.finish()
check(rc == 75 and requeued(calls) and "SIGTERM cut the checks short: the job requeues itself without starting the ranks" in out
      and "error:" not in out and not trained(bins), f"a SIGTERM during plan: exit {rc} (75 and a requeue), calls {calls}: {out}")
job.close()

# ---- 1. SIGUSR1 during the preflight (a long --verify-data): the check stops, the job requeues unlaunched --------
job = Job("stop-in-check")
job.start(FAKE_CHECK_WAIT=job.path("never"))
if job.wait_for(lambda: os.path.exists(job.path("never.started")), "the preflight started"):
    os.kill(job.proc.pid, signal.SIGUSR1)
t0 = time.time()
rc, out, calls, bins = job.finish()
check(rc == 75 and requeued(calls) and time.time() - t0 < 5, f"signal in the preflight: exit {rc} (75 and a requeue, at once), calls {calls}: {out}")
check("SIGUSR1 received during the checks: stopping them; the job requeues itself without starting the ranks" in out
      and "running:" not in out and not trained(bins), f"the log says so, and no rank was started: {out}")
check("stopped at step 0 without training a step in this start (nothing new saved); requeueing job 42 (restart 1)" in out,
      f"a requeue that says nothing was saved: {out}")
lines = job.restarts_log()
check(len(lines) == 1 and lines[0].endswith("job=42 restart=0 exit=75 step=0 excluded=- trained=0"), f"restarts.log: {lines}")
job.close()

# ---- 2. SIGUSR1 while the launcher starts its rank: held, then passed on once the rank is up -------------------
# The signal comes once mpirun runs (its first line in the calls), a second before its rank starts.
job = Job("stop-in-launch")
job.start(FAKE_LAUNCH_DELAY="1", FAKE_UP_DELAY="0.5", FAKE_STEPS="40")
if job.wait_for(lambda: os.path.exists(job.log) and any(c.startswith("mpirun -np") for c in open(job.log).read().splitlines()), "the launch"):
    os.kill(job.proc.pid, signal.SIGUSR1)
rc, out, calls, bins = job.finish()
result = json.load(open(job.path("runs/shardtrain-42/result.json"))) if os.path.exists(job.path("runs/shardtrain-42/result.json")) else {}
check(rc == 75 and requeued(calls) and result.get("status") == "preempted",
      f"a signal during the launch reaches the rank once it is up: exit {rc}, result {result}, calls {calls}: {out}")
check("SIGUSR1 received while the ranks start: it goes to them as soon as they are up" in out
      and "the ranks are up: asking them to save a checkpoint and stop (SIGUSR1)" in out, f"the log says it waited: {out}")
check(calls.count("mpirun: USR1") == 1, f"mpirun got the stop once, after its rank was up: {calls}")
job.close()

# ---- 3. a job-wide SIGTERM under mpirun (scancel, a preemption): mpirun exits 1, the rank saved: 75 --------------
for state, reason in (("RUNNING", "None"), ("COMPLETING", "None")):
    job = Job(f"sigterm-{state}")
    job.start(FAKE_STEPS="200", FAKE_STATE=state, FAKE_REASON=reason)
    if job.wait_for(lambda: os.path.exists(job.path("runs/shardtrain-42/metrics.jsonl"))
                    and len(open(job.path("runs/shardtrain-42/metrics.jsonl")).readlines()) >= 3, "three steps"):
        os.killpg(job.proc.pid, signal.SIGTERM)  # Slurm signals every process of the job
    rc, out, calls, bins = job.finish()
    saved = [d for d in os.listdir(job.path("runs/shardtrain-42/checkpoints")) if d.startswith("step_")] if os.path.isdir(job.path("runs/shardtrain-42/checkpoints")) else []
    check("the launcher exited with 1, but the ranks stopped on the signal and saved (result.json: preempted, step " in out
          and "counted as 75" in out and saved, f"{state}: mpirun's 1 is read as the preemption it is: {out}")
    if state == "RUNNING":
        check(rc == 75 and requeued(calls) and "checkpoint saved at step" in out and "requeueing job 42 (restart 1)" in out,
              f"a SIGTERM to a running job requeues it: exit {rc}, calls {calls}: {out}")
    else:
        check(rc == 75 and not requeued(calls) and "job 42 is being cancelled (JobState=COMPLETING, Reason=None), "
              "so it is not requeued: the run stopped at step" in out and "to continue it, resubmit with RUN_DIR=runs/shardtrain-42" in out,
              f"a cancelled job is not requeued, and the log says what continues the run: exit {rc}, calls {calls}: {out}")
    job.close()

# ---- 4. two starts in a row that train nothing: the second ends the job ----------------------------------------
for previous, want_requeue in (("trained=0", False), ("trained=5", True)):
    job = Job(f"no-progress-{previous}")
    os.makedirs(job.path("runs/shardtrain-42"))
    job.make_checkpoint("runs/shardtrain-42", 5)
    open(job.path("runs/shardtrain-42/restarts.log"), "w").write(
        f"2026-11-28T03:00:00Z job=41 restart=0 exit=75 step=0 excluded=- trained=0\n"
        f"2026-11-28T03:10:00Z job=42 restart=0 exit=75 step=5 excluded=- {previous}\n")
    job.start(SLURM_RESTART_COUNT="1", FAKE_CHECK_WAIT=job.path("never"))
    if job.wait_for(lambda: os.path.exists(job.path("never.started")), "the preflight started"):
        os.kill(job.proc.pid, signal.SIGUSR1)
    rc, out, calls, bins = job.finish()
    if want_requeue:
        check(rc == 75 and requeued(calls) and len(job.restarts_log()) == 3,
              f"one start without a step after one with steps is requeued: exit {rc}, {calls}: {out}")
    else:
        check(rc == 75 and not requeued(calls) and "error: not requeueing job 42 again: this start and the one before it were stopped "
              "before they trained a step (at step 5;" in out and "resubmit with RUN_DIR=runs/shardtrain-42 to continue from step 5" in out
              and len(job.restarts_log()) == 2, f"a second start without a step ends the job: exit {rc}, {calls}: {out}")
    job.close()

# ---- 5. a --time the --signal=B:USR1@300 warning does not fit in: refused before the checks -------------------
for limit, ok in (("00:05:00", False), ("4", False), ("00:05:01", True)):
    job = Job("time-" + limit.replace(":", ""))
    rc, out, calls, bins = job.run(FAKE_TIMELIMIT=limit)
    if ok:
        check(rc == 0 and "training finished" in out, f"TimeLimit={limit} is accepted: exit {rc}: {out}")
    else:
        check(rc == 3 and f"error: --time={limit} (" in out and "is not longer than the warning --signal=B:USR1@300 gives before it (300 s;"
              in out and not bins, f"TimeLimit={limit} is refused at start, before any check: exit {rc}, {bins}: {out}")
    job.close()

# ---- 6. a first start in a run directory holding checkpoints -------------------------------------------------
# The default directory (runs/<name>-<id>: a reset Slurm reuses ids) or one submit.sh made: refused, exit 5.
for name, env in (("default", {}), ("generated", dict(RUN_DIR="runs/sweep-20261128-033034", ST_RUN_DIR_GENERATED="runs/sweep-20261128-033034"))):
    job = Job(f"owner-{name}")
    run_dir = env.get("RUN_DIR", "runs/shardtrain-42")
    job.make_checkpoint(run_dir, 16)
    rc, out, calls, bins = job.run(**env)
    check(rc == 5 and f"error: RUN_DIR={run_dir} holds the checkpoints of an earlier run ({run_dir}/checkpoints/step_00000016, 1 complete)" in out
          and f"To continue that run, resubmit with RUN_DIR={run_dir};" in out and not [b for b in bins if not b.startswith("plan")]
          and os.path.exists(job.path(run_dir, "checkpoints", "step_00000016", "DONE")),
          f"{name}: another run's checkpoints are refused, untouched: exit {rc}, {bins}: {out}")
    job.close()
# A RUN_DIR the user named: a deliberate resubmission; it continues, and says from where.
job = Job("owner-named")
job.make_checkpoint("runs/sweep-a", 2)
rc, out, calls, bins = job.run(RUN_DIR="runs/sweep-a")
check(rc == 0 and "RUN_DIR=runs/sweep-a was named for this job and holds checkpoints: its first start continues that run, from "
      "runs/sweep-a/checkpoints/step_00000002: step 2" in out and all("--resume auto" in b for b in bins if not b.startswith("plan")),
      f"a named RUN_DIR continues: exit {rc}, {bins}: {out}")
job.close()
# A requeue continues its own; a fresh first start runs without --resume (the trainer's own refusal holds).
job = Job("owner-requeue")
job.make_checkpoint("runs/shardtrain-42", 2)
rc, out, calls, bins = job.run(SLURM_RESTART_COUNT="1")
check(rc == 0 and trained(bins) and "--resume auto" in trained(bins)[0] and "was named" not in out, f"a requeue resumes: exit {rc}, {bins}: {out}")
job.close()
job = Job("owner-fresh")
rc, out, calls, bins = job.run()
check(rc == 0 and trained(bins) and all("--resume" not in b for b in bins), f"a fresh first start: no --resume: exit {rc}, {bins}")
job.close()

# ---- 7. typos in the job's settings end it before its checks ---------------------------------------------------
for env, message in ((dict(LAUNCHER="mpiexec"), "LAUNCHER=mpiexec: expected srun or mpirun"),
                     (dict(GPU_BIND="gpu"), "GPU_BIND=gpu: expected node"),
                     (dict(VERIFY_DATA="yes"), "VERIFY_DATA=yes: expected auto, 1 or 0"),
                     (dict(MAX_RESTARTS="08"), "MAX_RESTARTS=08: expected a whole number, without leading zeros")):
    job = Job("settings")
    rc, out, calls, bins = job.run(**env)
    check(rc == 3 and message in out and not bins, f"{env}: exit {rc}, calls to shardtrain {bins}: {out}")
    job.close()

# ---- 8. the preflight's usage errors, with the real check: its own words, not an empty line ---------------------
if args.shardtrain:
    for extra, env, message in (([], dict(GPU_MEMORY="80G"), "usage error: --gpu-memory: '80G' is not a memory size; expected"),
                                (["--schedule.max_step", "5"], {}, "usage error: --schedule.max_step: unknown key 'schedule.max_step' (the keys of [schedule] are: ")):
        e = dict(os.environ, SLURM_JOB_ID="42", **env)
        p = subprocess.run(["bash", "-c", 'source "$0"; set -uo pipefail; ST_STOP=""; st_check_run "$@"', LIB, os.path.abspath(args.shardtrain),
                            "check", "--config", os.path.join(SOURCE, "configs", "tiny-cpu.toml"), *extra],
                           env=e, capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and f"[shardtrain job 42] error: the preflight (shardtrain check) stopped the job: {message}" in p.stderr,
              f"{extra} {env}: exit {p.returncode}: {p.stderr}")
    # The mesh check (plan) takes TRAIN_ARGS as train does: a batch they make fit 4 nodes x 8 ranks is not refused
    # after the queue wait (plan ignored them: exit 3); without them it is; an option plan does not take leaves the
    # verdict to check.
    for train_args, want, message in (("--data.global_batch_size 64", 0, "plan: per rank:"),
                                      ("", 3, "16 sequences cannot be split evenly over 32 ranks"),
                                      ("--data.global_batch_size 64 --resume auto", 0, "plan: not shown (it does not take TRAIN_ARGS as given")):
        e = dict(os.environ, SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="4", TRAIN_ARGS=train_args)
        p = subprocess.run(["bash", "-c", 'source "$0"; set -uo pipefail; ST_STOP=""; ST_RANKS_PER_NODE=8; st_check_mesh "$@"', LIB,
                            os.path.abspath(args.shardtrain), os.path.join(SOURCE, "configs", "tiny-cpu.toml"), "HYBRID_SHARD", ""],
                           env=e, capture_output=True, text=True, timeout=60)
        check(p.returncode == want and message in p.stderr + p.stdout, f"mesh check, TRAIN_ARGS={train_args!r}: exit {p.returncode}: {p.stderr}")
else:
    print("note: no --shardtrain: the preflight's messages (case 8) are not checked")

# ---- 9. the directory probe on 2 nodes: a quote and $(...) in the path are characters ---------------------------
job = Job("probe")
d = job.path("bob's run $(touch pwned)")
for nodes_up, want in (("node1 node2", 0), ("node1", 8)):
    e = dict(os.environ, PATH=f"{job.bin}:{os.environ['PATH']}", FAKE_LOG=job.log, SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="2",
             SLURM_JOB_NODELIST="node1,node2", FAKE_NODES_UP=nodes_up, PROBED=d)
    p = subprocess.run(["bash", "-c", 'source "$0"; set -uo pipefail; st_check_dir PROBED; echo probed', LIB], cwd=job.root, env=e,
                       capture_output=True, text=True, timeout=30)
    if want == 0:
        check(p.returncode == 0 and p.stdout.strip() == "probed" and os.path.isdir(d) and os.listdir(d) == [],
              f"a path with a quote is probed on both nodes: exit {p.returncode}: {p.stderr}")
    else:
        check(p.returncode == 8 and "node(s) node2 cannot write there" in p.stderr and "node1" not in p.stderr.split("node(s)")[1],
              f"a node that cannot write is named: exit {p.returncode}: {p.stderr}")
check(not os.path.exists(job.path("pwned")), "the path was not run as a command")
job.close()

# ---- 9b. the run's metrics file where logging.metrics_file names another (config.toml records it) -----------------
# st_last_step read RUN_DIR/metrics.jsonl only: a run with its own name counted as having logged no step, and its
# restarts and requeues were refused as making no progress. plot-metrics.sh looked for the same fixed name.
root = tempfile.mkdtemp(prefix="metrics-file-")
line = '{"kind":"train","step":%d,"loss":1.0}\n'
for name, where in (("train.jsonl", "train.jsonl"), (os.path.join(root, "elsewhere.jsonl"), None), (None, "metrics.jsonl")):
    run = tempfile.mkdtemp(dir=root)
    if name is not None:
        open(os.path.join(run, "config.toml"), "w").write(f'[logging]\nmetrics_file = "{name}"\nlog_every = 1\n')
    with open(name if where is None else os.path.join(run, where), "w") as f:
        f.write(line % 5 + line % 6)
    p = subprocess.run(["bash", "-c", 'source "$0"; set -uo pipefail; st_last_step "$1"', LIB, run], capture_output=True,
                       text=True, timeout=30)
    check(p.returncode == 0 and p.stdout.strip() == "6", f"st_last_step with metrics_file {name}: {p.stdout!r} {p.stderr}")
shutil.rmtree(root, ignore_errors=True)

# ---- 10. consolidate.sbatch: where the export goes by default -----------------------------------------------------
# A run's checkpoint directory: hf beside it. One checkpoint: hf-step_N beside the checkpoint directory (it was
# CHECKPOINT_DIR/../hf, a folder among the run's checkpoints).
CONSOLIDATE = os.path.join(SOURCE, "jobs", "slurm", "consolidate.sbatch")
root = tempfile.mkdtemp(prefix="consolidate-")
fake = os.path.join(root, "shardtrain")
with open(fake, "w") as f:
    f.write('#!/bin/bash\nprintf "%s\\n" "$@" > "$FAKE_ARGS"\n')
os.chmod(fake, 0o755)
step = os.path.join(root, "run", "checkpoints", "step_00000024")
os.makedirs(step)
open(os.path.join(step, "index.h5"), "w").close()
for given, want in ((os.path.join(root, "run", "checkpoints"), os.path.join(root, "run", "checkpoints", "..", "hf")),
                    (step, os.path.join(root, "run", "hf-step_00000024")),
                    (os.path.relpath(step, root) + "/", os.path.join(root, "run", "hf-step_00000024"))):
    args_file = os.path.join(root, "args")
    e = dict(os.environ, SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="1", SLURM_NTASKS="1", SLURM_JOB_NODELIST="node1",
             SHARDTRAIN_HOME=SOURCE, SHARDTRAIN_BIN=fake, CHECKPOINT_DIR=given, FAKE_ARGS=args_file)
    e.pop("OUTPUT", None)
    p = subprocess.run(["bash", CONSOLIDATE], cwd=root, env=e, capture_output=True, text=True, timeout=30)
    got = open(args_file).read().splitlines() if os.path.exists(args_file) else []
    check(p.returncode == 0 and got[:4] == ["consolidate", given, "--output", want],
          f"consolidate.sbatch CHECKPOINT_DIR={given}: the output {want}: exit {p.returncode}: {got} {p.stderr}")
shutil.rmtree(root, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all job-script checks passed")
