#!/usr/bin/env python3
"""Work is never lost (issue 36, items 1-4), through the binary on 2 ranks:
1. One flipped bit or digit in what says what the numbers mean: a rank file's parameter record, the trainer state
   in index.h5, a dataset's EOT id. `checkpoint info --verify`, `consolidate`, `dataset info --verify`, resuming
   and training each refuse the file (exit 5, 4), naming the file, the object and the attribute.
2. prepare-data never replaces a dataset unless --overwrite; a run that starts removes the incomplete step
   directories kills left (and only those).
3. Divergence: a checkpoint of non-finite weights is never saved (a periodic save is skipped, the final one ends
   the run with 9), and keep_last never removes the newest checkpoint saved while training was sound.
4. --resume auto past damaged newest checkpoints (a metadata digit; a data chunk only one rank reads): it falls back
   to the newest one that loads, says so (log, metrics, result.json), sets the damaged one aside, and ends exactly
   like the uninterrupted run; with none that loads it stops (exit 5) and changes nothing.
The flips are made in the files' bytes, as a disk or a copy would make them."""
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
st = args.shardtrain
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)

BASE = {"model.vocab_size": "600", "model.hidden_size": "64", "model.intermediate_size": "128", "model.num_hidden_layers": "2",
        "model.num_attention_heads": "4", "model.num_key_value_heads": "2", "data.seq_len": "64", "data.global_batch_size": "8",
        "schedule.warmup_steps": "2", "schedule.eval_every": "0", "logging.progress": "lines", "logging.peak_flops": "1e10",
        "schedule.max_steps": "8", "checkpoint.every_n_steps": "2", "checkpoint.keep_last": "0"}


def train(name, *extra, env_extra=None, data=ds):
    """`extra`: --key value pairs, replacing BASE's where they name the same key."""
    env = dict(os.environ)
    env.update(env_extra or {})
    keys = dict(BASE)
    keys.update({extra[i][2:]: extra[i + 1] for i in range(0, len(extra), 2)})
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", data, "--logging.run_dir", os.path.join(work, name)]
    for k, v in keys.items():
        cmd += ["--" + k, v]
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=600)


def run(*cmd):
    return subprocess.run([st, *cmd], capture_output=True, text=True, timeout=300)


def metrics(name):
    return [json.loads(l) for l in open(os.path.join(work, name, "metrics.jsonl"))]


def losses(name):
    return {m["step"]: m["loss"] for m in metrics(name) if m["kind"] == "train"}


def flip_digit(path, marker, nonzero=False):
    """Flips the lowest bit of the last digit of the first number after `marker` in the file's bytes (nonzero: the
    first such number that is not 0): 4096 becomes 4097, a digit stays a digit. Returns (old, new)."""
    data = bytearray(open(path, "rb").read())
    at = data.find(marker)
    while at >= 0:
        end = at + len(marker)
        while data[end:end + 1] == b" ":
            end += 1
        start = end
        while chr(data[end]).isdigit():
            end += 1
        if not nonzero or int(data[start:end]) != 0:
            old = data[start:end].decode()
            data[end - 1] ^= 1
            open(path, "wb").write(data)
            return old, data[start:end].decode()
        at = data.find(marker, end)
    raise AssertionError(f"{marker} not found in {path}")


def flip_int_attribute(path, name, value, bit):
    """Flips `bit` of a root integer attribute's value where HDF5 keeps it beside its name: in a version-1 attribute
    message (an object header's), the name padded to 8 bytes, the datatype's 16, the scalar dataspace's 8, then the
    value; in a version-3 one (a dataset's dense attribute storage, since 2026-11-29), the name unpadded after a 9-byte
    header that gives the datatype's and dataspace's sizes, then those two, then the value."""
    data = bytearray(open(path, "rb").read())
    at = data.find(name.encode() + b"\0")
    if at >= 9 and data[at - 9] == 3 and int.from_bytes(data[at - 7:at - 5], "little") == len(name) + 1:
        datatype, dataspace = int.from_bytes(data[at - 5:at - 3], "little"), int.from_bytes(data[at - 3:at - 1], "little")
        pos = at + len(name) + 1 + datatype + dataspace
    else:
        pos = at + (len(name) + 1 + 7) // 8 * 8 + 24
    assert at >= 0 and data[pos:pos + 8] == value.to_bytes(8, "little", signed=True), f"{name} = {value} not where expected"
    data[pos] ^= 1 << bit
    open(path, "wb").write(data)


