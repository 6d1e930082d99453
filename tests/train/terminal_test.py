#!/usr/bin/env python3
"""A workstation user at a terminal (hostile audit R): a run started without mpirun stops as a preempted one does on
Ctrl-C (SIGINT) and on its terminal closing (SIGHUP): it saves after the step, exits 75 and resumes to the uninterrupted
run's losses (it died at once, exit 130 or 129, nothing saved); a second Ctrl-C ends it at once, the checkpoint before
intact. A reader that stops reading its output (`train | head`) no longer kills it with SIGPIPE (exit 141, nothing
saved): it trains to its end. Output on a full disk (/dev/full) is an I/O error, exit 8, where its product is what it
prints (train --print-config, dataset info, generate); they left empty files with exit 0."""
import json
import os
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
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)
SMALL = [*clitest.TINY_MODEL, "--model.vocab_size", "600", "--schedule.warmup_steps", "2", "--schedule.eval_every", "0",
         "--schedule.max_steps", "12", "--checkpoint.every_n_steps", "4", "--logging.progress", "lines",
         "--logging.peak_flops", "1e10"]


def command(name, *extra):
    return [st, "train", "--config", "configs/tiny-cpu.toml", "--data.path", ds, "--logging.run_dir", os.path.join(work, name),
            *SMALL, *extra]


def losses(name):
    path = os.path.join(work, name, "metrics.jsonl")
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if j["kind"] == "train"} if os.path.exists(path) else {}


def result(name):
    path = os.path.join(work, name, "result.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def steps_logged(name):
    return len(losses(name))


def start(name, *extra, slow_ms=300, **kw):
    env = dict(os.environ, SHARDTRAIN_FAULT=f"slow_step:{slow_ms}")
    return subprocess.Popen(command(name, *extra), env=env, cwd=args.source, **kw)


def wait_for_steps(name, n, p, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and steps_logged(name) < n and p.poll() is None:
        time.sleep(0.05)
    return steps_logged(name) >= n


subprocess.run(command("whole"), cwd=args.source, check=True, capture_output=True)
whole = losses("whole")
check(sorted(whole) == list(range(1, 13)), f"the uninterrupted run: {sorted(whole)}")

# 1. One Ctrl-C, and a hangup: saved after the step, exit 75, and resumed to the uninterrupted run's losses.
for sig, name, said in ((signal.SIGINT, "ctrl-c", "SIGINT (Ctrl-C) received"), (signal.SIGHUP, "hangup", "SIGHUP (its terminal closed) received")):
    p = start(name, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    at = wait_for_steps(name, 3, p)
    p.send_signal(sig)
    out = p.communicate(timeout=300)[0].decode(errors="replace")
    r = result(name)
    stopped = r.get("step", 0)
    check(at and p.returncode == 75 and r.get("status") == "preempted" and 3 <= stopped < 12 and said in out
          and os.path.isdir(os.path.join(work, name, "checkpoints", f"step_{stopped:08d}")),
          f"{name}: exit {p.returncode}, result {r}: {out[-1500:]}")
    if sig == signal.SIGINT:
        check("Ctrl-C: saving a checkpoint after this step, then stopping (exit code 75); Ctrl-C again stops at once" in out,
              f"the first Ctrl-C is answered at once: {out[-1500:]}")
    q = subprocess.run(command(name, "--resume", "auto"), cwd=args.source, capture_output=True, text=True)
    resumed = losses(name)
    check(q.returncode == 0 and sorted(resumed) == list(range(1, 13)) and all(resumed[s] == whole[s] for s in resumed),
          f"{name}: resumed to the uninterrupted losses: exit {q.returncode}: "
          f"{[(s, resumed.get(s), whole.get(s)) for s in range(1, 13) if resumed.get(s) != whole.get(s)]} {q.stderr[-800:]}")

# 2. Ctrl-C twice within a step (each step sleeps 2 s): the second ends the process at once, by SIGINT; the step-4
# checkpoint is intact and the run resumes from it.
p = start("twice", slow_ms=2000, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
at = wait_for_steps("twice", 5, p, timeout=180)
p.send_signal(signal.SIGINT)
time.sleep(0.3)
p.send_signal(signal.SIGINT)
out = p.communicate(timeout=120)[0].decode(errors="replace")
ckpts = sorted(n for n in os.listdir(os.path.join(work, "twice", "checkpoints")) if n.startswith("step_"))
check(at and p.returncode == -signal.SIGINT and ckpts == ["step_00000004"] and not result("twice"),
      f"a second Ctrl-C: exit {p.returncode}, checkpoints {ckpts}: {out[-1200:]}")
q = subprocess.run(command("twice", "--resume", "auto"), cwd=args.source, capture_output=True, text=True)
check(q.returncode == 0 and "resumed from" in q.stderr and result("twice").get("status") == "finished",
      f"resumed after the second Ctrl-C: exit {q.returncode}: {q.stderr[-800:]}")

# 3. `train ... | head -1`: the reader goes after one line; the run trains on to its end (SIGPIPE killed it at its next
# line, exit 141, nothing saved).
p = start("piped", slow_ms=100, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
first = p.stdout.readline()
p.stdout.close()
p.wait(timeout=300)
check(first and p.returncode == 0 and result("piped").get("status") == "finished" and sorted(losses("piped")) == list(range(1, 13)),
      f"a closed output pipe: exit {p.returncode}, result {result('piped')}")

# 4. Standard output on a full disk: exit 8 and the reason, where the product is what the command prints.
hf = os.path.join(work, "ctrl-c", "checkpoints", "step_00000012")
for what, cmd in (("train --print-config", command("print", "--print-config")), ("dataset info", [st, "dataset", "info", ds]),
                  ("generate", [st, "generate", "--checkpoint", hf, "--prompt", "Call me", "--max-tokens", "4"])):
    with open("/dev/full", "w") as full:
        p = subprocess.run(cmd, cwd=args.source, stdout=full, stderr=subprocess.PIPE, text=True)
    check(p.returncode == 8 and "standard output could not be written" in p.stderr,
          f"{what} > /dev/full: exit {p.returncode}: {p.stderr[-600:]}")

check.finish("a run at a terminal: all checks passed")
