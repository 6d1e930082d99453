#!/usr/bin/env python3
"""A run never mixes its checkpoints with another run's (hostile audit A, F1 F2 F4 F5 F6 F8 F10 F11 F12), through the
binary on 2 ranks:
1. A fresh run in a directory holding complete checkpoints is refused (exit 5) and touches none of them; `check`
   says the same. A run branched from an older checkpoint renames the newer ones *.superseded (never deleted), and
   its own saves are its last checkpoint, not the other run's. A run resumed from a checkpoint elsewhere sets aside
   every one there, older ones too; the rotation removes only what a save wrote (a user's files stay, moved aside).
2. A second run on a checkpoint directory that a running one holds is refused (exit 5, naming the holder), and one
   with a checkpoint directory of its own in the running one's run directory too (exit 3: that directory is held as
   well); the running one's save goes to a temporary directory of its own name and publishes intact. 2b: a checkpoint
   directory removed mid-run is locked again by the next save, and a second run is still refused. 2c: one moved
   mid-run is said to be moved, and where. 2d: the run directory removed mid-run is made again and locked again at
   the next step (config.toml, metrics from there on), and a second run is refused.
3. SIGUSR1 during the start-up (before the first step): exit 75, result.json "preempted", nothing saved, and the
   message names the run directory to resume; the same when it comes as soon as a rank catches it (before MPI_Init).
4. checkpoint.dir that is a file: exit 8 at start, before any step.
5. A user's files in step_N.tmp and an incomplete step_N are never deleted by a save: the latter is moved aside.
6. `check --resume auto --verify-checkpoint` past a damaged newest checkpoint: exit 0, naming the one the run uses.
7. `--resume auto` in a generated run directory warns loudly and names the earlier run's directory.
8. A resumed run with nothing left: result.json's last_checkpoint is the one it resumed from, last_loss null.
9. init_from a checkpoint of another tokenizer: refused like --resume (exit 5)."""
import fcntl
import json
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
st = args.shardtrain
corpus = clitest.corpus(args, "moby-dick")
tok, ds = clitest.prepare_dataset(args, corpus, work, 512, "moby-bpe512", 0.05)

BASE = {"model.vocab_size": "600", "model.hidden_size": "64", "model.intermediate_size": "128", "model.num_hidden_layers": "2",
        "model.num_attention_heads": "4", "model.num_key_value_heads": "2", "data.seq_len": "64", "data.global_batch_size": "8",
        "schedule.warmup_steps": "2", "schedule.eval_every": "0", "logging.progress": "lines", "logging.peak_flops": "1e10",
        "schedule.max_steps": "4", "checkpoint.every_n_steps": "2", "checkpoint.keep_last": "2"}


def command(name, *extra, data=ds, base=BASE):
    keys = dict(base)
    keys.update({extra[i][2:]: extra[i + 1] for i in range(0, len(extra), 2)})
    cmd = ["train", "--config", "configs/tiny-cpu.toml", "--data.path", data]
    if name:
        cmd += ["--logging.run_dir", os.path.join(work, name)]
    for k, v in keys.items():
        if v is not None:
            cmd += ["--" + k, v]
    return cmd


def train(name, *extra, env_extra=None, popen=False, **kw):
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [args.mpiexec, "--oversubscribe", "-np", "2", st, *command(name, *extra, **kw)]
    if popen:
        return subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return subprocess.run(cmd, cwd=args.source, env=env, capture_output=True, text=True, timeout=600)


def check_cmd(name, *extra, flags=()):
    cmd = command(name, *extra)
    cmd[0] = "check"
    cmd += list(flags)
    return subprocess.run([st, *cmd], cwd=args.source, capture_output=True, text=True, timeout=300)


def steps_in(path):
    return sorted(n for n in os.listdir(path) if n.startswith("step_")) if os.path.isdir(path) else []


def done_times(path):
    return {n: os.stat(os.path.join(path, n, "DONE")).st_mtime_ns for n in steps_in(path) if os.path.isfile(os.path.join(path, n, "DONE"))}


def result(name):
    return json.load(open(os.path.join(work, name, "result.json")))


