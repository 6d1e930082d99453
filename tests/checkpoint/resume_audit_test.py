#!/usr/bin/env python3
"""Resume anywhere, attacked (hostile audit of --resume), through the binary on 2 ranks:
1. A checkpoint's DONE marker that is not what a save writes (garbage, empty, an array, "healthy": "yes", the step of
   another directory): --resume auto falls back to the newest good checkpoint, sets the damaged one aside and ends
   with the uninterrupted run's losses bit for bit; an explicit path to it is exit 5 naming DONE and what was expected.
   Before, "healthy": "yes" was an internal error (exit 1) at every resume and rotation, and the rest loaded.
2. A rank file copied in from another run's checkpoint of the same step: the same fallback, naming the file. Before, it
   loaded, and the run trained on weights half from each run.
3. A resume whose data settings no longer give the saved position its meaning (data.seq_len, data.layout, data.seed,
   data.shuffle, or a dataset file at the same path with other samples): said in a warning naming the key, its values
   and what happens, and recorded in metrics.jsonl. Before, the run went on silently, repeating and skipping samples.
4. A schedule edited before the resume (max_steps, warmup, lr): said, with the next step's rate now and in the saving
   run's schedule; other AdamW settings (betas, weight decay): said. Before, the learning rate jumped without a word.
5. --resume given a file (a consolidated model, a checkpoint's index.h5): exit 5 saying what to pass instead; a run
   directory: its newest checkpoint (before: "not a checkpoint").
6. A checkpoint held by a writer (exit 5, nothing set aside), a DONE that is a link loop (damaged: the fallback), and
   `checkpoint info` of a folder of complete checkpoints shows the newest (it said "none complete", then refused).
"""
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
moby = clitest.corpus(args, "moby-dick")
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby-bpe512", 0.05)

BASE = {"model.vocab_size": "600", "model.hidden_size": "64", "model.intermediate_size": "128", "model.num_hidden_layers": "2",
        "model.num_attention_heads": "4", "model.num_key_value_heads": "2", "data.seq_len": "64", "data.global_batch_size": "8",
        "schedule.warmup_steps": "2", "schedule.eval_every": "0", "logging.progress": "lines", "logging.peak_flops": "1e10",
        "schedule.max_steps": "8", "checkpoint.every_n_steps": "2", "checkpoint.keep_last": "0"}


def train(name, *extra, data=ds):
    """`extra`: --key value pairs, replacing BASE's where they name the same key (--resume too)."""
    keys = dict(BASE)
    keys.update({extra[i][2:]: extra[i + 1] for i in range(0, len(extra), 2)})
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml",
           "--data.path", data, "--logging.run_dir", os.path.join(work, name)]
    for k, v in keys.items():
        cmd += ["--" + k, v]
    return subprocess.run(cmd, cwd=args.source, capture_output=True, text=True, timeout=600)


def metrics(name):
    return [json.loads(l) for l in open(os.path.join(work, name, "metrics.jsonl"))]


def losses(name):
    return {m["step"]: m["loss"] for m in metrics(name) if m["kind"] == "train"}


def ckpt(name, step):
    return os.path.join(work, name, "checkpoints", f"step_{step:08}")


def copy_checkpoints(name, steps, src="whole"):
    """A run directory NAME holding copies of src's checkpoints at `steps`."""
    os.makedirs(os.path.join(work, name, "checkpoints"))
    for s in steps:
        shutil.copytree(ckpt(src, s), ckpt(name, s))


whole = train("whole")
check(whole.returncode == 0, f"uninterrupted run: {whole.stderr[-2000:]}")
expected = losses("whole")
done4 = json.load(open(os.path.join(ckpt("whole", 4), "DONE")))
check(done4["step"] == 4 and done4["healthy"] is True and done4["files"] == ["rank_00000.h5", "rank_00001.h5"],
      f"DONE as a save writes it: {done4}")

