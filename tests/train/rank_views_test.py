#!/usr/bin/env python3
"""Ranks that see different files where each looks for itself (a checkpoint directory or a tokenizer on node-local
disks, a listing taken while a save publishes) must take the same path: rank 0 looks, or the ranks agree, and a
difference that cannot be run on is one clear error at once (docs/cluster.md, "Ranks that disagree").
Each case starts two ranks as two application contexts of one mpirun, in two working directories (two "nodes"),
with relative paths that name other files on each:
- train with checkpoint.dir on node-local disks: exit 5 at start naming rank 1 and the lock file it cannot see (or
  sees another run's), nothing trained. Before, every save failed (rank 1 never saw the save's temporary directory),
  and the run trained to its end and exited 8 with no checkpoint. The cases below link rank 1's lock file to rank 0's,
  so that the directory passes that check and the ranks still see different checkpoints in it;
- train --resume auto, checkpoints only on rank 0's side: exit 5 naming rank 1. Before, rank 1 started from scratch
  while rank 0 resumed, their host all-reduces crossed (rank 1 read rank 0's error flag as a SIGTERM and exited 75),
  and rank 0 waited in MPI_Allreduce for ever (no watchdog covers it);
- a rollback to a checkpoint only rank 0 sees: exit 5 naming rank 1 (before: rank 0 rolled back, rank 1 stopped
  with "no checkpoint to roll back to", exit 9);
- evaluate --every-checkpoint with one checkpoint fewer on rank 1: exit 5 (before: rank 1 finished after one, rank 0
  waited in MPI_Comm_split_type for ever);
- evaluate where only rank 0 can read the dataset's tokenizer: exit 0, no bits per byte, one warning (before: rank 0
  waited in an all-reduce rank 1 skipped, until the collective watchdog ended the job, exit 10);
- train with a dataset on rank 0's node only: one error naming rank 1, exit 4 (before: a line from each rank
  without it, not saying that rank 0 had opened it);
- the same directories on both ranks: resumes and evaluates.
Every case must end within 60 s; a hang is killed there and fails the test."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = os.path.abspath(args.shardtrain)
moby = os.path.abspath(clitest.corpus(args, "moby-dick"))
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby-bpe512", 0.05)
config = os.path.abspath(os.path.join(args.source, "configs", "tiny-cpu.toml"))
node_a, node_b = os.path.join(work, "node_a"), os.path.join(work, "node_b")
LIMIT = 60

BASE = ["--model.vocab_size", "600", "--model.hidden_size", "64", "--model.num_hidden_layers", "2",
        "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--model.intermediate_size", "128",
        "--data.seq_len", "64", "--data.global_batch_size", "8", "--data.path", ds, "--schedule.warmup_steps", "2",
        "--schedule.eval_every", "0", "--logging.progress", "lines", "--logging.peak_flops", "1e10",
        "--fsdp.collective_timeout", "20"]


def two_ranks(a, b, wdirs=(node_a, node_b), env=None):
    """mpirun -np 1 -wdir A CMD : -np 1 -wdir B CMD; (exit code, output, seconds). A run past LIMIT is killed with
    its ranks (exit code None)."""
    cmd = [args.mpiexec, "--oversubscribe"]
    for i, (extra, wdir) in enumerate(zip((a, b), wdirs)):
        cmd += ([":"] if i else []) + ["-np", "1", "-wdir", wdir, st] + extra
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=args.source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", env=dict(os.environ, **(env or {})), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=LIMIT)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        code = None
        # The ranks of a killed mpirun may outlive it: end the ones started here.
        for line in subprocess.run(["pgrep", "-f", st], capture_output=True, text=True).stdout.split():
            try:
                if os.readlink(f"/proc/{line}/cwd") in (node_a, node_b):
                    os.kill(int(line), signal.SIGKILL)
            except OSError:
                pass
    return code, out, time.time() - t0


def train(run_dir, *extra):
    return ["train", "--config", config, *BASE, "--checkpoint.dir", "ckpt", "--logging.run_dir", run_dir, *extra]


def fresh_nodes():
    for d in (node_a, node_b):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)


# checkpoint.dir on node-local disks: refused at the claim, before anything is trained.
fresh_nodes()
fresh = train(os.path.join(work, "local"), "--schedule.max_steps", "4", "--checkpoint.every_n_steps", "2")
code, out, secs = two_ranks(fresh, fresh)
check(code == 5 and "checkpoint error: rank 1: checkpoint.dir ckpt: this rank (on " in out
      and "does not see the directory rank 0 claimed: its lock file ckpt/.shardtrain.lock is missing there" in out
      and "not a node-local disk" in out, f"checkpoint.dir on node-local disks: exit {code} after {secs:.0f} s: {out[-2000:]}")
check(not os.path.exists(os.path.join(work, "local", "metrics.jsonl")) and "step 1/" not in out, "nothing was trained")
os.makedirs(os.path.join(node_b, "ckpt"))
with open(os.path.join(node_b, "ckpt", ".shardtrain.lock"), "w") as f:
    f.write("host elsewhere, pid 7, since 2026-11-01 10:00:00, run directory /old\n")
code, out, secs = two_ranks(fresh, fresh)
check(code == 5 and "its lock file ckpt/.shardtrain.lock is another run's (host elsewhere, pid 7" in out,
      f"an old lock file on rank 1's disk: exit {code}: {out[-2000:]}")


def share_lock():
    """Rank 1's ckpt/.shardtrain.lock is rank 0's (a link): the claim's check passes, the checkpoints still differ."""
    os.makedirs(os.path.join(node_a, "ckpt"), exist_ok=True)
    os.makedirs(os.path.join(node_b, "ckpt"), exist_ok=True)
    open(os.path.join(node_a, "ckpt", ".shardtrain.lock"), "a").close()
    os.symlink(os.path.join(node_a, "ckpt", ".shardtrain.lock"), os.path.join(node_b, "ckpt", ".shardtrain.lock"))