def losses(name):
    return {m["step"]: m["loss"] for m in map(json.loads, open(os.path.join(work, name, "metrics.jsonl"))) if m["kind"] == "train"}


golden = train("golden")
check(golden.returncode == 0, f"the reference run: {golden.stderr[-2000:]}")
gold_ckpts = os.path.join(work, "golden", "checkpoints")
check(steps_in(gold_ckpts) == ["step_00000002", "step_00000004"], f"the reference run's checkpoints: {os.listdir(gold_ckpts)}")

# 1a. A fresh run (another seed) in that run directory: refused, nothing of the other run's touched.
shutil.copytree(os.path.join(work, "golden"), os.path.join(work, "fresh"))
fresh_ckpts = os.path.join(work, "fresh", "checkpoints")
before = done_times(fresh_ckpts)
r = train("fresh", "--model.init_seed", "7", "--checkpoint.every_n_steps", "1", "--schedule.max_steps", "3")
message = (f"checkpoint.dir {fresh_ckpts} holds 2 complete checkpoint(s) (step_00000002, step_00000004) and this run does not "
           "resume from them")
check(r.returncode == 5 and message in r.stderr and "add --resume auto" in r.stderr,
      f"a fresh run beside another run's checkpoints: exit {r.returncode}: {r.stderr[-2000:]}")
check(done_times(fresh_ckpts) == before and steps_in(fresh_ckpts) == ["step_00000002", "step_00000004"],
      f"the other run's checkpoints untouched: {os.listdir(fresh_ckpts)}")
c = check_cmd("fresh", "--model.init_seed", "7")
check(c.returncode == 5 and message in c.stdout and "resume     FAILED: checkpoint error" in c.stdout,
      f"check says the same: exit {c.returncode}: {c.stdout[-2000:]}")
r = train("fresh", "--model.init_seed", "7", "--checkpoint.init_from", os.path.join(gold_ckpts, "step_00000002"))
check(r.returncode == 5 and message in r.stderr, f"init_from is no resume either: exit {r.returncode}: {r.stderr[-1500:]}")

# 1b. A branch from the older checkpoint with another learning rate: the newer one is renamed, never deleted; the
# branch saves its own step 4 and reports it.
shutil.copytree(os.path.join(work, "golden"), os.path.join(work, "branch"))
br_ckpts = os.path.join(work, "branch", "checkpoints")
c = check_cmd("branch", "--resume", os.path.join(br_ckpts, "step_00000002"), "--optim.lr", "1e-3")
check(c.returncode == 0 and f"{br_ckpts}/step_00000004 is newer than the checkpoint resumed from: the run would set it aside as "
      f"{br_ckpts}/step_00000004.superseded" in c.stdout, f"check of the branch: exit {c.returncode}: {c.stdout[-2000:]}")
old_done = open(os.path.join(br_ckpts, "step_00000004", "DONE")).read()
r = train("branch", "--resume", os.path.join(br_ckpts, "step_00000002"), "--optim.lr", "1e-3")
check(r.returncode == 0 and f"SET ASIDE {br_ckpts}/step_00000004 as {br_ckpts}/step_00000004.superseded" in r.stderr,
      f"a branch from the older checkpoint: exit {r.returncode}: {r.stderr[-2500:]}")
check(sorted(os.listdir(br_ckpts)) == [".shardtrain.lock", "step_00000002", "step_00000004", "step_00000004.superseded"]
      and open(os.path.join(br_ckpts, "step_00000004.superseded", "DONE")).read() == old_done
      and open(os.path.join(br_ckpts, "step_00000004", "DONE")).read() != old_done,
      f"the old step 4 kept aside, the branch's own step 4 saved: {sorted(os.listdir(br_ckpts))}")
res = result("branch")
check(res["last_checkpoint"] == os.path.join(br_ckpts, "step_00000004") and res["superseded_checkpoints"] ==
      [{"checkpoint": os.path.join(br_ckpts, "step_00000004"), "set_aside_as": os.path.join(br_ckpts, "step_00000004.superseded")}],
      f"result.json of the branch: {res}")
