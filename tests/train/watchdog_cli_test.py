#!/usr/bin/env python3
"""The hang watchdog through the binary: one rank stops answering (SHARDTRAIN_FAULT=stall:1@3); the
other, blocked in a collective, ends the whole job within the timeout with exit code 10 and a message
naming the collective, its axis and the step. A run without the fault and the same short timeout
finishes normally (no false alarm)."""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)


def train(name, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", args.shardtrain, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", ds, "--logging.run_dir", os.path.join(work, name), "--model.vocab_size", "512",
           "--model.hidden_size", "64", "--model.intermediate_size", "128", "--model.num_hidden_layers", "2",
           "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--data.seq_len", "64",
           "--data.global_batch_size", "8", "--schedule.max_steps", "12", "--schedule.warmup_steps", "2",
           "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "0", "--logging.progress", "lines",
           "--fsdp.collective_timeout", "3"]
    start = time.time()
    p = subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr, time.time() - start


rc, err, secs = train("healthy")
check(rc == 0, f"a healthy run with a 3 s timeout: exit {rc}: {err[-1500:]}")
rc, err, secs = train("stalled", {"SHARDTRAIN_FAULT": "stall:1@3"})
check(rc == 10, f"stalled rank: exit code {rc}, expected 10: {err[-1500:]}")
check("collective timeout" in err and "axis" in err and "during step 3" in err, f"the message names collective, axis, step: {err[-1500:]}")
check(secs < 60, f"the job ended {secs:.0f} s after start; the watchdog should end it within seconds of the 3 s timeout")
check.finish("all watchdog checks passed")
