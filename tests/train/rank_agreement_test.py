#!/usr/bin/env python3
"""Ranks that resolved different configurations, or see different datasets, stop at once with one clear error
naming the first differing key and the ranks (issue 36, item 5). Before, they ran until the collective watchdog
fired (one rank saved every 2 steps, the other every 100) or ended in an MPI error quoting a call.
Each case starts two ranks as two application contexts of one mpirun (`-np 1 A : -np 1 B`):
- overrides that differ: checkpoint.every_n_steps 2 and 100, and model.hidden_size 64 and 32: exit 3;
- config files that differ (one edited between the ranks' reads): exit 3, naming the key;
- the same data.path, another file behind it on each rank (their working directories differ): exit 4;
- the same everything: trains.
Each must end within seconds; the watchdog (fsdp.collective_timeout 60) would take a minute."""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain
moby = clitest.corpus(args, "moby-dick")
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby-bpe512", 0.05)
config = os.path.join(args.source, "configs", "tiny-cpu.toml")

BASE = ["--model.vocab_size", "600", "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4",
        "--model.num_key_value_heads", "2", "--model.intermediate_size", "128", "--data.seq_len", "64",
        "--data.global_batch_size", "8", "--schedule.max_steps", "6", "--schedule.warmup_steps", "2", "--schedule.eval_every", "0",
        "--logging.progress", "lines", "--logging.peak_flops", "1e10", "--fsdp.collective_timeout", "60"]


def rank_args(name, overrides, cfg=config, data=ds):
    return [st, "train", "--config", cfg, "--data.path", data, "--logging.run_dir", os.path.join(work, name), *BASE, *overrides]


def two_ranks(name, a, b, wdirs=(None, None)):
    """mpirun -np 1 A : -np 1 B; (exit code, output, seconds)."""
    cmd = [args.mpiexec, "--oversubscribe"]
    for i, (extra, wdir) in enumerate(zip((a, b), wdirs)):
        cmd += ([":"] if i else []) + ["-np", "1"] + (["-wdir", wdir] if wdir else []) + extra
    t0 = time.time()
    p = subprocess.run(cmd, cwd=args.source, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr, time.time() - t0


code, out, secs = two_ranks("every", rank_args("every", ["--model.hidden_size", "64", "--checkpoint.every_n_steps", "2"]),
                            rank_args("every", ["--model.hidden_size", "64", "--checkpoint.every_n_steps", "100"]))
check(code == 3 and "the ranks resolved different configurations: checkpoint.every_n_steps = 100 on rank 1, 2 on rank 0 "
      "(rank 1 of 2 differs from rank 0)" in out and secs < 60,
      f"checkpoint.every_n_steps 2 and 100: exit {code} after {secs:.0f} s: {out[-2000:]}")
check(out.count("the ranks resolved different configurations") == 1, f"one line, not one per rank: {out[-2000:]}")

code, out, secs = two_ranks("hidden", rank_args("hidden", ["--model.hidden_size", "64"]), rank_args("hidden", ["--model.hidden_size", "32"]))
check(code == 3 and "model.hidden_size = 32 on rank 1, 64 on rank 0" in out and secs < 60,
      f"model.hidden_size 64 and 32: exit {code} after {secs:.0f} s: {out[-2000:]}")

# The config file edited between the two ranks' reads.
edited = os.path.join(work, "edited.toml")
text = open(config).read()
assert "weight_decay = 0.1\n" in text
open(edited, "w").write(text.replace("weight_decay = 0.1\n", "weight_decay = 0.05\n", 1))
code, out, secs = two_ranks("edited", rank_args("edited", ["--model.hidden_size", "64"]),
                            rank_args("edited", ["--model.hidden_size", "64"], cfg=edited))
check(code == 3 and "optim.weight_decay = 0.05 on rank 1" in out and secs < 60,
      f"an edited config file: exit {code} after {secs:.0f} s: {out[-2000:]}")

# One relative data.path, another file behind it on each rank (another copy on another node, say).
for d, fraction in (("node_a", "0.05"), ("node_b", "0.2")):
    os.makedirs(os.path.join(work, d))
    subprocess.run([st, "prepare-data", "-t", tok, "-i", moby, "-o", os.path.join(work, d, "data.h5"), "--validation-fraction", fraction,
                    "--log-level", "warn"], check=True)
code, out, secs = two_ranks("data", rank_args("data", ["--model.hidden_size", "64"], data="data.h5"),
                            rank_args("data", ["--model.hidden_size", "64"], data="data.h5"),
                            wdirs=(os.path.join(work, "node_a"), os.path.join(work, "node_b")))
check(code == 4 and "the ranks read different datasets: data.path (data.h5) = " in out and "on rank 1, " in out
      and "(rank 1 of 2 differs from rank 0)" in out and secs < 60,
      f"different files at one data.path: exit {code} after {secs:.0f} s: {out[-2000:]}")

# The same configuration through two application contexts: it trains.
code, out, secs = two_ranks("same", rank_args("same", ["--model.hidden_size", "64"]), rank_args("same", ["--model.hidden_size", "64"]))
check(code == 0 and "train: done: 6 steps" in out, f"the same configuration: exit {code}: {out[-2000:]}")

check.finish("PASS: ranks with different configurations or data stop at once, naming the first differing key and the ranks")
