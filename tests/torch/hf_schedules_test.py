#!/usr/bin/env python3
"""shardtrain's learning-rate schedules against transformers' own (`get_scheduler`, what a Trainer's
`lr_scheduler_type` selects): cosine, cosine_with_min_lr, linear, constant_with_warmup and
warmup_stable_decay, each against `shardtrain train` with the settings docs/training.md gives for it, step by
step from metrics.jsonl. The seed's own SequentialLR(LinearLR, CosineAnnealingLR) is seed_loop_test's."""
import json
import os
import subprocess

from torch_env import Test

t = Test(with_dataset=True)
args, check, work, env, ds = t.args, t.check, t.work, t.env, t.dataset
LR, WARMUP, TOTAL, DECAY = 3e-3, 8, 40, 10

# name: (transformers scheduler, its scheduler_specific_kwargs, shardtrain [schedule] keys)
CASES = {
    "cosine": ("cosine", {}, {"kind": '"cosine"', "warmup_start_factor": 0.0, "min_lr": 0.0}),
    "cosine_with_min_lr": ("cosine_with_min_lr", {"min_lr_rate": 0.1},
                           {"kind": '"cosine"', "warmup_start_factor": 0.0, "min_lr": 0.1 * LR}),
    "linear": ("linear", {}, {"kind": '"linear"', "warmup_start_factor": 0.0, "min_lr": 0.0}),
    "constant_with_warmup": ("constant_with_warmup", {}, {"kind": '"constant"', "warmup_start_factor": 0.0}),
    # transformers' WSD starts its warmup at min_lr_ratio too; its default decay is cosine, shardtrain's is linear
    "warmup_stable_decay": ("warmup_stable_decay", {"num_decay_steps": DECAY, "decay_type": "linear", "min_lr_ratio": 0.1},
                            {"kind": '"wsd"', "warmup_start_factor": 0.1, "min_lr": 0.1 * LR, "decay_steps": DECAY}),
}
theirs = env.side("hf-schedules", json.dumps({n: [k, kw] for n, (k, kw, _) in CASES.items()}), "--lr", str(LR),
                  "--warmup", str(WARMUP), "--total", str(TOTAL))

worst = 0.0
for name, (_, _, keys) in CASES.items():
    config = os.path.join(work, f"{name}.toml")
    schedule = "".join(f"{k} = {v}\n" for k, v in keys.items())
    with open(config, "w") as f:
        f.write("[model]\nvocab_size = 512\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 1\n"
                "num_attention_heads = 2\nnum_key_value_heads = 1\nmax_position_embeddings = 64\n\n"
                f"[optim]\nlr = {LR}\n\n[schedule]\n{schedule}warmup_steps = {WARMUP}\nmax_steps = {TOTAL}\neval_every = 0\n\n"
                f"[data]\npath = \"{ds}\"\nseq_len = 32\nglobal_batch_size = 2\n\n"
                "[checkpoint]\nevery_n_steps = 0\n\n[logging]\nprogress = \"lines\"\nlog_every = 100\n")
    run_dir = os.path.join(work, name)
    p = subprocess.run([args.shardtrain, "train", "--config", config, "--logging.run_dir", run_dir, "--log-level", "warn"],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"{name}: shardtrain train exit {p.returncode}: {p.stderr[-1500:]}")
    if p.returncode != 0:
        continue
    ours = [m["lr"] for m in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if m["kind"] == "train"]
    ref = theirs[name]
    check(len(ours) == TOTAL, f"{name}: {len(ours)} steps, expected {TOTAL}")
    for k, (a, b) in enumerate(zip(ours, ref)):
        rel = abs(a - b) / max(abs(b), 1e-300) if b != 0 else abs(a)
        worst = max(worst, rel)
        check(rel <= 1e-12, f"{name}: step {k + 1}: shardtrain lr {a!r}, transformers {b!r}")
    print(f"{name:22s} shardtrain {ours[0]:.6g} .. {ours[WARMUP]:.6g} .. {ours[-1]:.6g}; transformers "
          f"{ref[0]:.6g} .. {ref[WARMUP]:.6g} .. {ref[-1]:.6g}")
print(f"worst relative difference over {len(CASES)} schedules x {TOTAL} steps: {worst:.1e}")
check.finish("PASS: shardtrain's schedules equal transformers' get_scheduler step for step")