# 1. Damaged DONE markers.
bad_done = {
    "garbage": ("not json", "is not JSON (8 bytes)"),
    "empty": ("", "is empty"),
    "array": ("[4]", "is a JSON array, not an object"),
    "healthy_string": (json.dumps(dict(done4, healthy="yes")), 'has "healthy": "yes", not true or false'),
    "no_step": (json.dumps({k: v for k, v in done4.items() if k != "step"}), 'has no "step"'),
    "other_step": (json.dumps(dict(done4, step=6)), "says step 6, in the directory of step 4"),
    "other_files": (json.dumps(dict(done4, files=["rank_00000.h5"])), 'has "files": ["rank_00000.h5"]'),
}
for case, (text, what) in bad_done.items():
    name = f"done_{case}"
    copy_checkpoints(name, [2, 4])
    open(os.path.join(ckpt(name, 4), "DONE"), "w").write(text)
    r = train(name, "--resume", "auto")
    done_path = os.path.join(ckpt(name, 4), "DONE")
    check(r.returncode == 0 and f"{done_path}: {what}" in r.stderr and "expected the JSON object a save writes" in r.stderr
          and f"RESUMED FROM AN OLDER CHECKPOINT: {ckpt(name, 4)} is damaged" in r.stderr,
          f"{case}: --resume auto falls back past a DONE that {what}: exit {r.returncode}: {r.stderr[-2500:]}")
    check(os.path.isdir(ckpt(name, 4) + ".damaged") and open(os.path.join(ckpt(name, 4) + ".damaged", "DONE")).read() == text,
          f"{case}: the damaged checkpoint is set aside, its DONE as it was")
    got = losses(name) if r.returncode == 0 else {}
    check(got == {s: expected[s] for s in range(3, 9)}, f"{case}: steps 3-8 again, bit for bit: {got} vs {expected}")
    if case in ("healthy_string", "other_step"):
        x = train(name + "_explicit", "--resume", ckpt(name, 4) + ".damaged")
        # set aside, the directory is no step's: DONE's step is held to the index's
        explicit_what = "says step 6, its index.h5 step 4" if case == "other_step" else what
        check(x.returncode == 5 and f"{ckpt(name, 4)}.damaged/DONE: {explicit_what}" in x.stderr
              and "the completion marker is damaged" in x.stderr,
              f"{case}: an explicit --resume of it is exit 5 naming DONE: exit {x.returncode}: {x.stderr[-1500:]}")

# A whole checkpoint copied under another step's name: its DONE and index say step 4.
copy_checkpoints("renamed", [2])
shutil.copytree(ckpt("whole", 2), ckpt("renamed", 6))
r = train("renamed", "--resume", "auto")
check(r.returncode == 0 and "DONE: says step 2, in the directory of step 6" in r.stderr
      and f"resumed from {ckpt('renamed', 2)} at step 2" in r.stderr,
      f"step_6 holding step 2's checkpoint is damaged, step 2 resumed: exit {r.returncode}: {r.stderr[-2000:]}")

# A non-bool "healthy" in an older checkpoint, met by the rotation (keep_last 1) of a run resumed from a good one: the
# rotation read it with a type_error (exit 1) before.
copy_checkpoints("rotation", [2, 4])
open(os.path.join(ckpt("rotation", 2), "DONE"), "w").write(json.dumps(dict(done4, step=2, healthy="yes")))
r = train("rotation", "--resume", "auto", "--checkpoint.keep_last", "1")
check(r.returncode == 0 and losses("rotation") == {s: expected[s] for s in range(5, 9)},
      f"a rotation beside a damaged DONE: exit {r.returncode}: {r.stderr[-2000:]}")

# 2. A rank file of another run's checkpoint of the same step.
other = train("other", "--data.seed", "7", "--schedule.max_steps", "4")
check(other.returncode == 0, f"the other run: {other.stderr[-1500:]}")
copy_checkpoints("mixed", [2, 4])
shutil.copy(os.path.join(ckpt("other", 4), "rank_00001.h5"), os.path.join(ckpt("mixed", 4), "rank_00001.h5"))
r = train("mixed", "--resume", "auto")
check(r.returncode == 0 and f"{ckpt('mixed', 4)}/rank_00001.h5: was written by another save" in r.stderr
      and "files mixed from two checkpoints of step 4" in r.stderr and f"resumed from {ckpt('mixed', 2)} at step 2" in r.stderr,
      f"a rank file of another run's step 4: falls back to step 2: exit {r.returncode}: {r.stderr[-2500:]}")