def steps_in(path):
    """The step directories of a checkpoint directory (the run creates it, with its lock file, when it starts)."""
    return [n for n in os.listdir(path) if n.startswith("step_")] if os.path.isdir(path) else []


def copy_checkpoints(src, dst, steps):
    os.makedirs(dst, exist_ok=True)
    for s in steps:
        shutil.copytree(os.path.join(src, f"step_{s:08}"), os.path.join(dst, f"step_{s:08}"))


whole = train("whole")
check(whole.returncode == 0, f"uninterrupted run: {whole.stderr[-2000:]}")
saved = os.path.join(work, "whole", "checkpoints")
final = os.path.join(saved, "step_00000008")
info = run("checkpoint", "info", "--verify", final)
check(info.returncode == 0 and "metadata: ok (" in info.stdout and "in 3 files match their checksums" in info.stdout,
      f"a checkpoint saved now has its metadata checked: {info.stdout[:1500]} {info.stderr}")

# 1. A rank file's parameter record: one element's offset off by one. Before, verify passed and consolidate
# wrote shifted weights.
params = os.path.join(work, "params_flipped", "step_00000008")
shutil.copytree(final, params)
old, new = flip_digit(os.path.join(params, "rank_00000.h5"), b'"file_offset":', nonzero=True)
for what, r in (("checkpoint info --verify", run("checkpoint", "info", "--verify", params)),
                ("consolidate", run("consolidate", params, "--output", os.path.join(work, "params_flipped.h5")))):
    check(r.returncode == 5 and "rank_00000.h5: units/" in r.stderr and "attribute 'params' does not match the checksum" in r.stderr,
          f"{what} of a checkpoint whose file_offset {old} became {new}: exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-1500:]}")
check(not os.path.exists(os.path.join(work, "params_flipped.h5")), "consolidate wrote nothing from the damaged checkpoint")
r = train("params_resume", "--resume", params)
check(r.returncode == 5 and "attribute 'params' does not match" in r.stderr, f"--resume PATH of it: exit {r.returncode}: {r.stderr[-1500:]}")

# The trainer state in index.h5: one digit of tokens_seen. Before, verify passed and resume blamed the config.
state = os.path.join(work, "state_flipped", "step_00000008")
shutil.copytree(final, state)
flip_digit(os.path.join(state, "index.h5"), b'"tokens_seen":')
r = run("checkpoint", "info", "--verify", state)
check(r.returncode == 5 and "index.h5: the root group: attribute 'trainer_state' does not match the checksum" in r.stderr,
      f"a flipped trainer_state digit: exit {r.returncode}: {r.stderr[-1500:]}")

# A dataset's EOT id 1 -> 3 (the case): dataset info --verify and training refuse it, naming the attribute.
bad_ds = os.path.join(work, "eot-flipped.h5")
shutil.copy(ds, bad_ds)
flip_int_attribute(bad_ds, "eot_id", 1, 1)
# A dataset prepared since 2026-11-29 keeps its attributes in HDF5's dense storage, whose blocks HDF5 checksums itself:
# it refuses the file first, naming the root group's attributes; one of before, in the object header, is caught by
# shardtrain's own checksum of eot_id.
refused = lambda err: ("attribute 'eot_id' does not match the checksum" in err  # noqa: E731
                       or "the root group: HDF5 cannot read the attribute list" in err and "metadata checksum" in err)
r = run("dataset", "info", "--verify", bad_ds)
check(r.returncode == 4 and refused(r.stderr) and "prepare the dataset again" in r.stderr,
      f"dataset info --verify of a flipped EOT id: exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-1500:]}")
r = train("eot_flipped", data=bad_ds)
check(r.returncode == 4 and refused(r.stderr), f"training on it: exit {r.returncode}: {r.stderr[-1500:]}")

