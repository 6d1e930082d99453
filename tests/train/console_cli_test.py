#!/usr/bin/env python3
"""What `shardtrain train` shows on a terminal, through the binary in a real pty (`script`):
- the progress bar fits the terminal's width (stty cols, read with TIOCGWINSZ; COLUMNS when the pty says none;
  under mpirun, the pty it gives the ranks' stdout, which takes its own terminal's size), so each redraw replaces
  the last: a 155-column bar on an 80-column terminal wrapped at every redraw and filled the screen with half-lines;
  a narrow one keeps step/total and the loss;
- TERM=dumb (Emacs' shell) gets the plain lines and not one escape code;
- a run stopped by SIGTERM prints the options that continue it quoted for a shell: its generated run directory,
  under a runs_root with a space and a name with a quote, pasted after the same command resumes it (exit 0); the
  path unquoted was three words there (usage error 2);
- a stop signal after the last step (during the final validation, 1-2 s here) is said, not ignored: the run
  finished, exit 0 (jobs/launch.sh had announced 75), one line for the job even when only rank 1 got the signal;
  one in the last step gets the line that says so, and not that one as well."""
import os
import json
import re
import shlex
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
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "moby-dick"), work, 512, "moby-bpe512", 0.05)
if not shutil.which("script"):
    print("FAIL: `script` (util-linux) is needed to run shardtrain in a pty", file=sys.stderr)
    sys.exit(1)

STEPS = 20
MODEL = ["--model.vocab_size", "512", "--model.hidden_size", "64", "--model.intermediate_size", "128",
         "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2",
         "--data.path", ds, "--data.seq_len", "64", "--data.global_batch_size", "8", "--schedule.warmup_steps", "2",
         "--schedule.eval_every", "0"]
BASE = MODEL + ["--schedule.max_steps", str(STEPS), "--checkpoint.every_n_steps", "0"]