got = losses("mixed") if r.returncode == 0 else {}
check(got == {s: expected[s] for s in range(3, 9)}, f"mixed: steps 3-8 again, bit for bit: {got}")
x = train("mixed_explicit", "--resume", ckpt("mixed", 4) + ".damaged")
check(x.returncode == 5 and "rank_00001.h5: was written by another save" in x.stderr,
      f"an explicit --resume of it is exit 5: exit {x.returncode}: {x.stderr[-1500:]}")

# 3. Data settings that change what the saved position (32 samples into epoch 0's order) means.
same = train("same", "--resume", ckpt("whole", 4))
check(same.returncode == 0 and "its data position" not in same.stderr and "resume_data_changed" not in open(
    os.path.join(work, "same", "metrics.jsonl")).read() and losses("same") == {s: expected[s] for s in range(5, 9)},
      f"an unchanged resume says nothing and continues bit for bit: exit {same.returncode}: {same.stderr[-1500:]}")
for key, value, said in (("data.seq_len", "32", "data.seq_len 64 (this run: 32)"),
                         ("data.seed", "99", "data.seed 1234 (this run: 99)"),
                         ("data.shuffle", "false", "data.shuffle true (this run: false)"),
                         ("data.layout", "padded", 'data.layout "packed" (this run: "padded")')):
    name = "changed_" + key.split(".")[1]
    r = train(name, "--resume", ckpt("whole", 4), "--" + key, value)
    events = [m for m in metrics(name) if m["kind"] == "resume_data_changed"] if r.returncode == 0 else []
    check(r.returncode == 0 and f"its data position (a count of samples into the epoch's order) was taken with {said}"
          in r.stderr and "samples already trained on come again and others are skipped" in r.stderr
          and len(events) == 1 and said in events[0]["change"] and events[0]["checkpoint"] == ckpt("whole", 4),
          f"resumed with {key} {value}: said and recorded: exit {r.returncode}: {events} {r.stderr[-1500:]}")

# The same path, prepared again from fewer documents.
sub = os.path.join(work, "sub")
os.makedirs(sub)
for f in sorted(os.listdir(moby))[:100]:
    shutil.copy(os.path.join(moby, f), sub)
subprocess.run([st, "prepare-data", "-t", tok, "-i", sub, "-o", os.path.join(work, "sub.h5"), "--validation-fraction", "0.05",
                "--log-level", "warn"], check=True)
moved = os.path.join(work, "moved.h5")
shutil.copy(ds, moved)
first = train("reprepared", "--schedule.max_steps", "4", data=moved)
shutil.copy(os.path.join(work, "sub.h5"), moved)
r = train("reprepared", "--resume", "auto", data=moved)
check(first.returncode == 0 and r.returncode == 0 and f"{moved} held 17151 train samples of 64 tokens when the checkpoint "
      "was saved, and holds 6087 now (prepared again?)" in r.stderr,
      f"a dataset prepared again at its path is said: exit {first.returncode} {r.returncode}: {r.stderr[-1500:]}")

# The same path, prepared again from the same documents in another order: as many samples, other tokens in them.
orders = []
for k, names in enumerate((lambda i: f"{i:03}.txt", lambda i: f"{100 - i:03}.txt")):
    folder = os.path.join(work, f"order{k}")
    os.makedirs(folder)
    for i, f in enumerate(sorted(os.listdir(moby))[:40]):
        shutil.copy(os.path.join(moby, f), os.path.join(folder, names(i)))
    orders.append(os.path.join(work, f"order{k}.h5"))
    subprocess.run([st, "prepare-data", "-t", tok, "-i", folder, "-o", orders[-1], "--validation-fraction", "0",
                    "--log-level", "warn"], check=True)
