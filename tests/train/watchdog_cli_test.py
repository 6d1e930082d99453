#!/usr/bin/env python3
"""The hang watchdog and SHARDTRAIN_FAULT through the binary under mpirun, on a tiny model:
- a run without a fault and a 3 s collective timeout finishes normally (no false alarm);
- stall:1@3 on 2 ranks: rank 0, blocked in a collective, ends the job with exit code 10 within seconds, and
  its message names the collective, axis and step, and rank 1 as the rank that did not arrive;
- stall:2@3 on 4 ranks (HYBRID_SHARD, 2 simulated nodes): the blocked ranks wait on their own axes (no world
  collective opens a step); a message names rank 2 as not arrived and outside any collective, and every other
  message names rank 2 or rank 3 (blocked in its all-gather with rank 2), never a rank that arrived;
- freeze:1@3 (SIGSTOP: the rank's watchdog thread stops too): rank 1 is named as not answering;
- kill:1@3: the job ends promptly with a non-zero exit (mpirun's 137: a rank died of SIGKILL), never a hang;
- faults combine with ';' (nan_grad:2;stall:1@3 skips step 2, then stalls);
- start-up (fsdp.startup_timeout 3): stall:1@start (rank 1 held up as it opens the datasets, a file system that
  stopped answering) ends the job with exit 10, rank 1's line naming that stage, itself and the key; freeze:1@start
  (rank 1 stopped whole) too, rank 0's line naming the collective stage it waits in; a run whose steps last past the
  limit (slow_step) finishes: the watch ends with the start-up; a rank that never starts (mpirun's second program
  is `sleep`, which never reaches MPI_Init) ends the job with exit 10 from rank 0's line naming MPI_Init (before,
  rank 0 waited in MPI_Init until the job's time limit);
- failure records (RUN_DIR/failures/rank_N.json, what a Slurm job reads to restart elsewhere): the ranks run
  as two named nodes (SLURMD_NODENAME per rank); a stalled or frozen rank 1 makes rank 0's record name rank 1's
  node as the suspect; device_error:1@3@nodeB fails on rank 1 with exit 7 and its record names nodeB, while
  device_error:1@3@nodeC (no such node) never fires; the next run in a directory removes the last one's
  records; mce:1@3@nodeB (SIGBUS with BUS_MCEERR_AR, a machine check) kills rank 1 with the signal, and its
  handler's crash record names nodeB; a healthy run, a bad config and a rank killed with SIGKILL leave none.
The runs are independent (each in its own run directory) and mostly wait (for a 3 s timeout, a stalled rank, mpirun's
start): they all start up front, RUNS_AT_ONCE at a time, and the checks below take their results in order."""
import concurrent.futures
import os
import json
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)


def train(name, np=2, fault=None, extra=(), nodes=None, fresh=True, absent=False):
    """nodes: one Slurm node name per rank (SLURMD_NODENAME, set per rank through mpirun's MPMD form). absent: the
    last rank is a program that never starts MPI (sleep)."""
    env = dict(os.environ)
    env.pop("SHARDTRAIN_FAULT", None)
    env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
    env.pop("SLURMD_NODENAME", None)
    if fault:
        env["SHARDTRAIN_FAULT"] = fault
    program = [args.shardtrain, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", ds, "--logging.run_dir", os.path.join(work, name), "--model.vocab_size", "512",
           "--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
           "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--data.seq_len", "64",
           "--data.global_batch_size", "8", "--schedule.max_steps", "12", "--schedule.warmup_steps", "2",
           "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "0", "--logging.progress", "lines",
           "--fsdp.collective_timeout", "3", *extra]
    if nodes:
        cmd = [args.mpiexec, "--oversubscribe"]
        for i, node in enumerate(nodes):
            cmd += ([":"] if i else []) + ["-np", "1", "-x", f"SLURMD_NODENAME={node}", *program]
    elif absent:
        cmd = [args.mpiexec, "--oversubscribe", "-np", str(np - 1), *program, ":", "-np", "1", "sleep", "120"]
    else:
        cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), *program]
    if fresh:
        shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    start = time.time()
    p = subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=240)
    secs = time.time() - start
    print(f"{name}: exit {p.returncode} after {secs:.1f} s", flush=True)
    return p.returncode, p.stderr, secs