check(losses("branch")[4] != losses("golden")[4], f"the branch trained step 4 itself: {losses('branch')} {losses('golden')}")

# 1c. Resumed from a checkpoint outside its checkpoint directory (another run's): the ones there, older ones too, are
# another line of training. They were left in place and the rotation removed them as this run's own once its saves
# passed them (keep_last 2: steps 2 and 4 gone after the saves of 6 and 8). Now they are set aside, never deleted.
shutil.copytree(os.path.join(work, "golden"), os.path.join(work, "elsewhere"))
el_ckpts = os.path.join(work, "elsewhere", "checkpoints")
outside = os.path.join(br_ckpts, "step_00000004")
c = check_cmd("elsewhere", "--resume", outside, "--schedule.max_steps", "8")
check(c.returncode == 0 and f"{el_ckpts}/step_00000002 is beside, and not part of, the checkpoint resumed from" in c.stdout,
      f"check of a resume from outside: exit {c.returncode}: {c.stdout[-2000:]}")
r = train("elsewhere", "--resume", outside, "--schedule.max_steps", "8")
for n in ("step_00000002", "step_00000004"):
    check(f"SET ASIDE {el_ckpts}/{n} as {el_ckpts}/{n}.superseded: this run resumed from {outside} (step 4), outside "
          f"checkpoint.dir {el_ckpts}" in r.stderr, f"a resume from outside sets {n} aside: {r.stderr[-2500:]}")
check(r.returncode == 0 and steps_in(el_ckpts) == ["step_00000002.superseded", "step_00000004.superseded", "step_00000006",
                                                  "step_00000008"],
      f"a resume from outside: exit {r.returncode}, {steps_in(el_ckpts)}")

# 1d. The rotation removes what a save wrote, nothing else: a user's notes and export inside an old checkpoint stay,
# in the folder moved aside (they went with the checkpoint).
shutil.copytree(os.path.join(work, "golden"), os.path.join(work, "notes"))
nt_ckpts = os.path.join(work, "notes", "checkpoints")
os.makedirs(os.path.join(nt_ckpts, "step_00000002", "hf"))
open(os.path.join(nt_ckpts, "step_00000002", "hf", "config.json"), "w").write("{}\n")
open(os.path.join(nt_ckpts, "step_00000002", "NOTES.txt"), "w").write("the good one\n")
r = train("notes", "--resume", "auto", "--schedule.max_steps", "6")
kept = os.path.join(nt_ckpts, "step_00000002.foreign")
check(r.returncode == 0 and steps_in(nt_ckpts) == ["step_00000002.foreign", "step_00000004", "step_00000006"]
      and sorted(os.listdir(kept)) == ["NOTES.txt", "hf"] and open(os.path.join(kept, "NOTES.txt")).read() == "the good one\n"
      and f"they stay, in the folder moved aside to {kept}" in r.stderr,
      f"the rotation keeps a user's files: exit {r.returncode}, {steps_in(nt_ckpts)}: {r.stderr[-1500:]}")

# 8. Resumed with nothing left: the checkpoint resumed from is the run's last; no loss.
r = train("golden", "--resume", "auto")
res = result("golden")
check(r.returncode == 0 and res["last_checkpoint"] == os.path.join(gold_ckpts, "step_00000004") and res["last_loss"] is None
      and "no step left to take (at step 4 of 4)" in r.stderr, f"nothing left to train: exit {r.returncode}: {res} {r.stderr[-1500:]}")

# 2. One checkpoint directory, two runs. A stalls in the publication of its step-2 save, holding the directory.
shared = os.path.join(work, "shared")
a = train("runA", "--checkpoint.dir", shared, env_extra={"SHARDTRAIN_CHECKPOINT_FAULT": "stall_before_publish:8@2"}, popen=True)
deadline = time.time() + 120
tmp = []
while time.time() < deadline and not tmp:
    tmp = [n for n in os.listdir(shared) if n.startswith("step_00000002.tmp")] if os.path.isdir(shared) else []
    time.sleep(0.1)