def in_a_pty(name, *extra, env_extra=None, stty="", mpi=False, log_level="warn"):
    """The run's output as a terminal of `stty` (e.g. "cols 60 rows 24") shows it; stdin is no terminal, so the
    pty has no size unless `stty` gives one."""
    env = dict(os.environ)
    env.pop("SHARDTRAIN_FAULT", None)
    env.pop("COLUMNS", None)
    env.update({"TERM": "xterm", "SHARDTRAIN_FAULT": "slow_step:30"})  # each step 30 ms: several redraws
    env.update(env_extra or {})
    cmd = [st, "--log-level", log_level, "train", "--config", "configs/tiny-cpu.toml", *BASE,
           "--logging.run_dir", os.path.join(work, name), *extra]
    if mpi:
        cmd = [args.mpiexec, "--oversubscribe", "-np", "2", *cmd]
    line = shlex.join(cmd)
    if stty:
        line = f"stty {stty} && {line}"
    p = subprocess.run(["script", "-q", "-e", "-c", line, "/dev/null"], cwd=args.source, env=env, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode, p.stdout.decode(errors="replace")


def bar_draws(out):
    """Each drawing of the bar: the text between \\r (and ESC[2K) and the next \\r or newline, up to a log line's
    "[r0" that a warning wrote after it (the bar's line is open while a log line comes)."""
    draws = [d for d in re.split(r"[\r\n]", out.replace("\x1b[2K", "")) if re.search(rf"\d+/{STEPS} step", d)]
    return [d.split("[r0", 1)[0] for d in draws]


for name, width, how in (("cols60", 60, dict(stty="cols 60 rows 24")), ("cols200", 200, dict(stty="cols 200 rows 24")),
                         ("columns45", 45, dict(env_extra={"COLUMNS": "45"})),
                         ("mpirun70", 70, dict(stty="cols 70 rows 24", mpi=True))):
    rc, out = in_a_pty(name, **how)
    draws = bar_draws(out)
    check(rc == 0 and len(draws) >= 3, f"{name}: exit {rc}, {len(draws)} bar draws: {out[-1500:]!r}")
    too_long = [d for d in draws if len(d) >= width]
    check(not too_long, f"{name}: {len(too_long)} of {len(draws)} draws of {width} columns or more: {too_long[:2]!r}")
    last = draws[-1] if draws else ""
    check(f"{STEPS}/{STEPS} step" in last and "loss=" in last, f"{name}: the last draw {last!r}")
    if width == 200:  # room for everything: the bar at its widest and every field
        check("[" + "#" * 30 + "]" in last and all(f in last for f in ("tok/s=", "lr=", "gnorm=", "mfu=", "mem=")),
              f"{name}: the last draw {last!r}")
    if width == 60:
        check("lr=" not in last and "mem=" not in last, f"{name}: the last draw {last!r}")

rc, out = in_a_pty("dumb", env_extra={"TERM": "dumb"}, stty="cols 80 rows 24", log_level="info")
check(rc == 0 and "\x1b" not in out and f"step {STEPS}/{STEPS} loss " in out and not bar_draws(out),
      f"TERM=dumb: exit {rc}: {out[-1500:]!r}")

# The hint that continues a stopped run, pasted into a shell after the same command.
runs_root = os.path.join(work, "my runs")
cmd = [st, "train", "--config", "configs/tiny-cpu.toml", *BASE, "--logging.progress", "lines", "--logging.log_every", "1",
       "--logging.runs_root", runs_root, "--logging.name", "tiny cpu's"]
env = dict(os.environ, SHARDTRAIN_FAULT="slow_step:100")
p = subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
out = ""
deadline = time.time() + 120
while time.time() < deadline and f"step 3/{STEPS} " not in out:
    line = p.stdout.readline()
    if not line:
        break
    out += line
p.send_signal(signal.SIGTERM)
out += p.communicate(timeout=120)[0]
hint = re.search(r"to continue, run the same command with (.*?) \(exit code 75", out)
check(p.returncode == 75 and hint, f"stopped by SIGTERM: exit {p.returncode}: {out[-1500:]}")
if hint:
    options = hint.group(1)
    run_dirs = [d for d in os.listdir(runs_root)] if os.path.isdir(runs_root) else []
    quoted = "'" + os.path.join(runs_root, run_dirs[0]).replace("'", "'\\''") + "'" if run_dirs else None
    check(len(run_dirs) == 1 and options == f"--logging.run_dir {quoted} --resume auto",
          f"the hint quotes the run directory for a shell: {options!r} ({run_dirs})")
    pasted = subprocess.run(["bash", "-c", shlex.join(cmd) + " " + options], cwd=args.source, capture_output=True, text=True,
                            errors="replace", timeout=300)
    result = os.path.join(runs_root, run_dirs[0], "result.json") if run_dirs else ""
    status = json.load(open(result)).get("status") if os.path.exists(result) else None
    check(pasted.returncode == 0 and "resumed from" in pasted.stderr and status == "finished" and len(os.listdir(runs_root)) == 1,
          f"the pasted hint: exit {pasted.returncode}, result {status}: {pasted.stderr[-1500:]}")


def stopped_at(name, trigger, sig, *extra, mpi=False, fault=None, rank=None):
    """A 4-step run that validates on all of its held-out tokens at its end, sent `sig` once `trigger` is in its
    output (to rank `rank` alone under mpirun). Returns (exit code, output, result.json's status)."""
    run_dir = os.path.join(work, name)
    cmd = [st, "train", "--config", "configs/tiny-cpu.toml", *MODEL, "--schedule.max_steps", "4", "--checkpoint.every_n_steps",
           "2", "--schedule.eval_batches", "1000", "--logging.progress", "lines", "--logging.log_every", "1",
           "--logging.run_dir", run_dir, *extra]
    if mpi:
        cmd = [args.mpiexec, "--oversubscribe", "-np", "2", *cmd]
    env = dict(os.environ)
    env.pop("SHARDTRAIN_FAULT", None)
    if fault:
        env["SHARDTRAIN_FAULT"] = fault
    p = subprocess.Popen(cmd, cwd=args.source, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", start_new_session=True)
    out = ""
    while trigger not in out:
        line = p.stdout.readline()
        if not line:
            break
        out += line
    target = p.pid
    if rank is not None:  # the rank's process: mpirun's child whose environment names it
        for child in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split():
            try:
                if f"OMPI_COMM_WORLD_RANK={rank}".encode() in open(f"/proc/{child}/environ", "rb").read().split(b"\0"):
                    target = int(child)
            except OSError:
                pass
    check(trigger in out and (rank is None or target != p.pid), f"{name}: {trigger!r} and rank {rank}: {out[-1500:]}")
    os.kill(target, sig)
    out += p.communicate(timeout=300)[0]
    result = os.path.join(run_dir, "result.json")
    return p.returncode, out, json.load(open(result)).get("status") if os.path.exists(result) else None


# During the final validation: the last step's line is out, so its all-reduce (the last that carries the signal flags)
# is done, and the validation of all the held-out tokens takes a second or two.
AFTER = "received after the last step (4), during the run's final validation or save: the run finished all the same " \
        "(exit code 0, not 75: nothing is left to train)"
rc, out, status = stopped_at("late_term", "step 4/4 ", signal.SIGTERM)
check(rc == 0 and status == "finished" and f"preemption: SIGTERM {AFTER}" in out and "eval at step 4" in out
      and out.index("eval at step 4") < out.index(AFTER) and "received at the last step" not in out,
      f"SIGTERM during the final validation: exit {rc}, {status}: {out[-2000:]}")
rc, out, status = stopped_at("late_usr1_rank1", "step 4/4 ", signal.SIGUSR1, mpi=True, rank=1)
check(rc == 0 and status == "finished" and out.count(f"preemption: SIGUSR1 {AFTER}") == 1,
      f"SIGUSR1 to rank 1 alone during the final validation: exit {rc}, {status}: {out[-2000:]}")
# In the last step (each step sleeps 0.5 s: the signal sent once step 3 is out lands before step 4's all-reduce): the
# line of the last step only.
rc, out, status = stopped_at("in_last_step", "step 3/4 ", signal.SIGTERM, fault="slow_step:500")
check(rc == 0 and status == "finished" and "received at the last step (4): the run finishes as it would have" in out
      and "after the last step" not in out, f"SIGTERM in the last step: exit {rc}, {status}: {out[-2000:]}")

check.finish("all console checks passed")