# Four runs of 2 ranks at once: about one core's work on this 2-core machine (a run is mostly waits); the time
# checks below (an end within 60 s of the start, none of the 3 s timeouts firing in a healthy run) have room.
RUNS_AT_ONCE = 4
pool = concurrent.futures.ThreadPoolExecutor(max_workers=RUNS_AT_ONCE)


def start(name, **kw):
    """train(name, ...) on the pool: its (rc, stderr, secs) through .result()."""
    return pool.submit(train, name, **kw)


def timeout_lines(err):
    return [l for l in err.splitlines() if "collective timeout:" in l]


def not_arrived(line):
    """The ranks a timeout line names as not arrived: 'ranks that did not arrive: 1 (...), 3 (...); ...'."""
    m = re.search(r"ranks that did not arrive: (.*?)(; ranks that did not answer|; ranks past|; arrived|: ending)", line)
    return sorted(int(r) for r in re.findall(r"(?:^|\), )(\d+) \(", m.group(1))) if m else []


def arrived(line):
    """'arrived: 0-1, 3' -> [0, 1, 3]."""
    m = re.search(r"; arrived: ([\d, -]+): ending the job", line)
    out = []
    for part in (m.group(1).split(", ") if m else []):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


# Every run, started in the order the checks read them. rec-stalled runs twice in one directory: its records are
# read between the two runs (the second must clear them).
two_nodes = ["nodeA", "nodeB"]
BAD_FAULTS = [("kill:1", "expected kill:RANK@STEP, got 'kill:1'"), ("kill:x@3", "not a rank: 'x'"),
              ("device_error:1@3@", "expected a node name after the second '@'"),
              ("device_error:1@x@n1", "not a step number: 'x'"), ("stall:5@3", "names rank 5, but the world has ranks 0-1"),
              ("stall:1@0", "steps count from 1 ('start' for start-up)")]


def records(name):
    """RUN_DIR/failures/rank_N.json by rank; each file must be one line of JSON with every field."""
    d = os.path.join(work, name, "failures")
    out = {}
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        text = open(os.path.join(d, f)).read()
        check(f.endswith(".json") and text.count("\n") == 1, f"{name}: {f} is one line of JSON: {text!r}")
        r = json.loads(text)
        check(set(r) == {"exit_code", "kind", "rank", "node", "step", "restartable", "suspect_nodes", "message"}, f"{name}: fields {sorted(r)}")
        out[r["rank"]] = r
    return out


def stalled_then_cleared():
    first = train("rec-stalled", fault="stall:1@3", nodes=two_nodes)
    recs = records("rec-stalled")
    return first, recs, train("rec-stalled", nodes=two_nodes, fresh=False)


runs = {
    "healthy": start("healthy"),
    "stalled": start("stalled", fault="stall:1@3"),
    "stalled4": start("stalled4", np=4, fault="stall:2@3", extra=("--ranks-per-node", "2", "--fsdp.strategy", "HYBRID_SHARD")),
    "frozen": start("frozen", fault="freeze:1@3"),
    "killed": start("killed", fault="kill:1@3"),
    "combined": start("combined", fault="nan_grad:2;stall:1@3"),
    "start-stalled": start("start-stalled", fault="stall:1@start", extra=("--fsdp.startup_timeout", "3")),
    "start-frozen": start("start-frozen", fault="freeze:1@start", extra=("--fsdp.startup_timeout", "3")),
    "start-absent": start("start-absent", absent=True, extra=("--fsdp.startup_timeout", "3")),
    "start-disarmed": start("start-disarmed", fault="slow_step:400",
                            extra=("--fsdp.startup_timeout", "3", "--logging.peak_flops", "1e12")),
    **{f"bad-{i}": start(f"bad-{i}", fault=fault) for i, (fault, _) in enumerate(BAD_FAULTS)},
    "rec-healthy": start("rec-healthy", nodes=two_nodes),
    "rec-stalled": pool.submit(stalled_then_cleared),
    "rec-frozen": start("rec-frozen", fault="freeze:1@3", nodes=two_nodes),
    "rec-device": start("rec-device", fault="device_error:1@3@nodeB", nodes=two_nodes),
    "rec-other-node": start("rec-other-node", fault="device_error:1@3@nodeC", nodes=two_nodes),
    "rec-mce": start("rec-mce", fault="mce:1@3@nodeB", nodes=two_nodes),
    "rec-killed": start("rec-killed", fault="kill:1@3"),
    "rec-bad-config": start("rec-bad-config", extra=("--optim.lr", "-1")),
}

