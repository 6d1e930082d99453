#!/usr/bin/env python3
"""Bad input and unlucky handling get one clear line and a documented exit code (issue 36, items 6-10):
model sizes that overflow or cannot fit memory (3, before anything is allocated), values that must be finite or
in range (3 for config keys, 2 for options), an unknown command, --ranks-per-node and SHARDTRAIN_RANKS_PER_NODE,
a folder that is no checkpoint against a save that did not finish (5), a save that runs out of inodes (the
run survives; the final save's exit 8 names "No space left on device"), SIGTERM and Ctrl-C through
jobs/launch.sh (75: saved and stopped; also the instant the launch begins), and `generate` and `evaluate` of a run made elsewhere with relative
paths (found below the run's own folder), `generate` saying where the context ends.
Each case is one process that fails before any work, but for four tiny training runs; then the dataset as a run
meets it: after a user block (the same losses), held by a writer's lock, truncated in place mid-run (exit 4, not SIGBUS)."""
import json
import os
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

# A "project" folder where everything is made with paths relative to it, as a user's shell would.
proj = os.path.join(work, "proj")
os.makedirs(proj)
for cmd in (["tokenizer", "train", "--input", moby, "--vocab-size", "512", "--output", "tok.json"],
            ["prepare-data", "-t", "tok.json", "-i", moby, "-o", "data.h5", "--validation-fraction", "0.05"]):
    subprocess.run([st, *cmd, "--log-level", "warn"], check=True, cwd=proj)
ds = os.path.join(proj, "data.h5")
MODEL = ["--model.vocab_size", "512", "--model.hidden_size", "64", "--model.intermediate_size", "128",
         "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
         "--model.max_position_embeddings", "96", "--data.seq_len", "64", "--data.global_batch_size", "4",
         "--schedule.warmup_steps", "1", "--schedule.eval_every", "0", "--logging.progress", "lines", "--logging.peak_flops", "1e10"]


def run(cmd, np=None, cwd=None, env_extra=None, timeout=300):
    env = dict(os.environ)
    env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
    env.update(env_extra or {})
    full = [args.mpiexec, "--oversubscribe", "-np", str(np), st, *cmd] if np else [st, *cmd]
    p = subprocess.run(full, capture_output=True, text=True, errors="replace", timeout=timeout, env=env, cwd=cwd or args.source)
    return p.returncode, p.stdout, p.stderr


def expect(what, result, code, *needles, absent=()):
    rc, out, err = result
    lines = [l for l in err.splitlines() if needles and needles[0] in l]
    check(rc == code and all(n in err for n in needles) and not any(a in err for a in absent),
          f"{what}: exit {rc} (expected {code}) naming {needles}: {err[-800:]}")
    check(len(lines) == 1, f"{what}: expected one line with '{needles[0] if needles else ''}', got {len(lines)}")