check(len(tmp) == 1 and re.fullmatch(r"step_00000002\.tmp-\d+-[0-9a-f]{8}", tmp[0]), f"a save's own temporary name: {tmp}")
holder = open(os.path.join(shared, ".shardtrain.lock")).read()
b = train("runB", "--checkpoint.dir", shared, "--model.init_seed", "9")
check(b.returncode == 5 and f"checkpoint.dir {shared} is in use by another run (host " in b.stderr
      and f"run directory {os.path.join(work, 'runA')}" in b.stderr, f"the second run: exit {b.returncode}: {b.stderr[-1500:]}")
check(not os.path.exists(os.path.join(work, "runB", "metrics.jsonl")), "the second run was refused before its trainer was built")
c = check_cmd("runB", "--checkpoint.dir", shared)
check(c.returncode == 5 and "is in use by another run" in c.stdout, f"check names the holder too: exit {c.returncode}: {c.stdout[-1500:]}")
# Its run directory is held too: a run of its own checkpoint.dir there is refused (exit 3) before it changes anything
# (two runs interleaved one metrics.jsonl, and one's config.toml sat beside the other's result.json).
run_a = os.path.join(work, "runA")
before = {n: open(os.path.join(run_a, n), "rb").read() for n in ("config.toml", "metrics.jsonl")}
own = os.path.join(work, "own-ckpt")
b = train("runA", "--checkpoint.dir", own, "--model.init_seed", "9")
after = {n: open(os.path.join(run_a, n), "rb").read() for n in ("config.toml", "metrics.jsonl")}
check(b.returncode == 3 and f"logging.run_dir {run_a} is in use by another run (host " in b.stderr and after == before
      and not os.path.exists(own), f"a second run in a held run directory: exit {b.returncode}: {b.stderr[-1500:]}")
c = check_cmd("runA", "--checkpoint.dir", own)
check(c.returncode == 3 and f"logging.run_dir {run_a} is in use by another run" in c.stdout,
      f"check says the run directory is held: exit {c.returncode}: {c.stdout[-1500:]}")
out = a.communicate(timeout=300)[0].decode(errors="replace")
check(a.returncode == 0 and steps_in(shared) == ["step_00000002", "step_00000004"], f"run A: exit {a.returncode}: {out[-1500:]}")
info = subprocess.run([st, "checkpoint", "info", "--verify", os.path.join(shared, "step_00000002")], capture_output=True, text=True)
check(info.returncode == 0 and "checksums: ok" in info.stdout, f"A's step 2: {info.stdout[-800:]} {info.stderr[-800:]}")
# The lock went with run A's processes: a later run (resuming) is not blocked by the file left behind.
r = train("runA", "--checkpoint.dir", shared, "--resume", "auto", "--schedule.max_steps", "6")
check(r.returncode == 0 and steps_in(shared) == ["step_00000004", "step_00000006"], f"after A ended: exit {r.returncode}: {r.stderr[-1500:]}")