reordered = os.path.join(work, "reordered.h5")
shutil.copy(orders[0], reordered)
first = train("reordered", "--schedule.max_steps", "4", "--schedule.eval_batches", "0", data=reordered)
shutil.copy(orders[1], reordered)
r = train("reordered", "--resume", "auto", "--schedule.eval_batches", "0", data=reordered)
check(first.returncode == 0 and r.returncode == 0 and f"{reordered} is not the file the checkpoint was trained on (then: "
      in r.stderr and " bytes, 136928 tokens in 40 documents, content fnv1a64:" in r.stderr and "train samples" not in r.stderr,
      f"a dataset prepared again from its documents reordered is said: exit {first.returncode} {r.returncode}: "
      f"{r.stderr[-1500:]}")

# The same data under another path: the uninterrupted run's step-4 checkpoint resumed on a copy of its dataset elsewhere
# (a dataset moved, or a relative data.path resumed from another folder). Before, it was said to be new data ("was
# trained on OLD:1; this run reads NEW:1: ... the samples that follow come from the new data") and recorded so.
copied = os.path.join(work, "copied", "moby.h5")
os.makedirs(os.path.dirname(copied))
shutil.copy(ds, copied)
copy_checkpoints("respelled", [4])
r = train("respelled", "--resume", "auto", data=copied)
events = [m for m in metrics("respelled") if m["kind"] == "resume_data_changed"]
check(r.returncode == 0 and "was trained on" not in r.stderr and "not the file" not in r.stderr and not events
      and losses("respelled") == {s: l for s, l in expected.items() if s > 4},
      f"the same dataset under another path resumes unremarked, with the uninterrupted run's losses: exit {r.returncode}, "
      f"events {events}: {r.stderr[-1500:]}")

# 4. The schedule edited between the save and the resume: the run follows the new one, and says so.
for key, value, said, lr in (("schedule.max_steps", "16", "the run's length in steps 8 (this run: 16)", "0.00286631"),
                             ("schedule.warmup_steps", "3", "schedule.warmup_steps 2 (this run: 3)", "0.00274217"),
                             ("optim.lr", "1e-2", "optim.lr 0.003 (this run: 0.01)", "0.007575")):
    name = "schedule_" + key.split(".")[1]
    r = train(name, "--resume", ckpt("whole", 4), "--" + key, value)
    check(r.returncode == 0 and f"the learning-rate schedule is not the saving run's ({said}): step 5 trains at lr {lr}, "
          "where the saving run's schedule had 0.002325" in r.stderr
          and f"{float(lr):.6g}" == f"{[m['lr'] for m in metrics(name) if m['kind'] == 'train'][0]:.6g}",
          f"resumed with {key} {value}: said, and the step's lr is the one said: exit {r.returncode}: {r.stderr[-1500:]}")
# Resumed past the new end (step 4 of 3): nothing trains, so no schedule is said (it named a step 5 at an lr).
r = train("schedule_past_end", "--resume", ckpt("whole", 4), "--schedule.max_steps", "3")
check(r.returncode == 0 and "no step left to take (at step 4 of 3)" in r.stderr and "learning-rate schedule" not in r.stderr,
      f"resumed past the run's end: no schedule said: exit {r.returncode}: {r.stderr[-1500:]}")
check("learning-rate schedule" not in same.stderr and "AdamW's settings" not in same.stderr,
      "an unchanged resume says nothing of the schedule or AdamW")
r = train("adamw", "--resume", ckpt("whole", 4), "--optim.beta2", "0.95", "--optim.weight_decay", "0")
check(r.returncode == 0 and "AdamW's settings are not the saving run's (optim.beta2 0.99 (this run: 0.95), "
      "optim.weight_decay 0.1 (this run: 0)): its moments are loaded as saved" in r.stderr,
      f"resumed with other betas and weight decay: said: exit {r.returncode}: {r.stderr[-1500:]}")

# 5. --resume PATH given a file, or a run directory.
consolidated = os.path.join(work, "whole4.h5")
subprocess.run([st, "consolidate", ckpt("whole", 4), "--output", consolidated, "--log-level", "warn"], check=True)
for what, path, hint in (("a consolidated file", consolidated, "use --checkpoint.init_from instead"),
                         ("a checkpoint's index", os.path.join(ckpt("whole", 4), "index.h5"),
                          f"the checkpoint is its folder, {ckpt('whole', 4)}")):
    r = train("file_" + what.split()[-1], "--resume", path)
    check(r.returncode == 5 and f"{path}: is a file; --resume takes a checkpoint folder" in r.stderr and hint in r.stderr,
          f"--resume {what}: exit 5 with the way on: exit {r.returncode}: {r.stderr[-1200:]}")