rc, err, secs = runs["healthy"].result()
check(rc == 0, f"a healthy run with a 3 s timeout: exit {rc}: {err[-1500:]}")
check(not timeout_lines(err), f"a healthy run must never fire: {timeout_lines(err)}")

# 2 ranks, rank 1 stalls before step 3 (its watchdog thread still answers).
rc, err, secs = runs["stalled"].result()
lines = timeout_lines(err)
check(rc == 10, f"stalled rank: exit code {rc}, expected 10: {err[-1500:]}")
check(len(lines) == 1, f"one timeout line (only rank 0 is blocked): {lines}")
line = lines[0] if lines else ""
# Step 3's first collective is its forward's first all-gather (its token counts travelled in step 2's all-reduce).
check("all_gather of" in line and "on the shard axis" in line and "during step 3" in line and "on rank 0" in line,
      f"the message names collective, axis, step and rank: {line}")
check("ranks that did not arrive: 1 (at step 3, not in a collective; 1 collective behind)" in line,
      f"the message names rank 1 as not arrived, at step 3 and outside any collective: {line}")
check(not_arrived(line) == [1] and arrived(line) == [0], f"not arrived {not_arrived(line)}, arrived {arrived(line)}: {line}")
check(secs < 60, f"the job ended {secs:.0f} s after start; the watchdog should end it within seconds of the 3 s timeout")

# 4 ranks as 2 simulated nodes (HYBRID_SHARD 2 x 2); rank 2 stalls before step 3. No world collective opens a
# step (step 3's counts travelled in step 2's all-reduce), so the others block on their own axes: rank 3 in
# step 3's first all-gather with rank 2 (shard axis), ranks 0 and 1 in the gradient all-reduce across the
# nodes (replicate axis), with rank 2 and rank 3. Ranks 0, 1 and 3 all fire; the first abort ends the job, so
# one to three lines arrive. Each names one rank as not arrived: rank 2, outside any collective (the stalled
# one), or rank 3, itself blocked in a collective (the chain leads on to rank 2); none names an arrived rank
# other than its own.
rc, err, secs = runs["stalled4"].result()
lines = timeout_lines(err)
check(rc == 10, f"4 ranks, rank 2 stalled: exit code {rc}, expected 10: {err[-1500:]}")
check(1 <= len(lines) <= 3, f"one timeout line per blocked rank at most: {lines}")
for line in lines:
    m = re.search(r"on rank ([013]),", line)
    check(m is not None, f"a blocked rank (not 2) fired: {line}")
    check(not_arrived(line) in ([2], [3]), f"rank 2 or rank 3 named as not arrived: {not_arrived(line)}: {line}")
    if not_arrived(line) == [2]:
        check("2 (at step 3, not in a collective" in line, f"rank 2 named as stalled outside any collective: {line}")
    else:
        check("3 (at step 3, in all_gather on the shard axis" in line, f"rank 3 named as blocked in its all-gather: {line}")
    check(m is None or arrived(line) == [int(m.group(1))], f"only the firing rank arrived in its 2-rank group: {arrived(line)}: {line}")
    check("did not answer" not in line, f"every rank answered: {line}")
# Which of the blocked ranks fires first is a race between their watchdog threads (rank 3 blocks first, by the
# length of a forward and backward on ranks 0 and 1): the lines above hold for any of them, so no line is required.
check(secs < 60, f"4 ranks: the job ended {secs:.0f} s after start")

