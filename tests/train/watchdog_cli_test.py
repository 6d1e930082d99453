#!/usr/bin/env python3
"""The hang watchdog and SHARDTRAIN_FAULT through the binary under mpirun, on a tiny model:
- a run without a fault and a 3 s collective timeout finishes normally (no false alarm);
- stall:1@3 on 2 ranks: rank 0, blocked in a collective, ends the job with exit code 10 within seconds, and
  its message names the collective, axis and step, and rank 1 as the rank that did not arrive;
- stall:2@3 on 4 ranks (HYBRID_SHARD, 2 simulated nodes): every message names rank 2, and only rank 2, as
  not arrived, and the other three as arrived;
- freeze:1@3 (SIGSTOP: the rank's watchdog thread stops too): rank 1 is named as not answering;
- kill:1@3: the job ends promptly with a non-zero exit (mpirun's 137: a rank died of SIGKILL), never a hang;
- faults combine with ';' (nan_grad:2;stall:1@3 skips step 2, then stalls)."""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)


def train(name, np=2, fault=None, extra=()):
    env = dict(os.environ)
    env.pop("SHARDTRAIN_FAULT", None)
    env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
    if fault:
        env["SHARDTRAIN_FAULT"] = fault
    cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), args.shardtrain, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", ds, "--logging.run_dir", os.path.join(work, name), "--model.vocab_size", "512",
           "--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
           "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--data.seq_len", "64",
           "--data.global_batch_size", "8", "--schedule.max_steps", "12", "--schedule.warmup_steps", "2",
           "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "0", "--logging.progress", "lines",
           "--fsdp.collective_timeout", "3", *extra]
    start = time.time()
    p = subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=240)
    secs = time.time() - start
    print(f"{name}: exit {p.returncode} after {secs:.1f} s")
    return p.returncode, p.stderr, secs


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


rc, err, secs = train("healthy")
check(rc == 0, f"a healthy run with a 3 s timeout: exit {rc}: {err[-1500:]}")
check(not timeout_lines(err), f"a healthy run must never fire: {timeout_lines(err)}")

# 2 ranks, rank 1 stalls before step 3 (its watchdog thread still answers).
rc, err, secs = train("stalled", fault="stall:1@3")
lines = timeout_lines(err)
check(rc == 10, f"stalled rank: exit code {rc}, expected 10: {err[-1500:]}")
check(len(lines) == 1, f"one timeout line (only rank 0 is blocked): {lines}")
line = lines[0] if lines else ""
check("on the world axis" in line and "during step 3" in line and "on rank 0" in line,
      f"the message names collective, axis, step and rank: {line}")
check("ranks that did not arrive: 1 (at step 3, not in a collective; 1 collective behind)" in line,
      f"the message names rank 1 as not arrived, at step 3 and outside any collective: {line}")
check(not_arrived(line) == [1] and arrived(line) == [0], f"not arrived {not_arrived(line)}, arrived {arrived(line)}: {line}")
check(secs < 60, f"the job ended {secs:.0f} s after start; the watchdog should end it within seconds of the 3 s timeout")

# 4 ranks as 2 simulated nodes (HYBRID_SHARD 2 x 2); rank 2 stalls. Ranks 0, 1 and 3 all fire; the first
# abort ends the job, so one to three lines arrive, each naming rank 2 alone as not arrived.
rc, err, secs = train("stalled4", np=4, fault="stall:2@3",
                      extra=("--ranks-per-node", "2", "--fsdp.strategy", "HYBRID_SHARD"))
lines = timeout_lines(err)
check(rc == 10, f"4 ranks, rank 2 stalled: exit code {rc}, expected 10: {err[-1500:]}")
check(1 <= len(lines) <= 3, f"one timeout line per blocked rank at most: {lines}")
for line in lines:
    check(not_arrived(line) == [2], f"only rank 2 named as not arrived: {not_arrived(line)}: {line}")
    check(arrived(line) == [0, 1, 3], f"ranks 0, 1 and 3 arrived: {arrived(line)}: {line}")
    check("did not answer" not in line, f"every rank answered: {line}")
    check(re.search(r"on rank [013],", line) is not None, f"a blocked rank (not 2) fired: {line}")
check(secs < 60, f"4 ranks: the job ended {secs:.0f} s after start")

# A frozen rank (SIGSTOP, every thread) cannot answer: it is named as such.
rc, err, secs = train("frozen", fault="freeze:1@3")
lines = timeout_lines(err)
check(rc == 10, f"frozen rank: exit code {rc}, expected 10: {err[-1500:]}")
check(len(lines) == 1 and "ranks that did not answer (dead, or not making MPI progress): 1;" in lines[0],
      f"the message names rank 1 as not answering: {lines}")
check(secs < 60, f"frozen rank: the job ended {secs:.0f} s after start")

# A rank that dies ends the job promptly: mpirun notices the SIGKILL and aborts the others.
rc, err, secs = train("killed", fault="kill:1@3")
open_mpi = "Open MPI" in subprocess.run([args.mpiexec, "--version"], capture_output=True, text=True).stdout
check(rc == 137 if open_mpi else rc not in (0, 10),
      f"killed rank: mpirun's exit code {rc}, expected non-zero (Open MPI: 137 = 128 + SIGKILL): {err[-1500:]}")
check("rank 1 kills itself (SIGKILL) before step 3" in err, f"the fault is logged: {err[-1500:]}")
check(not timeout_lines(err), f"the job ends before any watchdog fires: {timeout_lines(err)}")
check(secs < 60, f"killed rank: the job ended {secs:.0f} s after start, expected well under 60 s")

# Faults combine: a skipped step 2 (NaN gradient), then rank 1 stalls before step 3.
rc, err, secs = train("combined", fault="nan_grad:2;stall:1@3")
check(rc == 10 and "step 2 skipped" in err and "ranks that did not arrive: 1 (at step 3" in err,
      f"nan_grad:2;stall:1@3: exit {rc}: {err[-1500:]}")

# A bad fault specification or a rank outside the world: a usage error (exit 2) naming the variable.
for fault, message in [("kill:1", "expected kill:RANK@STEP, got 'kill:1'"), ("kill:x@3", "not a rank: 'x'"),
                       ("stall:5@3", "names rank 5, but the world has ranks 0-1")]:
    rc, err, secs = train("bad", fault=fault)
    check(rc == 2 and message in err and "SHARDTRAIN_FAULT" in err, f"SHARDTRAIN_FAULT={fault}: exit {rc}: {err[-800:]}")
check.finish("all watchdog checks passed")
