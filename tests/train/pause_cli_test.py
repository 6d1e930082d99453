#!/usr/bin/env python3
"""A job stopped and continued (Ctrl-Z, SIGSTOP then SIGCONT, a paused machine) goes on: the watchdogs do not count the
time it was stopped (audit R2: it ended with exit 10 blaming the network, or exit 8 blaming the file system).
- 2 ranks, fsdp.collective_timeout 3: rank 1 is stopped, then rank 0 a second later (by then blocked in a collective
  waiting for rank 1), both for longer than the timeout, then both continued: the run finishes with exit 0 and the
  losses of an uninterrupted run, and each rank says once how long it was stopped (before, rank 0 fired at once);
- the same, rank 1 left stopped: rank 0, never stopped beyond its own pause, times its wait for rank 1 and ends the
  job (exit 10), its line and failure record saying that it was stopped itself and for how long, not counted, and
  naming rank 1 as not answering;
- one process, checkpoint.save_timeout 5, the step-4 save's writes slowed to 2 s (SHARDTRAIN_CHECKPOINT_FAULT): stopped
  for 7 s during that save, synchronous or asynchronous, the run finishes with exit 0 and the step-4 checkpoint
  complete (before: exit 8, the save discarded).
No check rests on this machine's speed beyond the 3 s collective timeout a healthy run of this size keeps
(train_watchdog_test's too): the stops are longer than the timeouts, and before the fix every one of them fired."""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)
TINY = ["--config", "configs/tiny-cpu.toml", "--data.path", ds, "--model.vocab_size", "512", "--model.hidden_size", "64",
        "--model.intermediate_size", "128", "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4",
        "--model.num_key_value_heads", "2", "--data.seq_len", "64", "--data.global_batch_size", "8",
        "--schedule.warmup_steps", "2", "--schedule.eval_every", "0", "--logging.progress", "lines"]


def start(name, np, extra=(), env_extra=None):
    """The run in WORK/NAME, its stderr in WORK/NAME.err; the Popen."""
    env = dict(os.environ)
    for k in ("SHARDTRAIN_FAULT", "SHARDTRAIN_CHECKPOINT_FAULT", "SHARDTRAIN_RANKS_PER_NODE"):
        env.pop(k, None)
    env.update(env_extra or {})
    cmd = [args.shardtrain, "train", *TINY, "--logging.run_dir", os.path.join(work, name), *extra]
    if np:
        cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), *cmd]
    err = open(os.path.join(work, name + ".err"), "w")
    return subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.DEVNULL, stderr=err)


def stderr_of(name):
    return open(os.path.join(work, name + ".err"), errors="replace").read()


def wait_until(cond, what, limit=120):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > limit:
            raise SystemExit(f"FAIL: {what} not seen within {limit} s")
        time.sleep(0.02)


def ranks(name):
    """{world rank: pid} of the run's processes (the binary's, their run directory on the command line)."""
    run_dir = os.path.join(work, name)
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if os.path.basename(argv[0]) != b"shardtrain" or run_dir.encode() not in argv:
                continue
            env = dict(kv.split(b"=", 1) for kv in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in kv)
            out[int(env.get(b"OMPI_COMM_WORLD_RANK", b"0"))] = int(pid)
        except (OSError, ValueError):
            pass
    return out