train = ["train", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.runs_root", os.path.join(work, "runs")]

# 6. Sizes that overflow or cannot fit: refused by key before any allocation (no std::bad_alloc, no shape error).
expect("num_hidden_layers 1e12", run([*train, "--model.num_hidden_layers", "1000000000000"], np=1), 3,
       "model.num_hidden_layers: 1000000000000 is beyond the 65536 layers", absent=("bad_alloc", "internal error"))
expect("intermediate_size 2^62", run([*train, "--model.intermediate_size", str(2**62)], np=1), 3,
       f"model.intermediate_size = {2**62}: the model would have", "parameters, more than the 2^50", absent=("internal error",))
expect("max_position_embeddings 2^62", run([*train, "--model.max_position_embeddings", str(2**62)], np=1), 3,
       "model.max_position_embeddings", "int32 positions", absent=("internal error",))
expect("num_hidden_layers 100000", run([*train, "--model.num_hidden_layers", "100000", "--print-config"], np=1), 3,
       "model.num_hidden_layers: 100000 is beyond the 65536 layers")
# 60,000 layers of tiny-cpu: 3.6e10 parameters, 268 GiB of state per rank over 2 ranks, more than a test machine has:
# refused before the Trainer builds anything (this was an OOM kill).
expect("num_hidden_layers 60000", run([*train, "--model.num_hidden_layers", "60000"], np=2), 3,
       "model.num_hidden_layers = 60000", "per rank over 2 shard rank(s)", absent=("bad_alloc", "internal error"))
# plan and check build the model's description layer by layer: the same sizes are refused first.
expect("plan --layers 1e12", run(["plan", "--layers", "1000000000000", "--nodes", "1", "--gpus-per-node", "8"]), 3,
       "model.num_hidden_layers: 1000000000000 is beyond", absent=("bad_alloc",))
rc, out, err = run(["check", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--model.num_hidden_layers", "100000000",
                    "--nodes", "1", "--gpus-per-node", "8", "--gpu-memory", "80GiB"])
check(rc == 3 and "config     FAILED: configuration error: model.num_hidden_layers: 100000000 is beyond" in out,
      f"check with 1e8 layers: exit {rc} (expected 3, the key named in its config line): {out[-500:]} {err[-500:]}")

# 7. Values that were accepted silently.
for value in ("inf", "nan", "-inf"):
    expect(f"optim.lr {value}", run([*train, "--optim.lr", value, "--print-config"], np=1), 3, "optim.lr", "finite")
rc, out, err = run([*train, "--optim.lr", "1e39", "--print-config"], np=1)
check(rc == 0 and "lr = 1e+39" in out, f"a finite lr, however large, stays accepted (tests use 1e39 to diverge): exit {rc}: {err[-300:]}")
expect("collective_timeout -1", run([*train, "--fsdp.collective_timeout", "-1", "--print-config"], np=1), 3,
       "fsdp.collective_timeout", "got -1")
expect("consolidate --max-shard-gib -1", run(["consolidate", work, "--output", os.path.join(work, "never"), "--format",
                                              "safetensors", "--max-shard-gib", "-1"]), 2, "--max-shard-gib -1")
expect("consolidate --max-shard-gib with hdf5", run(["consolidate", work, "--output", os.path.join(work, "never.h5"),
                                                     "--max-shard-gib", "1"]), 2,
       "--max-shard-gib: only with --format safetensors")
check(not os.path.exists(os.path.join(work, "never")) and not os.path.exists(os.path.join(work, "never.h5")),
      "a refused consolidate writes nothing")
expect("prepare-data into a missing folder", run(["prepare-data", "-t", os.path.join(proj, "tok.json"), "-i", moby, "-o",
                                                  os.path.join(work, "no-such-folder", "x.h5")]), 2, "no-such-folder", "does not exist")
check(not os.path.exists(os.path.join(work, "no-such-folder")), "prepare-data made no folder")

# 8. Words that said the wrong thing.
expect("unknown command", run(["trian", "--config", "x"]), 2, "unknown command 'trian'", "train")
for flag in ("0", "-3", "100000000000000000000"):
    r = run(["--ranks-per-node", flag, "env"])
    expect(f"--ranks-per-node {flag}", r, 2, f"--ranks-per-node {flag}: expected a number of ranks per node from 1 to 4096")
    check(len(r[2]) < 300, f"--ranks-per-node {flag}: a short message, got {len(r[2])} characters")
expect("SHARDTRAIN_RANKS_PER_NODE=0", run(["env"], env_extra={"SHARDTRAIN_RANKS_PER_NODE": "0"}), 2,
       "SHARDTRAIN_RANKS_PER_NODE='0': expected a number of ranks per node from 1 to 4096", absent=("--ranks-per-node",))
expect("SHARDTRAIN_RANKS_PER_NODE=two", run(["env"], env_extra={"SHARDTRAIN_RANKS_PER_NODE": "two"}), 2,
       "SHARDTRAIN_RANKS_PER_NODE='two'")
# Counts of other commands: bounded ranges, short messages (CLI11's PositiveNumber printed a 300-digit bound).
for cmd, needle in ((["plan", "--nodes", "0", "--gpus-per-node", "8"], "--nodes: Value 0 not in range 1 to 1073741824"),
                    (["plan", "--nodes", "1", "--gpus-per-node", "8", "--micro-batch", "-1"], "--micro-batch: Value -1 not in range 1"),
                    (["plan", "--nodes", "1", "--gpus-per-node", "8", "--seq", "0"], "--seq: Value 0 not in range 1"),
                    (["prepare-data", "-t", "x", "-i", "y", "-o", "z", "--threads", "-1"], "--threads: Value -1 not in range 0 to 65536")):
    r = run(cmd)
    expect(" ".join(cmd), r, 2, needle, absent=("internal error",))
    check(len(r[2]) < 300, f"{' '.join(cmd)}: a short message, got {len(r[2])} characters")
empty = os.path.join(work, "not-a-checkpoint")
os.makedirs(empty)
open(os.path.join(empty, "notes.txt"), "w").write("hello\n")
expect("checkpoint info on a plain folder", run(["checkpoint", "info", empty]), 5, "not a checkpoint", absent=("did not finish",))

# A tiny run in the project folder, every path relative to it: checkpoints at steps 2 and 4.
rc, out, err = run(["train", "--config", os.path.join(args.source, "configs/tiny-cpu.toml"), "--data.path", "data.h5",
                    "--logging.run_dir", "runs/r", *MODEL, "--schedule.max_steps", "4", "--checkpoint.every_n_steps", "2"],
                   np=1, cwd=proj)
check(rc == 0, f"the tiny run: exit {rc}: {err[-1500:]}")
ckpts = os.path.join(proj, "runs/r/checkpoints")
step4 = os.path.join(ckpts, "step_00000004")

# A step folder without DONE is a save that did not finish; a folder of such, none complete, says so.
half = os.path.join(work, "half", "step_00000004")
shutil.copytree(step4, half)
os.remove(os.path.join(half, "DONE"))
expect("checkpoint info, no DONE", run(["checkpoint", "info", half]), 5, "the save did not finish")
expect("consolidate a folder of unfinished saves", run(["consolidate", os.path.dirname(half), "--output", os.path.join(work, "c.h5")]),
       5, "none complete")
# A save in progress (its temporary folder, nothing written yet) is said alike by every reader: generate and evaluate
# called it "not a checkpoint, a directory of checkpoints, or a Hugging Face directory".
in_progress = os.path.join(work, "half", "step_00000006.tmp-4242-0badf00d")
os.makedirs(in_progress)
for what, argv in (("checkpoint info", ["checkpoint", "info", in_progress]),
                   ("generate", ["generate", "--checkpoint", in_progress, "--prompt", "The", "--max-tokens", "2"]),
                   ("evaluate", ["evaluate", "-w", in_progress, "--data.path", os.path.join(proj, "data.h5")])):
    expect(f"{what} of a save in progress", run(argv), 5, "no DONE marker: the save did not finish (still being written")

# 10. From outside the project: the recorded tokenizer and dataset are found below the run's own folder.
elsewhere = os.path.join(work, "elsewhere")
os.makedirs(elsewhere)
rc, out, err = run(["generate", "--checkpoint", ckpts, "--prompt", "Call me", "--max-tokens", "1000000"], cwd=elsewhere)
check(rc == 0 and out.startswith("Call me"), f"generate from another folder: exit {rc}: {err[-800:]}")
warn = [l for l in err.splitlines() if "--max-tokens 1000000" in l]
check(len(warn) == 1 and "max_position_embeddings = 96" in warn[0], f"generate names the context it stops at: {err[-800:]}")
m = [l.split("generate: ")[1].split() for l in err.splitlines() if "prompt + " in l]
check(m and int(m[0][0]) + int(m[0][3]) == 96, f"generate stops at the 96 positions: {m}")
rc, out, err = run(["consolidate", ckpts, "--output", "export", "--format", "safetensors"], cwd=elsewhere)
check(rc == 0 and os.path.isfile(os.path.join(elsewhere, "export", "tokenizer.json")),
      f"consolidate from another folder ships the run's tokenizer: exit {rc}: {out[-300:]} {err[-500:]}")
rc, out, err = run(["evaluate", "--weights", step4, "--batches", "1"], np=1, cwd=elsewhere)
check(rc == 0 and "bits per byte" in out and "no bits per byte" not in err, f"evaluate from another folder: exit {rc}: {out[-500:]} {err[-800:]}")

# 8. A save that finds no inode left: the periodic save fails and the run trains on; the final one ends the
# run with exit 8, and both say why (since 2026-11-30 the save counts the inodes it needs first: "not enough inodes",
# where the kernel's "No space left on device" came from the first file it could not create).
mnt = os.path.join(work, "no-inodes")
os.makedirs(mnt)
if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,nr_inodes=3", "tmpfs", mnt]).returncode != 0:
    print("no-inode case skipped: cannot mount a tmpfs here (needs root and mount rights)")
else:
    try:
        rc, out, err = run(["train", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir", os.path.join(work, "inodes"),
                            "--checkpoint.dir", mnt, *MODEL, "--schedule.max_steps", "4", "--checkpoint.every_n_steps", "2"], np=1)
        check(rc == 8 and f"{mnt}: not enough inodes for the checkpoint of step 2: 1 free, it takes 4" in err
              and "the final save of step 4 failed; there is no checkpoint yet" in err and "is it writable" not in err,
              f"no inode left: exit {rc} (expected 8), the inodes counted at each save: {err[-1500:]}")
    finally:
        subprocess.run(["umount", mnt])

# 9. SIGTERM or Ctrl-C to a run started through jobs/launch.sh: the ranks save and stop, the status is 75. The run
# is long and saves only when stopped, so that how fast this machine trains decides nothing (500 steps and the
# periodic saves once made the signal arrive after the first save on a quiet machine).
launch = os.path.join(args.source, "jobs/launch.sh")


def interrupted(name, send, code=75, through=(launch,)):
    run_dir = os.path.join(work, name)
    cmd = [*through, args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds,
           "--logging.run_dir", run_dir, *MODEL, "--schedule.max_steps", "100000", "--checkpoint.every_n_steps", "0",
           "--checkpoint.dir", os.path.join(run_dir, "ckpt")]
    p = subprocess.Popen(cmd, cwd=args.source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    metrics, deadline = os.path.join(run_dir, "metrics.jsonl"), time.time() + 120
    while time.time() < deadline and (not os.path.exists(metrics) or sum(1 for _ in open(metrics)) < 2):
        time.sleep(0.05)
    send(p)
    if p.stdout.closed:  # its reader gone (below)
        p.wait(timeout=120)
        out = ""
    else:
        out = p.communicate(timeout=120)[0].decode(errors="replace")
    result = json.load(open(os.path.join(run_dir, "result.json"))) if os.path.exists(os.path.join(run_dir, "result.json")) else {}
    # The checkpoints (the directory also holds the run's lock file, .shardtrain.lock).
    saved = ([f for f in os.listdir(os.path.join(run_dir, "ckpt")) if f.startswith("step_")]
             if os.path.isdir(os.path.join(run_dir, "ckpt")) else [])
    check(p.returncode == code and result.get("status") == "preempted" and len(saved) == 1,
          f"{name}: exit {p.returncode} (expected {code}), result {result}, checkpoints {saved}: {out[-1500:]}")
    return out


# Plain mpirun saves and stops too, but exits 1 (docs/exit-codes.md, "Signals to mpirun"): the run's line says so.
out = interrupted("sigterm-plain", lambda p: os.kill(p.pid, signal.SIGTERM), code=1, through=())
check("start it through jobs/launch.sh" in out, f"the stop line points to jobs/launch.sh: {out[-800:]}")
interrupted("sigterm", lambda p: os.kill(p.pid, signal.SIGTERM))
interrupted("ctrl-c", lambda p: os.killpg(p.pid, signal.SIGINT))  # a terminal's Ctrl-C reaches the whole foreground group


# `launch.sh ... 2>&1 | tee log` and Ctrl-C: tee goes first (its end of the pipe closed here), and launch.sh died of
# SIGPIPE writing its "received" line, before it passed the stop on (141; the job trained on unseen).
def reader_gone_then_ctrl_c(p):
    p.stdout.close()
    os.killpg(p.pid, signal.SIGINT)


interrupted("ctrl-c-tee-gone", reader_gone_then_ctrl_c)

# The same stop as soon as the launch begins: the ranks cannot catch it until their binary and its libraries are
# loaded (about 0.2 s), and mpirun forwarded it to ranks not yet started, or not yet catching it (138, no
# result.json). launch.sh holds it until every rank catches SIGUSR1, then passes it on: the start stops with 75.
for delay in (0.02, 0.15):
    run_dir = os.path.join(work, f"stop-at-launch-{delay}")
    p = subprocess.Popen([launch, args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml",
                          "--data.path", ds, "--logging.run_dir", run_dir, *MODEL, "--schedule.max_steps", "100000",
                          "--checkpoint.every_n_steps", "0"],
                         cwd=args.source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    time.sleep(delay)
    os.kill(p.pid, signal.SIGTERM)
    out = p.communicate(timeout=120)[0].decode(errors="replace")
    result_path = os.path.join(run_dir, "result.json")
    result = json.load(open(result_path)) if os.path.exists(result_path) else {}
    check(p.returncode == 75 and result.get("status") == "preempted",
          f"SIGTERM {delay} s into jobs/launch.sh: exit {p.returncode} (expected 75), result {result}: {out[-1500:]}")

# The dataset as a run meets it (docs/data.md, "HDF5 layout").
import fcntl  # noqa: E402


def train_on(path, name, steps=3, env_extra=None):
    return run(["train", "--config", "configs/tiny-cpu.toml", "--data.path", path, "--logging.run_dir", os.path.join(work, name),
                *MODEL, "--schedule.max_steps", str(steps), "--checkpoint.every_n_steps", "0"], np=2, env_extra=env_extra)


def losses(name):
    return [e["loss"] for e in map(json.loads, open(os.path.join(work, name, "metrics.jsonl"))) if e["kind"] == "train"]


# A valid HDF5 file with a user block (512 bytes in front, as h5jam writes): its tokens were mapped 512 bytes off and
# every run refused it as damaged ("tokens [0, 1048576) do not match their checksum", exit 4); the same losses now.
blocked = os.path.join(work, "user-block.h5")
with open(blocked, "wb") as f:
    f.write(bytes(512) + open(ds, "rb").read())
rc_plain, rc_blocked = train_on(ds, "plain")[0], train_on(blocked, "blocked")[0]
check(rc_plain == 0 and rc_blocked == 0 and len(losses("plain")) == 3 and losses("blocked") == losses("plain"),
      f"a dataset after a user block trains as the dataset: exits {rc_plain}, {rc_blocked}")
# Held open for writing by another process (HDF5's exclusive lock, an h5py session in 'a' mode): it said "truncated
# or corrupt file?".
with open(ds, "rb") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    expect("a dataset a writer holds", train_on(ds, "locked"), 4, f"data error: {ds}: another process holds it open for writing",
           absent=("truncated or corrupt",))
# Truncated in place while the run reads it (a `cp` onto it starts so): the ranks died of SIGBUS (mpirun 135, no file
# named). The loader is idle for all but microseconds of each slowed step, when the cut lands.
victim = os.path.join(work, "victim.h5")
shutil.copyfile(ds, victim)
run_dir = os.path.join(work, "cut")
env = dict(os.environ, SHARDTRAIN_FAULT="slow_step:200")
env.pop("SHARDTRAIN_RANKS_PER_NODE", None)
p = subprocess.Popen([args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", "configs/tiny-cpu.toml", "--data.path",
                      victim, "--logging.run_dir", run_dir, *MODEL, "--schedule.max_steps", "100000", "--checkpoint.every_n_steps", "0"],
                     cwd=args.source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
metrics, deadline = os.path.join(run_dir, "metrics.jsonl"), time.time() + 120
while time.time() < deadline and (not os.path.exists(metrics) or sum(1 for _ in open(metrics)) < 2):
    time.sleep(0.05)
size = os.path.getsize(victim)
os.truncate(victim, 4096)
out = p.communicate(timeout=120)[0].decode(errors="replace")
check(p.returncode == 4 and f"data error: {victim}: the file was rewritten in place while this run reads it ({size} bytes, now 4096)" in out
      and "Bus error" not in out, f"a dataset truncated under the run: exit {p.returncode} (expected 4): {out[-1500:]}")

check.finish("bad_input_test: all checks passed")
