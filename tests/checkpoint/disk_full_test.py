#!/usr/bin/env python3
"""A checkpoint directory on a file system that fills up, for real: a 5 MiB tmpfs mounted for the test, where a
checkpoint of the test model takes about 1.9 MB (2.0 MB estimated).

- keep_last 0 (keep all): the saves of steps 2 and 4 fit; step 6's does not, so nothing is written, the run
  says so and trains on (metrics.jsonl records it); step 8's does not fit either, nor does the final save that
  tries it again, and the run ends with exit code 8 naming the directory and the space. Steps 2 and 4 stay complete, no .tmp is left.
- keep_last 2: at step 6 the save first removes step 2 (which its rotation would remove anyway), then writes;
  the same at step 8; the run ends normally with steps 6 and 8. Then `consolidate` onto the full disk: exit 8 naming
  "No space left on device", nothing left behind.
- A size limit instead (ulimit -f: each write past it fails with EFBIG, whatever the free space), with
  asynchronous saves and checkpoint.max_failed_saves 1: the first failed save is survived, the second ends the
  run with exit code 8 and the kernel's reason.

- Inodes: a tmpfs with 13 inodes holds the lock and exactly two checkpoints: keep_last 2 removes the oldest before
  each save, as for bytes, and the run ends normally; `shardtrain check` says "room for 2 (inodes limit it", with the
  run's own words for the checkpoint; with 4 inodes it fails (8) naming the lock file and "No space left on device",
  for the checkpoint directory and for the run directory.

Needs root, to mount the tmpfs; exits 77 (skipped) where mounting is not allowed."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 600, "moby-bpe600", 0.05)

mnt = os.path.join(work, "small-disk")
os.makedirs(mnt)
if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", mnt]).returncode != 0:
    print("SKIPPED: cannot mount a tmpfs here (needs root and mount rights)")
    sys.exit(77)

MODEL = ["--model.vocab_size", "600", "--model.hidden_size", "64", "--model.intermediate_size", "128",
         "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
         "--data.seq_len", "64", "--data.global_batch_size", "8", "--schedule.warmup_steps", "2", "--schedule.eval_every", "0",
         "--schedule.max_steps", "8", "--checkpoint.every_n_steps", "2", "--logging.progress", "lines", "--logging.peak_flops", "1e10"]


def train(name, ckpt_dir, *extra, limit_kib=None):
    env = dict(os.environ)
    # The size limit holds for the ranks only (bash's ulimit -f counts KiB), and MPI talks over TCP: its
    # shared-memory transport's backing files are larger than the limit.
    wrap = ["bash", "-c", f"ulimit -f {limit_kib} && exec \"$@\"", "bash"] if limit_kib else []
    if limit_kib:
        env["OMPI_MCA_btl"] = "tcp,self"
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", *wrap, st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds,
           "--logging.run_dir", os.path.join(work, name), "--checkpoint.dir", ckpt_dir, *MODEL, *extra]
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=300)


def events(name, kind):
    return [l for l in map(json.loads, open(os.path.join(work, name, "metrics.jsonl"))) if l["kind"] == kind]


def contents(path):
    return sorted(n for n in os.listdir(path) if n != ".shardtrain.lock") if os.path.isdir(path) else []


try:
    # keep_last 0: two checkpoints fit, the third does not.
    keep_all = os.path.join(mnt, "keep_all")
    r = train("keep_all", keep_all, "--checkpoint.keep_last", "0")
    check(r.returncode == 8 and f"{keep_all}: not enough space for the checkpoint of step 8" in r.stderr,
          f"the final save does not fit: exit {r.returncode}: {r.stderr[-2500:]}")
    check("the save of step 6 failed, training goes on" in r.stderr and "not enough space for the checkpoint of step 6" in r.stderr,
          f"step 6's save is refused and training goes on: {r.stderr[-2500:]}")
    check(contents(keep_all) == ["step_00000002", "step_00000004"], f"left in {keep_all}: {contents(keep_all)}")
    check("HDF5-DIAG" not in r.stderr, f"no HDF5 error dump when the disk is full: {r.stderr[-2500:]}")
    failed = events("keep_all", "checkpoint_failed")
    # Step 8's periodic save fails too (recorded), then the final save tries once more and ends the run: recorded as well,
    # said as such (not "training goes on") and naming the checkpoint to resume from (audit Q7).
    check([f["save_step"] for f in failed] == [6, 8, 8] and "not enough space" in failed[0]["error"], f"metrics: {failed}")
    check("the save of step 8 failed; the run's final save tries it once more" in r.stderr
          and f"the final save of step 8 failed; the newest checkpoint is {keep_all}/step_00000004 (--resume auto continues "
          "from it)" in r.stderr and "the save of step 8 failed, training goes on" not in r.stderr,
          f"the final save's failure: {r.stderr[-2500:]}")
    check(max(l["step"] for l in events("keep_all", "train")) == 8, "training went on to step 8")
    subprocess.run(["rm", "-rf", keep_all])

    # keep_last 2: the save makes room by removing what its rotation would remove.
    keep_two = os.path.join(mnt, "keep_two")
    r = train("keep_two", keep_two, "--checkpoint.keep_last", "2")
    check(r.returncode == 0 and contents(keep_two) == ["step_00000006", "step_00000008"],
          f"keep_last 2: exit {r.returncode}, left {contents(keep_two)}: {r.stderr[-2500:]}")
    check("removing " + os.path.join(keep_two, "step_00000002") + " before the save instead of after it" in r.stderr,
          f"room made before the save: {r.stderr[-2500:]}")
    check(not events("keep_two", "checkpoint_failed"), "no failed save with keep_last 2")

    # consolidate onto the disk once it is full: exit 8 with the file system's reason, for HDF5 and for safetensors
    # (it said "cannot write dataset 'lm_head.weight'" and "cannot write", no reason), and nothing left behind.
    subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/filler", "bs=64k"], capture_output=True)
    for fmt_, out in (("hdf5", "model.h5"), ("safetensors", "hf")):
        c = subprocess.run([st, "consolidate", os.path.join(keep_two, "step_00000008"), "-o", os.path.join(mnt, out), "--format", fmt_],
                           capture_output=True, text=True, timeout=300)
        check(c.returncode == 8 and "No space left on device" in c.stderr and not any(n.startswith(out) for n in os.listdir(mnt)),
              f"consolidate to {fmt_} on a full disk: exit {c.returncode}, left {os.listdir(mnt)}: {c.stderr[-1500:]}")
    # With room for config.json but not the tokenizer it ships: the same reason (std::filesystem::copy_file said
    # "Input/output error" of a full disk).
    os.remove(os.path.join(mnt, "filler"))
    free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
    room = max(8192, os.path.getsize(tok) // 2)
    subprocess.run(["fallocate", "-l", str(free - room), os.path.join(mnt, "filler")], check=True)
    c = subprocess.run([st, "consolidate", os.path.join(keep_two, "step_00000008"), "-o", os.path.join(mnt, "hf-tok"), "--format",
                        "safetensors", "--tokenizer", tok], capture_output=True, text=True, timeout=300)
    check(c.returncode == 8 and "cannot write the tokenizer: No space left on device" in c.stderr
          and not any(n.startswith("hf-tok") for n in os.listdir(mnt)),
          f"consolidate with its tokenizer on a nearly full disk: exit {c.returncode}, left {os.listdir(mnt)}: {c.stderr[-1500:]}")
    os.remove(os.path.join(mnt, "filler"))
    subprocess.run(["rm", "-rf", keep_two])
finally:
    subprocess.run(["umount", mnt])

# A file size limit: the space is there, the writes fail anyway (EFBIG), on both ranks' files.
limited = os.path.join(work, "limited-ckpt")
r = train("limited", limited, "--checkpoint.async_save", "true", "--checkpoint.max_failed_saves", "1", limit_kib=256)
check(r.returncode == 8 and "2 save(s) in a row failed (checkpoint.max_failed_saves = 1)" in r.stderr and "File too large" in r.stderr,
      f"writes over the size limit: exit {r.returncode}: {r.stderr[-2500:]}")
check(contents(limited) == [], f"nothing left behind in {limited}: {contents(limited)}")
# One line per failure: HDF5's own error-stack dump stays off in every thread, the asynchronous saver's too.
check("HDF5-DIAG" not in r.stderr, f"no HDF5 error dump: {r.stderr[-2500:]}")
# Each failure is recorded, the one that ends the run too; its message is said once, not nested in itself (audit Q5: "5
# save(s) in a row failed ... the last: checkpoint: 4 save(s) in a row failed ...").
check([f["save_step"] for f in events("limited", "checkpoint_failed")] == [2, 4] and "the last: checkpoint:" not in r.stderr,
      f"metrics: {events('limited', 'checkpoint_failed')}: {r.stderr[-1500:]}")

# Inodes (audit Q2, Q4, Q8): a tmpfs with bytes to spare and 13 inodes: its root, the checkpoint directory, its lock
# and two checkpoints of 5 (two rank files, index.h5, DONE, the directory). keep_last 2 needs exactly that: each save
# first removes the checkpoint its rotation would remove anyway, as for bytes (every save from step 6 on failed with
# "cannot create the checkpoint directory: No space left on device", and the run ended with exit 8).
few = os.path.join(work, "few-inodes")
os.makedirs(few)
if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=50m,nr_inodes=13", "tmpfs", few]).returncode != 0:
    print("SKIPPED: cannot mount a tmpfs with an inode limit here")
    sys.exit(77)
try:
    ck = os.path.join(few, "ckpt")
    # `shardtrain check` for the run's world sizes a checkpoint as the run does, and says what limits the room.
    c = subprocess.run([st, "check", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir",
                        os.path.join(work, "inodes"), "--checkpoint.dir", ck, "--checkpoint.keep_last", "2",
                        "--nodes", "1", "--gpus-per-node", "2", *MODEL], cwd=args.source, capture_output=True, text=True, timeout=120)
    space = " ".join(l for l in c.stdout.splitlines() if l.strip().startswith("space"))
    check(c.returncode == 0 and "and 5 inodes" in space and "room for 2 (inodes limit it" in space, f"check, 13 inodes: {c.stdout}")
    r = train("inodes", ck, "--checkpoint.keep_last", "2")
    check(r.returncode == 0 and contents(ck) == ["step_00000006", "step_00000008"],
          f"keep_last 2 with inodes for 2: exit {r.returncode}, left {contents(ck)}: {r.stderr[-2500:]}")
    check("0 inode(s) free in " + ck in r.stderr and "removing " + os.path.join(ck, "step_00000002") + " before the save" in r.stderr,
          f"room made before the save by inodes: {r.stderr[-2500:]}")
    check(not events("inodes", "checkpoint_failed"), "no failed save with inodes for keep_last 2")
    # The start line sizes the checkpoint in check's words (the free inodes differ: the run made its directory and lock).
    start = [l for l in r.stderr.splitlines() if "checkpoint: a checkpoint takes" in l]
    said = space[space.find("a checkpoint takes"):space.find("its directory)")]
    check(start and said and said in start[0], f"check and train size the checkpoint alike: {said!r} / {start}")
    subprocess.run(["rm", "-rf", ck])
    subprocess.run(["umount", few])
    # Too few inodes for the lock and a checkpoint: check fails (8) with the file system's reason, as the run would.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=50m,nr_inodes=4", "tmpfs", few], check=True)
    c = subprocess.run([st, "check", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir",
                        os.path.join(work, "inodes4"), "--checkpoint.dir", ck, *MODEL], cwd=args.source, capture_output=True,
                       text=True, timeout=120)
    outputs = " ".join(l for l in c.stdout.splitlines() if l.strip().startswith("outputs"))
    check(c.returncode == 8 and "FAILED: I/O error: checkpoint.dir: cannot create its lock file" in outputs and
          "No space left on device" in outputs, f"check, 4 inodes: exit {c.returncode}: {c.stdout}")
    # A run directory with inodes for less than its lock, config.toml, metrics.jsonl and events file: the same.
    c = subprocess.run([st, "check", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir",
                        os.path.join(few, "run"), "--checkpoint.dir", os.path.join(work, "inodes-ck"), *MODEL], cwd=args.source,
                       capture_output=True, text=True, timeout=120)
    outputs = " ".join(l for l in c.stdout.splitlines() if l.strip().startswith("outputs"))
    check(c.returncode == 8 and "logging.run_dir: cannot create its lock file, config.toml" in outputs and
          "No space left on device" in outputs, f"check, run dir with 3 inodes free: exit {c.returncode}: {c.stdout}")
    # One inode short of result.json (the folder, its lock, config.toml, metrics.jsonl and the events file fit): check
    # counts it and fails, where it said ok and the run finished without the result job scripts read; one more, and
    # the run writes it.
    for inodes, ok in ((6, False), (7, True)):
        subprocess.run(["umount", few])
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=50m,nr_inodes={inodes}", "tmpfs", few], check=True)
        argv = ["--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir", os.path.join(few, "run"),
                "--checkpoint.dir", os.path.join(work, f"result-ck-{inodes}"), *MODEL]
        c = subprocess.run([st, "check", *argv], cwd=args.source, capture_output=True, text=True, timeout=120)
        outputs = " ".join(l for l in c.stdout.splitlines() if l.strip().startswith("outputs"))
        if not ok:
            check(c.returncode == 8 and "result.json" in outputs, f"check, {inodes} inodes: exit {c.returncode}: {c.stdout}")
            continue
        r = subprocess.run([st, "train", *argv], cwd=args.source, capture_output=True, text=True,
                           timeout=300)
        check(c.returncode == 0 and r.returncode == 0 and os.path.isfile(os.path.join(few, "run", "result.json")),
              f"check and a run, {inodes} inodes: exit {c.returncode} and {r.returncode}: {c.stdout} {r.stderr[-1200:]}")
finally:
    subprocess.run(["umount", few])

check.finish("all disk-full checks passed")