def train_steps(name):
    path = os.path.join(work, name, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    out = {}
    for line in open(path):
        try:
            m = json.loads(line)
        except ValueError:
            continue  # a line being written
        if m.get("kind") == "train":
            out[m["step"]] = m["loss"]
    return out


def stopped_lines(err, rank):
    """The seconds each of `rank`'s 'the process was stopped for N s' warnings names."""
    return [float(m.group(1)) for m in re.finditer(rf"\[r{rank}@[^\]]*\] the process was stopped for ([\d.]+) s", err)]


# slow_step: every rank sleeps 200 ms before each step (not in a collective; the losses are unchanged), so that the
# run is still going when the test stops it.
COLL = ["--schedule.max_steps", "16", "--checkpoint.every_n_steps", "0", "--fsdp.collective_timeout", "3"]
SLOW = {"SHARDTRAIN_FAULT": "slow_step:200"}

whole = start("whole", 2, COLL)
rc = whole.wait(timeout=240)
check(rc == 0, f"the uninterrupted run: exit {rc}: {stderr_of('whole')[-1500:]}")


def stop_both(name):
    """Stops rank 1 once the run reached step 3, and rank 0 a second later, blocked by then in a collective that waits
    for rank 1. The pids by rank."""
    wait_until(lambda: max(train_steps(name), default=0) >= 3, f"{name}: step 3")
    pids = ranks(name)
    check(sorted(pids) == [0, 1], f"{name}: the ranks' pids: {pids}")
    os.kill(pids[1], signal.SIGSTOP)
    time.sleep(1)
    os.kill(pids[0], signal.SIGSTOP)
    return pids


p = start("paused", 2, COLL, SLOW)
pids = stop_both("paused")
time.sleep(5)
os.kill(pids[0], signal.SIGCONT)
os.kill(pids[1], signal.SIGCONT)
rc = p.wait(timeout=240)
err = stderr_of("paused")
check(rc == 0 and "collective timeout" not in err, f"stopped for 5 s and 6 s, then continued: exit {rc}: {err[-2000:]}")
check(train_steps("paused") == train_steps("whole") and len(train_steps("whole")) == 16,
      f"the losses are the uninterrupted run's: {train_steps('paused')} vs {train_steps('whole')}")
for rank, least in ((0, 4.0), (1, 5.0)):  # stopped 5 s and 6 s; the detector counts from one wake period after the stop
    s = stopped_lines(err, rank)
    check(len(s) == 1 and s[0] >= least, f"rank {rank} says once that it was stopped, at least {least} s: {s}: {err[-2000:]}")

p = start("left-stopped", 2, COLL, SLOW)
pids = stop_both("left-stopped")
time.sleep(4)
os.kill(pids[0], signal.SIGCONT)
wait_until(lambda: "collective timeout" in stderr_of("left-stopped") or p.poll() is not None, "left-stopped: the timeout")
os.kill(pids[1], signal.SIGCONT)  # for the abort to end it
rc = p.wait(timeout=120)
err = stderr_of("left-stopped")
lines = [l for l in err.splitlines() if "collective timeout:" in l]
check(rc == 10 and len(lines) == 1 and lines[0].startswith("[r0@"), f"rank 1 left stopped: exit {rc}: {err[-2000:]}")
line = lines[0] if lines else ""
m = re.search(r"not counting ([\d.]+) s this process was stopped \(Ctrl-Z, SIGSTOP or a paused machine\)", line)
check(m is not None and float(m.group(1)) >= 3.0, f"rank 0 says how long it was stopped itself: {line}")
check("ranks that did not answer (dead, stopped, or not making MPI progress): 1;" in line, f"rank 1 named: {line}")
rec_path = os.path.join(work, "left-stopped", "failures", "rank_00000.json")
rec = json.loads(open(rec_path).read()) if os.path.exists(rec_path) else {}
check(rec.get("exit_code") == 10 and "not counting" in rec.get("message", ""), f"rank 0's failure record: {rec}")

# One process, a save stopped part-way.
SAVE = ["--schedule.max_steps", "8", "--checkpoint.every_n_steps", "4", "--checkpoint.save_timeout", "5"]
for mode in ("false", "true"):
    name = f"save-{mode}"
    p = start(name, 0, [*SAVE, "--checkpoint.async_save", mode],
              {"SHARDTRAIN_CHECKPOINT_FAULT": "slow_write:2@4"})
    ckpts = os.path.join(work, name, "checkpoints")
    wait_until(lambda: any(f.startswith("step_00000004.tmp") for f in (os.listdir(ckpts) if os.path.isdir(ckpts) else [])),
               f"{name}: the step-4 save")
    p.send_signal(signal.SIGSTOP)
    time.sleep(7)
    p.send_signal(signal.SIGCONT)
    rc = p.wait(timeout=120)
    err = stderr_of(name)
    check(rc == 0 and os.path.exists(os.path.join(ckpts, "step_00000004", "DONE")),
          f"{name}: stopped 7 s in a save slowed to 2 s, save_timeout 5: exit {rc}, {os.listdir(ckpts)}: {err[-2000:]}")
    check(re.search(r"the process was stopped for [\d.]+ s \(Ctrl-Z, SIGSTOP or a paused machine\) during the "
                    r"(asynchronous )?save of step 4: that time is not counted against checkpoint.save_timeout", err),
          f"{name}: the pause is said: {err[-2000:]}")

check.finish("all pause checks passed")
