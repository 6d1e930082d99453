#!/usr/bin/env python3
"""jobs/slurm/lib.sh's decision after a failed run (st_requeue_or_exit -> st_restart_after_failure), case by
case, in seconds and without root: lib.sh is sourced by bash with scontrol and sinfo replaced by scripts that
record each call and answer as Slurm would (the job's Partition and ExcNodeList, a partition's node count;
`scontrol requeue` signals the batch script with SIGTERM, as Slurm does). The run directory holds the
failure records shardtrain writes (failures/rank_N.json), metrics.jsonl, result.json and restarts.log. Every case
checks the exit code, whether the job was requeued, which nodes it leaves out and the line it logs. Also the
ending of a run stopped on a signal: a launcher's failing status (mpirun's 1 after a SIGTERM) with result.json
"preempted" is a preemption; a job being cancelled (JobState COMPLETING) is neither requeued nor restarted; two
starts in a row that train nothing end the job. Bad values of RESTART_ON, MAX_RESTARTS (leading zeros too) and
EXCLUDE_FAILED_NODES end the job at its start, naming the variable. slurm_jobs_test.py runs the main cases on a
real Slurm, job_script_test.py the signals around them."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fake_slurm import SCONTROL as FAKE_SCONTROL, check, failures, write_tools  # noqa: E402
LIB = os.path.join(HERE, "..", "..", "jobs", "slurm", "lib.sh")
FAKE_SINFO = r"""#!/bin/bash
echo "sinfo $*" >> "$FAKE_LOG"
echo "${FAKE_NODES:-4}"
"""


def record(code, step, restartable, suspects, message="m", rank=0):
    return json.dumps({"exit_code": code, "kind": "k", "rank": rank, "node": "node1", "step": step, "restartable": restartable,
                       "suspect_nodes": suspects, "message": message}, separators=(",", ":")) + "\n"


def run(name, exit_code, records=(), metrics_steps=0, restarts_log=None, result=None, logged_nothing=False, checkpoints=(), **env):
    """One decision. Returns (exit code, stderr+stdout, calls to scontrol/sinfo, restarts.log lines).
    logged_nothing: the run st_launch started logged nothing (ST_METRICS_BEFORE is the metrics file's size);
    checkpoints: the complete checkpoints (step_N with DONE) in CHECKPOINT_DIR, a folder of its own."""
    root = tempfile.mkdtemp(prefix=f"restart-{name}-")
    try:
        bin_dir, run_dir = os.path.join(root, "bin"), os.path.join(root, "run")
        os.makedirs(bin_dir)
        os.makedirs(run_dir)
        write_tools(bin_dir, (("scontrol", FAKE_SCONTROL), ("sinfo", FAKE_SINFO)))
        if records:
            os.makedirs(os.path.join(run_dir, "failures"))
            for i, r in enumerate(records):
                open(os.path.join(run_dir, "failures", f"rank_{i:05d}.json"), "w").write(r)
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            for s in range(1, metrics_steps + 1):
                f.write(json.dumps({"kind": "train", "step": s, "loss": 1.0}) + "\n")
            f.write('{"kind":"checkpoint","step":4}\n')
        if restarts_log is not None:
            open(os.path.join(run_dir, "restarts.log"), "w").write("".join(l + "\n" for l in restarts_log))
        if result is not None:  # as shardtrain writes it: one key per line
            open(os.path.join(run_dir, "result.json"), "w").write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        log = os.path.join(root, "calls")
        open(log, "w").close()
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RESTART_ON", "MAX_RESTARTS", "EXCLUDE_FAILED"))}
        e.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=log, SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="1",
                 SLURM_RESTART_COUNT="0")
        if logged_nothing:
            e["ST_METRICS_BEFORE"] = str(os.path.getsize(os.path.join(run_dir, "metrics.jsonl")))
        if checkpoints:
            e["CHECKPOINT_DIR"] = os.path.join(root, "ckpt")
            for c in checkpoints:
                os.makedirs(os.path.join(root, "ckpt", c))
                open(os.path.join(root, "ckpt", c, "DONE"), "w").close()
        e.update({k: v for k, v in env.items() if v is not None})
        script = f'source "{LIB}"; set -uo pipefail; ST_EXIT={exit_code}; st_requeue_or_exit "{run_dir}"'
        p = subprocess.run(["bash", "-c", script], env=e, capture_output=True, text=True, timeout=30)
        out = (p.stdout + p.stderr).replace(run_dir, "RUN")  # the temporary run directory a message names, as RUN
        calls = open(log).read().splitlines()
        path = os.path.join(run_dir, "restarts.log")
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        print(f"{name}: exit {p.returncode}; calls {calls}")
        return p.returncode, out, calls, lines
    finally:
        shutil.rmtree(root, ignore_errors=True)


def requeued(calls):
    return "scontrol requeue 42" in calls


def excluded(calls):
    return [c.split("ExcNodeList=")[1] for c in calls if c.startswith("scontrol update JobId=42 ExcNodeList=")]


# A device error on node1: requeued, node1 left out, one line in restarts.log, the run's exit code.
rc, out, calls, lines = run("device", 7, [record(7, 12, True, ["node1"]), record(7, 12, True, [], rank=1)], metrics_steps=11)
check(rc == 7 and requeued(calls) and excluded(calls) == ["node1"], f"device error: exit {rc}, calls {calls}: {out}")
check(len(lines) == 1 and lines[0].endswith("job=42 restart=0 exit=7 step=12 excluded=node1"), f"device error: restarts.log {lines}")
check("training failed with exit code 7 at step 12 (docs/exit-codes.md); restarting from the last checkpoint: restart 1 of 3 after "
      "a failure, leaving out node(s) node1" in out, f"device error: the log line: {out}")
# The requeue comes before the exclusion (only a pending job's ExcNodeList can change).
check(calls.index("scontrol requeue 42") < next((i for i, c in enumerate(calls) if c.startswith("scontrol update")), -1),
      f"requeue, then update: {calls}")

# Nodes excluded before are kept; two suspects from two records are both added, once each.
rc, out, calls, lines = run("more", 10, [record(10, 5, True, ["node2", "node3"]), record(10, 5, True, ["node3"], rank=1)],
                            FAKE_EXC="node7", FAKE_NODES="8")
check(rc == 10 and excluded(calls) == ["node7,node2,node3"], f"a second exclusion keeps the first: {calls}")

# A partition too small to run the job without the suspect: requeued, nothing excluded, and said why.
rc, out, calls, lines = run("small", 7, [record(7, 12, True, ["node1"])], FAKE_NODES="1")
check(rc == 7 and requeued(calls) and excluded(calls) == [] and "not leaving out node1: partition debug has 1 node(s)" in out
      and lines and lines[0].endswith("excluded=-"), f"too few nodes: {calls}: {out}")

# EXCLUDE_FAILED_NODES=0: requeued where Slurm likes.
rc, out, calls, lines = run("no-exclude", 7, [record(7, 12, True, ["node1"])], EXCLUDE_FAILED_NODES="0")
check(rc == 7 and requeued(calls) and excluded(calls) == [], f"EXCLUDE_FAILED_NODES=0: {calls}")

# Out of memory: the records say a restart would repeat it. Not requeued.
rc, out, calls, lines = run("oom", 7, [record(7, 3, False, [], message="out of GPU memory: 512.0 MiB requested")])
check(rc == 7 and not requeued(calls) and not lines and "not restarting: the ranks report a failure that a restart would repeat: "
      "out of GPU memory" in out, f"out of memory: exit {rc}: {calls}: {out}")

# A rank killed by a signal (no records): a crash, requeued without exclusion, at the step after the last logged.
rc, out, calls, lines = run("crash", 137, metrics_steps=20)
check(rc == 137 and requeued(calls) and excluded(calls) == [] and lines and lines[0].endswith("exit=137 step=21 excluded=-"),
      f"crash: exit {rc}, {calls}, {lines}")

# A restart that died starting up (Open MPI's connection set-up crashed under load), before it logged a step: it
# failed before its first step, the one after its checkpoint (9), not at the earlier run's step 12 the metrics end
# with. After a failure at step 12 that is no progress: it stops, and says so; as a first failure it restarts.
twelve = ["2026-11-25T01:00:00Z job=42 restart=0 exit=135 step=12 excluded=-"]
rc, out, calls, lines = run("died-starting", 139, metrics_steps=11, restarts_log=twelve, logged_nothing=True,
                            checkpoints=("step_00000004", "step_00000008"))
check(rc == 139 and not requeued(calls) and "not restarting: the run failed before its first step, step 9, no further than the "
      "previous failure (step 12)" in out, f"a restart that died starting up: exit {rc}, {calls}: {out}")
rc, out, calls, lines = run("died-starting-first", 139, metrics_steps=11, logged_nothing=True, checkpoints=("step_00000008",))
check(rc == 139 and requeued(calls) and lines and lines[0].endswith("exit=139 step=9 excluded=-")
      and "training failed with exit code 139 before its first step, step 9 (docs/exit-codes.md)" in out,
      f"a first run that died starting up restarts: exit {rc}, {calls}, {lines}: {out}")
rc, out, calls, lines = run("died-starting-fresh", 139, logged_nothing=True)
check(rc == 139 and requeued(calls) and lines and lines[0].endswith("exit=139 step=1 excluded=-"),
      f"no checkpoint, nothing logged: step 1: {calls}, {lines}")

# A crash with a record (a machine check: the rank's signal handler names its node): requeued, the node left out.
rc, out, calls, lines = run("mce", 135, [record(135, 40, True, ["node4"], message="killed by SIGBUS (BUS_MCEERR_AR): ...")])
check(rc == 135 and requeued(calls) and excluded(calls) == ["node4"] and lines and lines[0].endswith("exit=135 step=40 excluded=node4"),
      f"machine check: exit {rc}, {calls}, {lines}")

# RESTART_ON decides which codes restart: "" never, a list without "crash" not after a crash, 3 (config) never by default.
for name, code, env in [("off", 10, dict(RESTART_ON="")), ("no-crash", 137, dict(RESTART_ON="6 7 10")), ("config", 3, {}),
                        ("diverged", 9, {}), ("io", 8, {})]:
    rc, out, calls, lines = run(name, code, [record(code, 4, True, ["node1"])], **env)
    check(rc == code and not requeued(calls) and not lines, f"{name}: exit {rc}, expected {code} and no requeue: {calls}")
# RESTART_ON="8": a save that hung (shardtrain says restartable) restarts; a full disk (not restartable) does not.
rc, out, calls, lines = run("io-hung-save", 8, [record(8, 4, True, [], message="checkpoint: ... (checkpoint.save_timeout): ...")], RESTART_ON="8")
check(rc == 8 and requeued(calls), f"RESTART_ON=8 restarts after a hung save: {calls}")
rc, out, calls, lines = run("io-disk-full", 8, [record(8, 4, False, [], message="no room for a checkpoint")], RESTART_ON="8")
check(rc == 8 and not requeued(calls) and "a restart would repeat: no room for a checkpoint" in out, f"RESTART_ON=8, disk full: {calls}: {out}")

# MAX_RESTARTS: two restarts made, a limit of 2.
# An earlier job of the same run directory (a resubmission by hand) does not count: its restarts nor its step.
prior = ["2026-11-24T01:00:00Z job=41 restart=0 exit=7 step=90 excluded=node9",
         "2026-11-25T01:00:00Z job=42 restart=0 exit=7 step=12 excluded=node1", "2026-11-25T02:00:00Z job=42 restart=1 exit=10 step=30 excluded=-"]
rc, out, calls, lines = run("budget", 7, [record(7, 50, True, ["node2"])], restarts_log=prior, MAX_RESTARTS="2")
check(rc == 7 and not requeued(calls) and "not restarting: job 42 made 2 restart(s) after failures already (MAX_RESTARTS=2)" in out,
      f"MAX_RESTARTS reached: {calls}: {out}")
rc, out, calls, lines = run("budget-left", 7, [record(7, 50, True, ["node2"])], restarts_log=prior)
check(rc == 7 and requeued(calls) and len(lines) == 4 and "restart 3 of 3" in out, f"the third of 3: {calls}: {lines}")
rc, out, calls, lines = run("other-job", 7, [record(7, 50, True, [])], restarts_log=prior[:1], MAX_RESTARTS="1")
check(rc == 7 and requeued(calls) and "restart 1 of 1" in out, f"job 41's restart and its step 90 do not count for job 42: {calls}: {out}")

# No progress: the same step as the previous failure (30) stops; a later one restarts.
rc, out, calls, lines = run("same-step", 10, [record(10, 30, True, [])], restarts_log=prior)
check(rc == 10 and not requeued(calls) and "not restarting: the run failed at step 30, no further than the previous failure (step 30)" in out,
      f"no progress: {calls}: {out}")
rc, out, calls, lines = run("crash-same-step", 137, metrics_steps=29, restarts_log=prior)
check(rc == 137 and not requeued(calls), f"a crash at the step of the previous failure: {calls}")

# A job Slurm will not requeue: the run's exit code and a message saying what to do: which RUN_DIR (a new job
# with the default runs/<name>-<job id> would start over) and CHECKPOINT_DIR when it is elsewhere.
rc, out, calls, lines = run("refused", 7, [record(7, 12, True, ["node1"])], FAKE_REQUEUE_RC="1")
check(rc == 7 and "scontrol requeue 42 was refused (is the job requeueable? #SBATCH --requeue): resubmit with RUN_DIR=RUN to resume "
      "from its last checkpoint" in out and excluded(calls) == [] and not lines,
      f"requeue refused: exit {rc}: {calls}: {out}")
rc, out, calls, lines = run("refused-elsewhere", 7, [record(7, 12, True, [])], FAKE_REQUEUE_RC="1", CHECKPOINT_DIR="/shared/ckpt")
check(rc == 7 and "resubmit with RUN_DIR=RUN CHECKPOINT_DIR=/shared/ckpt to resume from its last checkpoint" in out,
      f"requeue refused, checkpoints elsewhere: exit {rc}: {out}")
# A checkpoint directory with a space and a quote: quoted for a shell, the hint pasted there gives back two words,
# the same directories (unquoted, "CHECKPOINT_DIR=/shared/my" and "ckpt's" were two words and an open quote).
rc, out, calls, lines = run("refused-quoted", 7, [record(7, 12, True, [])], FAKE_REQUEUE_RC="1", CHECKPOINT_DIR="/shared/my ckpt's")
hint = out.partition("resubmit with ")[2].partition(" to resume from")[0]
words = subprocess.run(["bash", "-c", f"printf '%s\\n' {hint}"], capture_output=True, text=True).stdout.splitlines()
check(rc == 7 and hint == "RUN_DIR=RUN CHECKPOINT_DIR='/shared/my ckpt'\\''s'" and words == ["RUN_DIR=RUN", "CHECKPOINT_DIR=/shared/my ckpt's"],
      f"requeue refused, a checkpoint directory to quote: exit {rc}: {hint!r} -> {words}: {out}")
rc, out, calls, lines = run("refused-75", 75, result=dict(status="preempted", exit_code=75, step=16, last_checkpoint="c/step_00000016"),
                            FAKE_REQUEUE_RC="1", CHECKPOINT_DIR="/shared/ckpt")
check(rc == 75 and "scontrol requeue 42 was refused (is the job requeueable? #SBATCH --requeue): resubmit with RUN_DIR=RUN "
      "CHECKPOINT_DIR=/shared/ckpt to continue from step 16" in out and not lines, f"a preemption's requeue refused: exit {rc}: {calls}: {out}")

# Out of memory on one rank, a communication error (restartable) on another: one record a restart would repeat
# is enough not to restart, whichever rank wrote it.
for order in ("oom-last", "oom-first"):
    recs = [record(6, 9, True, [], message="MPI_Allreduce: connection reset", rank=0),
            record(7, 9, False, [], message="out of GPU memory: 2.0 GiB requested", rank=1)]
    rc, out, calls, lines = run(order, 7, recs if order == "oom-last" else recs[::-1])
    check(rc == 7 and not requeued(calls) and not lines and "not restarting: the ranks report a failure that a restart would repeat: "
          "out of GPU memory: 2.0 GiB requested" in out, f"{order}: a restartable record beside an OOM: exit {rc}: {calls}: {out}")

# A job being cancelled (scancel: COMPLETING while the script still runs) is not restarted: scontrol would requeue it.
rc, out, calls, lines = run("cancelled", 7, [record(7, 12, True, ["node1"])], FAKE_STATE="COMPLETING")
check(rc == 7 and not requeued(calls) and not lines and "not restarting: job 42 is being cancelled (JobState=COMPLETING, Reason=None)"
      in out, f"a cancelled job is not restarted: exit {rc}: {calls}: {out}")

# ---- a run stopped on a signal ----------------------------------------------------------------------------------
preempted = dict(status="preempted", exit_code=75, step=6, last_checkpoint="RUN/checkpoints/step_00000006", last_loss=5.1)
# mpirun's 1 after a job-wide SIGTERM, the ranks saved: a preemption, requeued, one line of restarts.log.
rc, out, calls, lines = run("mpirun-sigterm", 1, result=preempted)
check(rc == 75 and requeued(calls) and "the launcher exited with 1, but the ranks stopped on the signal and saved (result.json: preempted, "
      "step 6): counted as 75" in out and "checkpoint saved at step 6" in out and len(lines) == 1
      and lines[0].endswith("job=42 restart=0 exit=75 step=6 excluded=- trained=6"), f"status 1 and preempted: exit {rc}, {calls}, {lines}: {out}")
# ... unless the job is being cancelled (scancel): not requeued, and the log names what continues it.
rc, out, calls, lines = run("mpirun-cancelled", 1, result=preempted, FAKE_STATE="COMPLETING", FAKE_REASON="None")
check(rc == 75 and not requeued(calls) and not lines and "job 42 is being cancelled (JobState=COMPLETING, Reason=None), so it is not "
      "requeued: the run stopped at step 6 and its checkpoint RUN/checkpoints/step_00000006 is saved; to continue it, resubmit with "
      "RUN_DIR=RUN" in out, f"a cancelled job's preemption: exit {rc}, {calls}: {out}")
# Killed at its time limit (COMPLETING too, Reason=TimeLimit) after the ranks saved: requeued, it continues.
rc, out, calls, lines = run("time-limit", 75, result=preempted, FAKE_STATE="COMPLETING", FAKE_REASON="TimeLimit")
check(rc == 75 and requeued(calls) and len(lines) == 1, f"a job killed at its time limit after a save is requeued: exit {rc}, {calls}: {out}")
# A stop before the first step of a resumed run (nothing trained): requeued once, said so; a second one ends the job.
nothing = dict(status="preempted", exit_code=75, step=16, resumed_from="RUN/checkpoints/step_00000016", last_checkpoint="RUN/checkpoints/step_00000016")
rc, out, calls, lines = run("no-step", 75, result=nothing, restarts_log=["2026-11-28T01:00:00Z job=42 restart=0 exit=75 step=16 excluded=- trained=16"])
check(rc == 75 and requeued(calls) and "stopped at step 16 without training a step in this start (nothing new saved); requeueing job 42"
      in out and lines[-1].endswith("exit=75 step=16 excluded=- trained=0"), f"one start without a step: {calls}, {lines}: {out}")
rc, out, calls, lines = run("no-step-twice", 75, result=nothing, restarts_log=["2026-11-28T01:00:00Z job=42 restart=1 exit=75 step=16 excluded=- trained=0"])
check(rc == 75 and not requeued(calls) and len(lines) == 1 and "error: not requeueing job 42 again: this start and the one before it were "
      "stopped before they trained a step (at step 16;" in out, f"two starts without a step: exit {rc}, {calls}, {lines}: {out}")
# Preemptions are not failures: they count neither against MAX_RESTARTS nor as the previous failure's step.
rc, out, calls, lines = run("preemptions-free", 7, [record(7, 12, True, [])], MAX_RESTARTS="1",
                            restarts_log=["2026-11-28T01:00:00Z job=42 restart=0 exit=75 step=20 excluded=- trained=20",
                                          "2026-11-28T02:00:00Z job=42 restart=1 exit=75 step=20 excluded=- trained=0"])
check(rc == 7 and requeued(calls) and "restart 1 of 1 after a failure" in out, f"preemption lines are not failures: {calls}: {out}")
# MAX_RESTARTS compared as a decimal number (10 restarts made, a limit of 10).
rc, out, calls, lines = run("ten", 7, [record(7, 99, True, [])], MAX_RESTARTS="10",
                            restarts_log=[f"2026-11-28T01:00:00Z job=42 restart={i} exit=7 step={i + 1} excluded=-" for i in range(10)])
check(rc == 7 and not requeued(calls) and "made 10 restart(s) after failures already (MAX_RESTARTS=10)" in out, f"MAX_RESTARTS=10: {calls}: {out}")

# The settings are checked when the job starts (st_check_restart_settings): one line naming the variable, exit 3.
for env, message in [(dict(RESTART_ON="6 7 11"), "RESTART_ON=6 7 11: '11' is not an exit code from 1 to 10 or 'crash'"),
                     (dict(RESTART_ON="crash,7"), "'crash,7' is not an exit code"),
                     (dict(MAX_RESTARTS="three"), "MAX_RESTARTS=three: expected a whole number"),
                     # bash reads 010 as octal 8 and 08 not at all ("value too great for base"): refused, not misread
                     (dict(MAX_RESTARTS="08"), "MAX_RESTARTS=08: expected a whole number, without leading zeros"),
                     (dict(MAX_RESTARTS="010"), "MAX_RESTARTS=010: expected a whole number, without leading zeros"),
                     (dict(EXCLUDE_FAILED_NODES="yes"), "EXCLUDE_FAILED_NODES=yes: expected 1")]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RESTART_ON", "MAX_RESTARTS", "EXCLUDE_FAILED"))}
    e.update(env, SLURM_JOB_ID="42")
    p = subprocess.run(["bash", "-c", f'source "{LIB}"; st_check_restart_settings job.sbatch; echo accepted'], env=e,
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 3 and message in p.stderr and "accepted" not in p.stdout, f"{env}: exit {p.returncode}: {p.stderr}")
for env in [{}, dict(RESTART_ON=""), dict(RESTART_ON="6 7 8 10 crash", MAX_RESTARTS="0", EXCLUDE_FAILED_NODES="0")]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RESTART_ON", "MAX_RESTARTS", "EXCLUDE_FAILED"))}
    e.update(env, SLURM_JOB_ID="42")
    p = subprocess.run(["bash", "-c", f'source "{LIB}"; st_check_restart_settings job.sbatch; echo accepted'], env=e,
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and p.stdout.strip() == "accepted", f"{env} is accepted: {p.returncode}: {p.stderr}")

# submit.sh checks them before anything is queued (its preflight; sbatch is never reached).
e = {k: v for k, v in os.environ.items() if not k.startswith(("RESTART_ON", "MAX_RESTARTS", "EXCLUDE_FAILED", "SLURM"))}
e.update(MAX_RESTARTS="-1", CONFIG="configs/tiny-cpu.toml", SHARDTRAIN_HOME=os.path.join(HERE, "..", ".."), SHARDTRAIN_BIN="/bin/true", PATH="/usr/bin:/bin")
p = subprocess.run([os.path.join(HERE, "..", "..", "jobs", "slurm", "submit.sh"), os.path.join(HERE, "..", "..", "jobs", "slurm", "train-single-node.sbatch")],
                   env=e, capture_output=True, text=True, timeout=30)
check(p.returncode == 3 and "MAX_RESTARTS=-1: expected a whole number" in p.stderr, f"submit.sh with MAX_RESTARTS=-1: exit {p.returncode}: {p.stderr}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all restart-policy checks passed")