# Checkpoints of a 4-step run on rank 0's node only ("ckpt" is node_a/ckpt there, node_b/ckpt on rank 1).
fresh_nodes()
first = train(os.path.join(work, "run"), "--schedule.max_steps", "4", "--checkpoint.every_n_steps", "2")
code, out, secs = two_ranks(first, first, wdirs=(node_a, node_a))
check(code == 0 and os.path.isfile(os.path.join(node_a, "ckpt", "step_00000004", "DONE")),
      f"the first run: exit {code}: {out[-2000:]}")

resume = train(os.path.join(work, "run"), "--schedule.max_steps", "8", "--checkpoint.every_n_steps", "2", "--resume", "auto")
share_lock()
code, out, secs = two_ranks(resume, resume)
check(code == 5 and "checkpoint error: resume: ckpt/step_00000004 is complete on rank 0, but rank 1 (on " in out
      and "sees it missing or without its DONE marker: every rank must see the same checkpoints" in out,
      f"--resume auto, checkpoints on rank 0's node only: exit {code} after {secs:.0f} s: {out[-2000:]}")
check("SIGTERM" not in out, f"no rank took the disagreement for a signal: {out[-2000:]}")
check(os.path.isfile(os.path.join(node_a, "ckpt", "step_00000004", "DONE")), "the checkpoints are untouched")

# The same directory on both ranks: the resume goes on.
code, out, secs = two_ranks(resume, resume, wdirs=(node_a, node_a))
check(code == 0 and "resumed from ckpt/step_00000004 at step 4" in out and "train: done: 4 steps" in out,
      f"--resume auto, one directory: exit {code}: {out[-2000:]}")

# A rollback: full checkpoints (rank 0 alone writes them, so they land on its node only), then a divergence.
fresh_nodes()
roll = train(os.path.join(work, "roll"), "--schedule.max_steps", "10", "--checkpoint.every_n_steps", "2",
             "--checkpoint.state_dict_type", "full", "--optim.on_divergence", "rollback",
             "--optim.max_consecutive_nonfinite", "2")