# 2b. The checkpoint directory removed while a run holds it (rm -rf mid-run): the lock went with it, and the next save
# made the directory again unlocked, so a second run was let in beside the first. The save locks it again (a warning
# says what happened); a second run during that save is refused as in 2.
gone = os.path.join(work, "removed")
a = train("runC", "--checkpoint.dir", gone, "--schedule.max_steps", "6", env_extra={
    "SHARDTRAIN_FAULT": "slow_step:200", "SHARDTRAIN_CHECKPOINT_FAULT": "stall_before_publish:15@4"}, popen=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.isfile(os.path.join(gone, "step_00000002", "DONE")):
    time.sleep(0.05)
removed = os.path.isfile(os.path.join(gone, "step_00000002", "DONE"))
shutil.rmtree(gone, ignore_errors=True)
tmp = []
while time.time() < deadline and not tmp:
    tmp = [n for n in os.listdir(gone) if n.startswith("step_00000004.tmp")] if os.path.isdir(gone) else []
    time.sleep(0.1)
lock = open(os.path.join(gone, ".shardtrain.lock")).read() if os.path.isfile(os.path.join(gone, ".shardtrain.lock")) else ""
check(removed and len(tmp) == 1 and f"run directory {os.path.join(work, 'runC')}" in lock,
      f"the step-4 save made the removed directory again, with the run's lock: {tmp} {lock!r}")
b = train("runD", "--checkpoint.dir", gone, "--model.init_seed", "9")
check(b.returncode == 5 and f"checkpoint.dir {gone} is in use by another run (host " in b.stderr,
      f"a second run on the re-made directory: exit {b.returncode}: {b.stderr[-1500:]}")
out = a.communicate(timeout=300)[0].decode(errors="replace")
check(a.returncode == 0 and steps_in(gone) == ["step_00000004", "step_00000006"]
      and f"checkpoint.dir {gone}: the directory or its lock file was removed while this run held it" in out,
      f"run C saved into the re-made directory and said so: exit {a.returncode}: {steps_in(gone)} {out[-1500:]}")

# 2c. The checkpoint directory moved while a run holds it (mv): the next save makes it again, as in 2b, but the warning
# says where the earlier checkpoints went; it said they were gone.
kept = os.path.join(work, "kept")
moved = os.path.join(work, "moved elsewhere")
a = train("runE", "--checkpoint.dir", kept, "--schedule.max_steps", "6", env_extra={"SHARDTRAIN_FAULT": "slow_step:200"},
          popen=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.isfile(os.path.join(kept, "step_00000002", "DONE")):
    time.sleep(0.05)
os.rename(kept, moved)
out = a.communicate(timeout=300)[0].decode(errors="replace")
check(a.returncode == 0 and steps_in(moved) == ["step_00000002"] and steps_in(kept) == ["step_00000004", "step_00000006"]
      and f"checkpoint.dir {kept}: the directory was moved to {moved} while this run held it, with its checkpoints" in out
      and "gone with it" not in out,
      f"run E saved into a re-made directory and said where the moved checkpoints are: exit {a.returncode}: "
      f"{steps_in(moved)} {steps_in(kept)} {out[-1500:]}")

# 2d. The run directory removed mid-run (rm -rf, checkpoints and all): its lock went with it, and a second run was let
# into it, so one's config.toml sat beside the other's result.json; the first run's metrics went into the removed file
# without a word. The next step makes it again, locks it, writes config.toml and goes on with the metrics (a warning
# says what happened); a second run started then is refused (exit 3), and the directory ends as the first run's alone.
rund = os.path.join(work, "runF")
a = train("runF", "--schedule.max_steps", "12", "--checkpoint.every_n_steps", "4",
          env_extra={"SHARDTRAIN_FAULT": "slow_step:200"}, popen=True)
deadline = time.time() + 120
while time.time() < deadline and not os.path.isfile(os.path.join(rund, "checkpoints", "step_00000004", "DONE")):
    time.sleep(0.05)
shutil.rmtree(rund, ignore_errors=True)
while time.time() < deadline and not os.path.isfile(os.path.join(rund, ".shardtrain-run.lock")):
    time.sleep(0.05)
b = train("runF", "--checkpoint.dir", os.path.join(work, "runF-other-ckpt"), "--schedule.max_steps", "3")
check(b.returncode == 3 and f"logging.run_dir {rund} is in use by another run" in b.stderr,
      f"a second run in the removed and re-made run directory: exit {b.returncode}: {b.stderr[-1500:]}")
out = a.communicate(timeout=300)[0].decode(errors="replace")
steps = [json.loads(l)["step"] for l in open(os.path.join(rund, "metrics.jsonl")) if '"kind":"train"' in l] \
    if os.path.isfile(os.path.join(rund, "metrics.jsonl")) else []
result = json.load(open(os.path.join(rund, "result.json"))) if os.path.isfile(os.path.join(rund, "result.json")) else {}
config_toml = open(os.path.join(rund, "config.toml")).read() if os.path.isfile(os.path.join(rund, "config.toml")) else ""
check(a.returncode == 0 and re.search(rf"logging.run_dir {re.escape(rund)} was removed while this run held it \(its metrics up to "
                                      r"step \d+ went with it\): made again", out) is not None
      and steps and steps == list(range(steps[0], 13)) and 5 <= steps[0] <= 12 and result.get("step") == 12
      and "max_steps = 12" in config_toml and "runF-other-ckpt" not in config_toml,
      f"run F re-made its run directory and kept it: exit {a.returncode}, steps {steps}, result {result}: {out[-1500:]}")

# 3. SIGUSR1 while the ranks start (stopped past their config agreement, before the first step), in a generated
# run directory: exit 75, result.json "preempted", nothing saved, and the way back named.
root = os.path.join(work, "runs_root")
p = train(None, "--logging.runs_root", root, "--logging.peak_flops", None, "--schedule.max_steps", "30", popen=True)
deadline = time.time() + 120
cfg = []
while time.time() < deadline and not cfg:
    cfg = [os.path.join(root, d) for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "config.toml"))] if os.path.isdir(root) else []
    time.sleep(0.01)