r = train("from_run_dir", "--resume", os.path.join(work, "whole"), "--schedule.max_steps", "10")
check(r.returncode == 0 and f"resumed from {ckpt('whole', 8)} at step 8" in r.stderr,
      f"--resume RUN_DIR takes its newest checkpoint: exit {r.returncode}: {r.stderr[-1200:]}")

# 6. A checkpoint that cannot be read now is no damage. A rank file held by a writer (an h5py session in 'a' mode:
# HDF5's exclusive flock) was "truncated or corrupt", and --resume auto set the intact checkpoint aside and trained its
# steps again; it stops instead (exit 5), naming the reason, and nothing is renamed. A DONE that is a symbolic link
# loop threw a file system error out of the listing (exit 8 everywhere, no fallback): the checkpoint is damaged now.
import fcntl  # noqa: E402

copy_checkpoints("held", [2, 4])
with open(os.path.join(ckpt("held", 4), "rank_00001.h5"), "rb") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    info = subprocess.run([st, "checkpoint", "info", ckpt("held", 4)], capture_output=True, text=True, timeout=120)
    r = train("held", "--resume", "auto")
reason = f"{ckpt('held', 4)}/rank_00001.h5: another process holds it open for writing"
check(info.returncode == 5 and reason in info.stderr and "truncated or corrupt" not in info.stderr,
      f"checkpoint info of a held checkpoint: exit {info.returncode}: {info.stderr[-1200:]}")
check(r.returncode == 5 and reason in r.stderr and "the checkpoint was not set aside" in r.stderr
      and sorted(os.listdir(os.path.join(work, "held", "checkpoints"))) == [".shardtrain.lock", "step_00000002", "step_00000004"],
      f"--resume auto past a held checkpoint stops, nothing set aside: exit {r.returncode}: {r.stderr[-1500:]}")
copy_checkpoints("done_loop", [2, 4])
os.remove(os.path.join(ckpt("done_loop", 4), "DONE"))
os.symlink("DONE", os.path.join(ckpt("done_loop", 4), "DONE"))
r = train("done_loop", "--resume", "auto")
check(r.returncode == 0 and f"{ckpt('done_loop', 4)}/DONE: is a symbolic link that leads back to itself" in r.stderr
      and os.path.isdir(ckpt("done_loop", 4) + ".damaged") and losses("done_loop") == {s: expected[s] for s in range(3, 9)},
      f"a DONE that loops: damaged, the run falls back: exit {r.returncode}: {r.stderr[-1500:]}")
# Every checkpoint damaged: exit 5, and the last one tried is said to be the oldest (it said "trying the one before it").
copy_checkpoints("all_damaged", [2, 4])
for s in (2, 4):
    open(os.path.join(ckpt("all_damaged", s), "DONE"), "w").write("not json")
r = train("all_damaged", "--resume", "auto")
check(r.returncode == 5 and f"{ckpt('all_damaged', 4)} does not load, trying the one before it" in r.stderr
      and f"{ckpt('all_damaged', 2)} does not load, and it was the oldest" in r.stderr
      and f"{ckpt('all_damaged', 2)} does not load, trying" not in r.stderr,
      f"every checkpoint damaged: exit {r.returncode}: {r.stderr[-1500:]}")
info = subprocess.run([st, "checkpoint", "info", os.path.join(work, "whole", "checkpoints")], capture_output=True, text=True,
                      timeout=120)
# A folder of checkpoints is shown by its newest complete one, as consolidate takes it (docs/checkpoints.md).
check(info.returncode == 0 and f"a folder of checkpoints; its newest complete one is {ckpt('whole', 8)}" in info.stderr
      and ", step 8, saved by" in info.stdout, f"checkpoint info of a folder of checkpoints: {info.stdout[:300]} {info.stderr[-800:]}")

check.finish("resume audit: damaged DONE markers and mixed rank files fall back or are refused; changed data settings and schedules are said; files refused with the way on")