share_lock()
code, out, secs = two_ranks(roll, roll, env={"SHARDTRAIN_FAULT": "nan_grad:5-6"})
check(code == 5 and "checkpoint error: rollback: ckpt/step_00000004 is complete on rank 0, but rank 1 (on " in out
      and "no checkpoint to roll back to" not in out,
      f"a rollback to a checkpoint only rank 0 sees: exit {code} after {secs:.0f} s: {out[-2000:]}")

# evaluate --every-checkpoint, one checkpoint fewer on rank 1's node.
os.makedirs(os.path.join(node_b, "ckpt"), exist_ok=True)
shutil.copytree(os.path.join(node_a, "ckpt", "step_00000002"), os.path.join(node_b, "ckpt", "step_00000002"))
every = ["evaluate", "-w", "ckpt", "--every-checkpoint", "--data.path", ds, "--tokenizer", tok, "--fsdp.collective_timeout", "20"]
code, out, secs = two_ranks(every, every)
check(code == 5 and "checkpoint error: evaluate --every-checkpoint: ckpt/step_00000004 is complete on rank 0, but rank 1" in out,
      f"evaluate --every-checkpoint, a checkpoint fewer on rank 1: exit {code} after {secs:.0f} s: {out[-2000:]}")
code, out, secs = two_ranks(every, every, wdirs=(node_a, node_a))
check(code == 0 and out.count("bits per token") == 2, f"evaluate --every-checkpoint, one directory: exit {code}: {out[-2000:]}")

# evaluate where the dataset's tokenizer is on rank 0's node only: prepared in node_a with a tokenizer named relative
# to it (the dataset records "node-tok.json"), into a folder of its own, so that no folder above it holds one either.
alone = os.path.join(work, "alone")
os.makedirs(alone)
shutil.copy(tok, os.path.join(node_a, "node-tok.json"))
subprocess.run([st, "prepare-data", "-t", "node-tok.json", "-i", moby, "-o", os.path.join(alone, "data.h5"),
                "--validation-fraction", "0.05", "--log-level", "warn"], check=True, cwd=node_a)
weights = os.path.join(node_a, "ckpt", "step_00000004")
evaluate = ["evaluate", "-w", weights, "--data.path", os.path.join(alone, "data.h5"), "--fsdp.collective_timeout", "20"]
code, out, secs = two_ranks(evaluate, evaluate)
check(code == 0 and "bits per token" in out and not re.search(r"[0-9] bits per byte", out)
      and "evaluate: no bits per byte: 1 of 2 ranks cannot read the dataset's tokenizer (rank 1: " in out
      and out.count("no bits per byte") == 1,
      f"evaluate, the tokenizer on rank 0's node only: exit {code} after {secs:.0f} s: {out[-2000:]}")
code, out, secs = two_ranks(evaluate, evaluate, wdirs=(node_a, node_a))
check(code == 0 and re.search(r"[0-9] bits per byte", out), f"evaluate, one directory: exit {code}: {out[-2000:]}")

# The dataset on rank 0's node only (a relative data.path): one error from rank 0 naming rank 1 and its host, exit 4.
# Each rank that could not open it printed its own line, and the message did not say that rank 0 had opened it.
fresh_nodes()
shutil.copy(ds, os.path.join(node_a, "local.h5"))
local = train(os.path.join(work, "data-local"), "--schedule.max_steps", "4")
local[local.index(ds)] = "local.h5"
code, out, secs = two_ranks(local, local)
lines = [l for l in out.splitlines() if "local.h5: no such file" in l]
check(code == 4 and len(lines) == 1 and "data error: rank 1 " not in lines[0]
      and re.search(r"\(on rank 1 of 2, rank 1 on \S+; the other ranks, rank 0 too, did not fail: every rank opens the "
                    r"same data.path, on a file system every node mounts\)", lines[0]) is not None,
      f"a dataset on rank 0's node only: exit {code}, one line naming rank 1: {lines} {out[-2000:]}")

check.finish("PASS: ranks that see different checkpoints, tokenizers or datasets stop at once with one clear error, or agree")