# A frozen rank (SIGSTOP, every thread) cannot answer: it is named as such.
rc, err, secs = runs["frozen"].result()
lines = timeout_lines(err)
check(rc == 10, f"frozen rank: exit code {rc}, expected 10: {err[-1500:]}")
check(len(lines) == 1 and "ranks that did not answer (dead, stopped, or not making MPI progress): 1;" in lines[0],
      f"the message names rank 1 as not answering: {lines}")
check(secs < 60, f"frozen rank: the job ended {secs:.0f} s after start")

# A rank that dies ends the job promptly: mpirun notices the SIGKILL and aborts the others.
rc, err, secs = runs["killed"].result()
open_mpi = "Open MPI" in subprocess.run([args.mpiexec, "--version"], capture_output=True, text=True).stdout
check(rc == 137 if open_mpi else rc not in (0, 10),
      f"killed rank: mpirun's exit code {rc}, expected non-zero (Open MPI: 137 = 128 + SIGKILL): {err[-1500:]}")
check("rank 1 kills itself (SIGKILL) before step 3" in err, f"the fault is logged: {err[-1500:]}")
check(not timeout_lines(err), f"the job ends before any watchdog fires: {timeout_lines(err)}")
check(secs < 60, f"killed rank: the job ended {secs:.0f} s after start, expected well under 60 s")

# Faults combine: a skipped step 2 (NaN gradient), then rank 1 stalls before step 3.
rc, err, secs = runs["combined"].result()
check(rc == 10 and "step 2 skipped" in err and "ranks that did not arrive: 1 (at step 3" in err,
      f"nan_grad:2;stall:1@3: exit {rc}: {err[-1500:]}")

# Start-up: no collective watchdog yet (it comes with the communicators); each stage is timed on every rank.
def startup_lines(err):
    return [l for l in err.splitlines() if "collective timeout: start-up: " in l]


rc, err, secs = runs["start-stalled"].result()
lines = startup_lines(err)
check(rc == 10 and "rank 1 stops answering during start-up" in err, f"stall:1@start: exit {rc}, expected 10: {err[-1500:]}")
check(any("start-up: opening the datasets has not finished after 3 s (fsdp.startup_timeout) on rank 1 (" in l for l in lines),
      f"rank 1, held up opening the datasets, says so: {lines}")
check(secs < 60, f"stall:1@start: the job ended {secs:.0f} s after start")
# The stage fires before the trainer enables the records (it opens the datasets first): its record is there all the
# same, for the job scripts' restart decision (it left none).
recs = records("start-stalled")
check(1 in recs and recs[1]["exit_code"] == 10 and "opening the datasets has not finished" in recs[1]["message"],
      f"stall:1@start leaves rank 1's record: {recs}")
rc, err, secs = runs["start-frozen"].result()
lines = startup_lines(err)
check(rc == 10, f"freeze:1@start: exit {rc}, expected 10: {err[-1500:]}")
# Rank 0 passes the claim's broadcast (its root; Open MPI sends a small one eagerly) and waits in the trainer's
# agreement on the configuration; where the broadcast blocks, in the claim.
check(any(re.search(r"start-up: (the ranks' agreement on the configuration|claiming the checkpoint directory) has not "
                    r"finished after 3 s \(fsdp.startup_timeout\) on rank 0 \(", l) for l in lines),
      f"rank 0, waiting for the stopped rank in a collective stage, says so: {lines}")
check(secs < 60, f"freeze:1@start: the job ended {secs:.0f} s after start")
rc, err, secs = runs["start-absent"].result()
lines = startup_lines(err)
check(rc == 10, f"a rank that never starts: exit {rc}, expected 10: {err[-1500:]}")
check(len(lines) == 1 and "start-up: MPI_Init (every rank of the job starts and reaches it) has not finished after 3 s "
      "(fsdp.startup_timeout) on rank 0 (" in lines[0], f"rank 0, waiting in MPI_Init, says so once: {lines}")