ranks = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
for pid in ranks:  # held still, so the signal lands before the first step whatever the machine's load
    os.kill(pid, signal.SIGSTOP)
metrics_file = os.path.join(cfg[0], "metrics.jsonl") if cfg else ""
early = not os.path.exists(metrics_file) or not [l for l in open(metrics_file) if '"kind":"train"' in l.replace(" ", "")]
for pid in ranks:
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGCONT)
out = p.communicate(timeout=300)[0].decode(errors="replace")
run_dir = cfg[0] if cfg else "?"
check(len(ranks) == 2 and early, f"both ranks stopped before their first step: {ranks}, early {early}")
check(p.returncode == 75 and "received during the start-up, before the first step" in out
      and f"run the same command with --logging.run_dir {run_dir} --resume auto" in out,
      f"a signal during the start-up: exit {p.returncode}: {out[-2500:]}")
res = json.load(open(os.path.join(run_dir, "result.json"))) if os.path.isfile(os.path.join(run_dir, "result.json")) else {}
check(res.get("status") == "preempted" and res.get("exit_code") == 75 and res.get("step") == 0
      and not steps_in(os.path.join(run_dir, "checkpoints")), f"result.json of it: {res}")

# 3b. The same at the earliest moment a rank catches the signal: the handlers are installed before MPI_Init (MPI's
# and NCCL's start take minutes on a large job), so the signal lands in MPI's or the runtime's start-up here.
def catches_usr1(pid):
    """Whether the rank `pid` runs shardtrain (not mpirun's fork before its exec, which has mpirun's handlers) and
    has its SIGUSR1 handler installed."""
    try:
        if os.path.realpath(os.readlink(f"/proc/{pid}/exe")) != os.path.realpath(st):
            return False
        with open(f"/proc/{pid}/status") as f:
            return any(l.startswith("SigCgt:") and int(l.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)) for l in f)
    except OSError:
        return False


p = train("early", "--schedule.max_steps", "30", popen=True)
deadline, signalled = time.time() + 120, set()
while time.time() < deadline and len(signalled) < 2 and p.poll() is None:
    for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
        if pid not in signalled and catches_usr1(pid):
            os.kill(int(pid), signal.SIGUSR1)
            signalled.add(pid)
    time.sleep(0.001)
out = p.communicate(timeout=300)[0].decode(errors="replace")
check(len(signalled) == 2 and p.returncode == 75 and "received during the start-up, before the first step" in out
      and not steps_in(os.path.join(work, "early", "checkpoints")),
      f"a signal as soon as a rank catches it: {len(signalled)} signalled, exit {p.returncode}: {out[-2500:]}")

# 7. --resume auto in a new generated run directory: loud, and it names the run with checkpoints.
first = train(None, "--logging.runs_root", root)
check(first.returncode == 0, f"a run in a generated directory: {first.stderr[-1500:]}")
saved_runs = [d for d in sorted(os.listdir(root)) if steps_in(os.path.join(root, d, "checkpoints"))]
r = train(None, "--logging.runs_root", root, "--resume", "auto")
check(r.returncode == 0 and len(saved_runs) == 1 and "STARTING FROM SCRATCH" in r.stderr
      and f"runs of this config under {root} with checkpoints: {os.path.join(root, saved_runs[0])} (step_00000004)" in r.stderr,
      f"--resume auto in a new run directory: exit {r.returncode}: {saved_runs}: {r.stderr[-2000:]}")

