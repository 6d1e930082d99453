#!/usr/bin/env python3
"""A run moved between allocations, through `shardtrain train` (hostile audit of meshes and resharding): a model whose
units do not divide by the shard sizes (padding; one layer, fewer than the ranks; tied embeddings) saved on 4 ranks
with FULL_SHARD continues on 4 as two nodes (HYBRID_SHARD), 3 (SHARD_GRAD_OP, 4 micro-batches), 2 (NO_SHARD,
no_sync), 1 (offload) and 6 as two nodes of 3 (HYBRID_SHARD_ZERO2, all_reduce_last) with the uninterrupted run's losses
to fp32 rounding; a FULL_STATE_DICT checkpoint (the weights and AdamW's moments whole) resumes on 3 ranks to the same
losses, and its model.h5 given to init_from (what --resume's refusal of the file advises) starts the
same run as its folder, bit for bit (it was refused: exit 5, "not a consolidated shardtrain file"); meshes the
allocation cannot hold are refused with 3, naming why."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)

# 36-wide, MLP 70, 3 heads over 1 key/value head: units of 18473 and 11102 elements, padded on 3, 4 and 6 ranks.
BASE = ["--model.vocab_size", "512", "--model.hidden_size", "36", "--model.intermediate_size", "70",
        "--model.num_hidden_layers", "1", "--model.num_attention_heads", "3", "--model.num_key_value_heads", "1",
        "--model.tie_word_embeddings", "true", "--data.seq_len", "64", "--data.global_batch_size", "12",
        "--schedule.warmup_steps", "2", "--schedule.eval_every", "0", "--schedule.max_steps", "8",
        "--checkpoint.every_n_steps", "2", "--checkpoint.keep_last", "0", "--logging.progress", "lines",
        "--logging.peak_flops", "1e10"]


def train(name, np, *extra):
    cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), args.shardtrain, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", ds, "--logging.run_dir", os.path.join(work, name), *BASE, *extra]
    env = dict(os.environ)
    env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, errors="replace", timeout=600)


def losses(name):
    path = os.path.join(work, name, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    return {l["step"]: l["loss"] for l in map(json.loads, open(path)) if l["kind"] == "train"}


def resume(name, np, checkpoint, *extra):
    """Continues from a copy of `checkpoint` in a checkpoint directory of its own."""
    ckpt_dir = os.path.join(work, name + "_ckpt")
    shutil.copytree(checkpoint, os.path.join(ckpt_dir, os.path.basename(checkpoint)))
    return train(name, np, "--checkpoint.dir", ckpt_dir, "--resume", "auto", *extra)


saved = train("saved", 4)
check(saved.returncode == 0, f"the 4-rank run: exit {saved.returncode}: {saved.stderr[-1500:]}")
whole = losses("saved")
step4 = os.path.join(work, "saved", "checkpoints", "step_00000004")

for name, np, extra in (("hybrid_2x2", 4, ["--fsdp.strategy", "HYBRID_SHARD", "--ranks-per-node", "2"]),
                        ("grad_op_3", 3, ["--fsdp.strategy", "SHARD_GRAD_OP", "--data.micro_batch_size", "1"]),
                        ("no_shard_2", 2, ["--fsdp.strategy", "NO_SHARD", "--data.micro_batch_size", "2",
                                           "--fsdp.grad_accumulation", "no_sync"]),
                        ("offload_1", 1, ["--fsdp.offload_params", "true"]),
                        ("zero2_3x2", 6, ["--fsdp.strategy", "HYBRID_SHARD_ZERO2", "--ranks-per-node", "3",
                                          "--data.micro_batch_size", "1", "--fsdp.grad_accumulation", "all_reduce_last"])):
    r = resume(name, np, step4, *extra)
    got = losses(name)
    check(r.returncode == 0 and "resumed from" in r.stderr, f"{name}: exit {r.returncode}: {r.stderr[-1500:]}")
    check(sorted(got) == [5, 6, 7, 8] and all(abs(got[k] - whole[k]) <= 1e-6 * whole[k] for k in got),
          f"{name}: losses after the move {[(k, whole.get(k), got[k]) for k in sorted(got)]}")

# FULL_STATE_DICT: the weights and AdamW's moments whole. Resumed on 3 ranks it continues the run as the sharded
# checkpoints do (before 2026-11-29 the optimizer started fresh there).
full = train("full", 4, "--checkpoint.state_dict_type", "FULL_STATE_DICT")
check(full.returncode == 0, f"the FULL_STATE_DICT run: exit {full.returncode}: {full.stderr[-1500:]}")
full4 = os.path.join(work, "full", "checkpoints", "step_00000004")
r = resume("full_resumed", 3, full4)
got = losses("full_resumed")
check(r.returncode == 0 and sorted(got) == [5, 6, 7, 8] and "the optimizer starts fresh" not in r.stderr,
      f"FULL_STATE_DICT resumed on 3 ranks: exit {r.returncode}: {r.stderr[-1500:]}")
check(all(abs(got[k] - whole[k]) <= 1e-6 * whole[k] for k in got),
      f"FULL_STATE_DICT resumed on 3 ranks: losses {[(k, whole.get(k), got[k]) for k in sorted(got)]}")
# Its model.h5, named as a file: --resume refuses it and advises init_from, which reads it as its folder.
model_h5 = os.path.join(full4, "model.h5")
r = train("resume_file", 3, "--resume", model_h5)
check(r.returncode == 5 and "use --checkpoint.init_from instead" in r.stderr, f"--resume FILE: exit {r.returncode}: {r.stderr[-800:]}")
from_file = train("init_file", 3, "--checkpoint.init_from", model_h5)
from_dir = train("init_dir", 3, "--checkpoint.init_from", full4)
check(from_file.returncode == 0 and from_dir.returncode == 0,
      f"init_from model.h5: exit {from_file.returncode}: {from_file.stderr[-1000:]}; the folder: exit {from_dir.returncode}")
check(losses("init_file") == losses("init_dir") and len(losses("init_dir")) == 8,
      f"init_from model.h5 and its folder: {losses('init_file')} vs {losses('init_dir')}")

# What the allocation cannot hold: one line, exit 3.
r = train("batch_5", 5)
check(r.returncode == 3 and "data.global_batch_size: 12 sequences cannot be split evenly over 5 ranks" in r.stderr,
      f"5 ranks, 12 sequences: exit {r.returncode}: {r.stderr[-800:]}")
r = train("nodes_6_by_4", 6, "--fsdp.strategy", "HYBRID_SHARD", "--ranks-per-node", "4")
check(r.returncode == 3 and "world size 6 is not divisible by ranks_per_node 4" in r.stderr,
      f"6 ranks as nodes of 4: exit {r.returncode}: {r.stderr[-800:]}")

check.finish("mesh moves: resumed on 5 meshes; FULL_STATE_DICT and its model.h5; 2 refusals")