check(secs < 60, f"a rank that never starts: the job ended {secs:.0f} s after start")
rc, err, secs = runs["start-disarmed"].result()
check(rc == 0 and not startup_lines(err) and "loss" in err and secs > 4,
      f"12 steps of 400 ms past a 3 s start-up limit: exit {rc} after {secs:.1f} s: {startup_lines(err)} {err[-800:]}")

# A bad fault specification or a rank outside the world: a usage error (exit 2) naming the variable.
for i, (fault, message) in enumerate(BAD_FAULTS):
    rc, err, secs = runs[f"bad-{i}"].result()
    check(rc == 2 and message in err and "SHARDTRAIN_FAULT" in err, f"SHARDTRAIN_FAULT={fault}: exit {rc}: {err[-800:]}")


# ---- failure records ---------------------------------------------------------------------------------------
rc, err, _ = runs["rec-healthy"].result()
check(rc == 0 and not os.path.exists(os.path.join(work, "rec-healthy", "failures")), f"a healthy run leaves no failure record: {rc}")

(rc, err, _), recs, cleared = runs["rec-stalled"].result()
check(rc == 10 and sorted(recs) == [0], f"stalled rank 1: exit {rc}, records of ranks {sorted(recs)} (rank 0's expected)")
r = recs.get(0, {})
check(r.get("exit_code") == 10 and r.get("kind") == "collective timeout" and r.get("node") == "nodeA" and r.get("step") == 3
      and r.get("restartable") is True and r.get("suspect_nodes") == ["nodeB"] and "ranks that did not arrive: 1" in r.get("message", ""),
      f"rank 0's record names rank 1's node: {r}")

# The next run in the same directory starts without the last one's records.
rc, err, _ = cleared
check(rc == 0 and not os.path.exists(os.path.join(work, "rec-stalled", "failures")), f"a new run clears the old records: exit {rc}")

rc, err, _ = runs["rec-frozen"].result()
r = records("rec-frozen").get(0, {})
check(rc == 10 and r.get("suspect_nodes") == ["nodeB"] and "did not answer" in r.get("message", ""),
      f"a frozen rank 1 (not answering) is a suspect too: exit {rc}: {r}")

rc, err, _ = runs["rec-device"].result()
recs = records("rec-device")
r = recs.get(1, {})
check(rc == 7 and "an injected device error on rank 1 (node nodeB) before step 3" in err, f"device_error:1@3@nodeB: exit {rc}: {err[-1500:]}")
check(r.get("exit_code") == 7 and r.get("kind") == "device error" and r.get("node") == "nodeB" and r.get("step") == 3
      and r.get("restartable") is True and r.get("suspect_nodes") == ["nodeB"], f"rank 1's record names its own node: {recs}")

rc, err, _ = runs["rec-other-node"].result()
check(rc == 0 and not records("rec-other-node"), f"a fault for another node does not fire: exit {rc}: {err[-800:]}")

# A machine check (SIGBUS, BUS_MCEERR_AR, as the kernel sends it) on rank 1: the rank dies of the signal (mpirun: 135),
# and its signal handler leaves a crash record naming its own node before it does.
rc, err, _ = runs["rec-mce"].result()
r = records("rec-mce").get(1, {})
check(rc == 135 and r.get("exit_code") == 135 and r.get("kind") == "crash" and r.get("node") == "nodeB" and r.get("step") == 3
      and r.get("restartable") is True and r.get("suspect_nodes") == ["nodeB"]
      and r.get("message") == "killed by SIGBUS (BUS_MCEERR_AR): the kernel found an uncorrectable memory error (machine check) "
                              "in memory this rank used during step 3", f"machine check on rank 1: exit {rc}: {r}: {err[-1200:]}")

rc, err, _ = runs["rec-killed"].result()
check(rc != 0 and not records("rec-killed"), f"a rank killed outright leaves no record (the job script counts it as a crash): {rc}")
rc, err, _ = runs["rec-bad-config"].result()
check(rc == 3 and not records("rec-bad-config"), f"an error before training (a bad config) leaves no record: exit {rc}")

check.finish("all watchdog checks passed")