# 4. checkpoint.dir that is a file: refused at start with exit 8, naming it.
afile = os.path.join(work, "afile")
open(afile, "w").write("hi")
r = train("file_ckpt", "--checkpoint.dir", afile, "--checkpoint.every_n_steps", "1", "--schedule.max_steps", "10")
check(r.returncode == 8 and f"checkpoint.dir: {afile} exists and is not a directory" in r.stderr
      and not os.path.exists(os.path.join(work, "file_ckpt", "metrics.jsonl")), f"a file as checkpoint.dir: exit {r.returncode}: {r.stderr[-1500:]}")

# 5. A user's files in step_4.tmp (the name saves had before) and in an incomplete step_4: the save of step 4 keeps
# them all, moving the incomplete step_4 aside.
user = os.path.join(work, "user", "checkpoints")
os.makedirs(user)
shutil.copytree(os.path.join(gold_ckpts, "step_00000002"), os.path.join(user, "step_00000002"))
os.makedirs(os.path.join(user, "step_00000004.tmp", "sub"))
open(os.path.join(user, "step_00000004.tmp", "notes.txt"), "w").write("my precious notes")
open(os.path.join(user, "step_00000004.tmp", "sub", "keep.bin"), "w").write("data")
os.makedirs(os.path.join(user, "step_00000004"))
shutil.copy(os.path.join(gold_ckpts, "step_00000004", "index.h5"), os.path.join(user, "step_00000004"))
open(os.path.join(user, "step_00000004", "notes.txt"), "w").write("mine too")
r = train("user", "--resume", "auto")
check(r.returncode == 0 and f"{user}/step_00000004 holds files a save does not write: moved aside to {user}/step_00000004.foreign" in r.stderr,
      f"a save over a user's directory: exit {r.returncode}: {r.stderr[-2000:]}")
check(open(os.path.join(user, "step_00000004.tmp", "notes.txt")).read() == "my precious notes"
      and open(os.path.join(user, "step_00000004.tmp", "sub", "keep.bin")).read() == "data"
      and open(os.path.join(user, "step_00000004.foreign", "notes.txt")).read() == "mine too"
      and os.path.isfile(os.path.join(user, "step_00000004", "DONE")), f"every user file kept: {sorted(os.listdir(user))}")

# 6. check mirrors --resume auto's fallback past a damaged newest checkpoint.
damaged = os.path.join(work, "damaged")
shutil.copytree(os.path.join(work, "golden"), damaged)
rank0 = os.path.join(damaged, "checkpoints", "step_00000004", "rank_00000.h5")
data = bytearray(open(rank0, "rb").read())
for k in range(16):
    data[len(data) // 2 + k] ^= 0xFF
open(rank0, "wb").write(data)
c = check_cmd("damaged", "--resume", "auto", "--schedule.max_steps", "6", flags=["--verify-checkpoint"])
check(c.returncode == 0 and "step_00000004 is damaged: the run would set it aside" in c.stdout
      and f"the run would resume from {os.path.join(damaged, 'checkpoints', 'step_00000002')}" in c.stdout,
      f"check past a damaged newest checkpoint: exit {c.returncode}: {c.stdout[-2500:]} {c.stderr[-500:]}")

# 9. init_from a checkpoint of another tokenizer's ids: refused as --resume refuses it.
tok2, ds2 = clitest.prepare_dataset(args, corpus, work, 520, "moby-bpe520", 0.05)
r = train("other_tok", "--checkpoint.init_from", os.path.join(gold_ckpts, "step_00000002"), data=ds2)
check(r.returncode == 5 and "trained with tokenizer" in r.stderr, f"init_from of another tokenizer: exit {r.returncode}: {r.stderr[-1500:]}")

check.finish("PASS: a run never mixes its checkpoints with another's, a second run is locked out, signals at start give 75, "
             "an unwritable checkpoint.dir stops the start, user files survive saves, check mirrors the fallback")