# 2. prepare-data over an existing dataset, from a 2-byte input: refused (exit 2), the dataset as it was.
tiny = os.path.join(work, "tiny.txt")
open(tiny, "w").write("hi")
size = os.path.getsize(ds)
r = run("prepare-data", "-t", tok, "-i", tiny, "-o", ds)
check(r.returncode == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr and os.path.getsize(ds) == size,
      f"prepare-data over an existing dataset: exit {r.returncode}: {r.stderr[-800:]}")
other = os.path.join(work, "other.h5")
shutil.copy(ds, other)
r = run("prepare-data", "-t", tok, "-i", tiny, "-o", other, "--overwrite", "--validation-fraction", "0")
check(r.returncode == 0 and os.path.getsize(other) < size and not [f for f in os.listdir(work) if f.startswith("other.h5.")],
      f"prepare-data --overwrite: exit {r.returncode}: {r.stderr[-800:]}")

# 4. The newest checkpoint damaged (step 6: a trainer-state digit), with what kills left beside it: a step-7
# save's .tmp, a step-5 directory without DONE (a removal cut short), and a step-3 directory that holds something
# a save never writes. --resume auto falls back to step 4, says so, sets step 6 aside, removes the incomplete
# ones (not step 3), and ends exactly like the uninterrupted run.
fb = os.path.join(work, "fallback", "ckpt")
copy_checkpoints(saved, fb, (2, 4, 6))
flip_digit(os.path.join(fb, "step_00000006", "index.h5"), b'"tokens_seen":')
shutil.copytree(os.path.join(saved, "step_00000004"), os.path.join(fb, "step_00000005"))
os.remove(os.path.join(fb, "step_00000005", "DONE"))
os.makedirs(os.path.join(fb, "step_00000007.tmp"))
shutil.copy(os.path.join(final, "rank_00000.h5"), os.path.join(fb, "step_00000007.tmp"))
os.makedirs(os.path.join(fb, "step_00000003"))
open(os.path.join(fb, "step_00000003", "notes.txt"), "w").write("not a save's")
r = train("fallback", "--checkpoint.dir", fb, "--resume", "auto")
check(r.returncode == 0, f"--resume auto past a damaged checkpoint: exit {r.returncode}: {r.stderr[-2500:]}")
check("RESUMED FROM AN OLDER CHECKPOINT" in r.stderr and "step_00000006 is damaged" in r.stderr
      and "attribute 'trainer_state' does not match" in r.stderr and "resumed from " + os.path.join(fb, "step_00000004") in r.stderr,
      f"the fallback is said loudly: {r.stderr[-3000:]}")
b = losses("fallback")
a = losses("whole")
check(sorted(b) == [5, 6, 7, 8] and all(a[s] == b[s] for s in b), f"resumed at step 5 and equal to the whole run: {b} {a}")
result = json.load(open(os.path.join(work, "fallback", "result.json")))
damaged = result.get("damaged_checkpoints", [])
check(result.get("resumed_from", "").endswith("step_00000004") and len(damaged) == 1
      and damaged[0]["checkpoint"].endswith("step_00000006") and damaged[0]["set_aside_as"].endswith("step_00000006.damaged")
      and "trainer_state" in damaged[0]["error"], f"result.json: {result}")
events = [m for m in metrics("fallback") if m.get("kind") == "resume_fallback"]
check(len(events) == 1 and events[0]["damaged"].endswith("step_00000006"), f"the metrics record the fallback: {events}")
left = sorted(n for n in os.listdir(fb) if n != ".shardtrain.lock")
check(left == ["step_00000002", "step_00000003", "step_00000004", "step_00000006", "step_00000006.damaged", "step_00000008"],
      f"the damaged checkpoint set aside, the incomplete ones removed, the foreign one kept, steps 6 and 8 saved again: {left}")
check("removed " + os.path.join(fb, "step_00000005") in r.stderr and "removed " + os.path.join(fb, "step_00000007.tmp") in r.stderr
      and "step_00000003 is incomplete (no DONE) but holds more than a save writes" in r.stderr, f"the removals are logged: {r.stderr[-3000:]}")

# A data chunk of rank_00001.h5 damaged: only rank 1 reads it, and every rank falls back together.
fb2 = os.path.join(work, "fallback_data", "ckpt")
copy_checkpoints(saved, fb2, (2, 4))
rank1 = os.path.join(fb2, "step_00000004", "rank_00001.h5")
data = bytearray(open(rank1, "rb").read())
for k in range(16):
    data[len(data) // 2 + k] ^= 0xFF
open(rank1, "wb").write(data)
r = train("fallback_data", "--checkpoint.dir", fb2, "--resume", "auto")
check(r.returncode == 0 and "rank_00001.h5" in r.stderr and "resumed from " + os.path.join(fb2, "step_00000002") in r.stderr
      and sorted(losses("fallback_data")) == list(range(3, 9)), f"a damaged data chunk: exit {r.returncode}: {r.stderr[-2500:]}")

# Nothing that loads: exit 5, every reason named, nothing renamed.
none = os.path.join(work, "none", "ckpt")
copy_checkpoints(saved, none, (6,))
flip_digit(os.path.join(none, "step_00000006", "index.h5"), b'"tokens_seen":')
r = train("none", "--checkpoint.dir", none, "--resume", "auto")
check(r.returncode == 5 and "none of the 1 complete checkpoints" in r.stderr and sorted(os.listdir(none)) == [".shardtrain.lock", "step_00000006"],
      f"no checkpoint loads: exit {r.returncode}: {r.stderr[-1500:]}")

# 3. Divergence. Steps 5-10 get a NaN gradient (skipped), the run stops at the 6th in a row (exit 9). Saves at 6 and
# 8 fall in the streak; with keep_last 2 they used to rotate steps 2 and 4 away. Step 4, the newest saved while
# training was sound, stays.
r = train("diverged", "--checkpoint.keep_last", "2", "--schedule.max_steps", "20", "--optim.max_consecutive_nonfinite", "6",
          env_extra={"SHARDTRAIN_FAULT": "nan_grad:5-20"})
ck = os.path.join(work, "diverged", "checkpoints")
kept = sorted(n for n in os.listdir(ck) if n.startswith("step_")) if os.path.isdir(ck) else []
health = {d: json.load(open(os.path.join(ck, d, "DONE"))).get("healthy") for d in kept}
check(r.returncode == 9 and kept == ["step_00000004", "step_00000006", "step_00000008"]
      and health == {"step_00000004": True, "step_00000006": False, "step_00000008": False},
      f"keep_last 2 through a divergence: exit {r.returncode}, kept {health}: {r.stderr[-1500:]}")
check("keeping " + os.path.join(ck, "step_00000004") + " beyond keep_last = 2" in r.stderr, f"the kept one is logged: {r.stderr[-2000:]}")

# Non-finite weights (a learning rate past float's range): the periodic save of step 2 is skipped and recorded;
# with a final save due instead, the run ends with 9 and no checkpoint. Before, both saved inf/nan weights.
INF = ["--optim.lr", "1e39", "--schedule.warmup_steps", "0"]
r = train("inf_periodic", *INF, "--optim.max_consecutive_nonfinite", "3")
skipped = [m for m in metrics("inf_periodic") if m.get("kind") == "checkpoint_skipped"]
check(r.returncode == 9 and not steps_in(os.path.join(work, "inf_periodic", "checkpoints"))
      and [m["step"] for m in skipped] == [2] and "the save of step 2 is skipped: the weights are not finite" in r.stderr,
      f"a periodic save of non-finite weights: exit {r.returncode}, {skipped}: {r.stderr[-1500:]}")
r = train("inf_final", *INF, "--schedule.max_steps", "2", "--checkpoint.every_n_steps", "10")
check(r.returncode == 9 and "the weights are not finite at step 2, so the final save is not made" in r.stderr
      and not steps_in(os.path.join(work, "inf_final", "checkpoints")), f"the final save of non-finite weights: exit {r.returncode}: {r.stderr[-1500:]}")

check.finish("PASS: damaged metadata is refused by name everywhere, datasets are not replaced, kills' leftovers are removed, "
             "divergence keeps the sound checkpoint and saves no non-finite weights, and --resume auto falls back past damage")
