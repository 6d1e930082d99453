#!/usr/bin/env python3
"""What a start of `shardtrain train` checks before it writes anything, through the binary (a tiny model on the
real corpus, each run a second or two):
- a run directory holding a config.toml or result.json that shardtrain did not write: exit 3 naming the file, and
  nothing in it changed (`check` says the same); failures/ loses only shardtrain's own records;
- a start refused by its resume (another model) or by the checkpoints it would mix with: the run directory's
  config.toml, metrics and event files as they were, no result.json of the earlier run left, and the documented
  continuation (`train -c RUN_DIR/config.toml --resume auto`) still works; its closing line says this start's steps
  and tokens, and the run's life beside them;
- logging.metrics_file naming one of the run directory's own folders, or any folder: exit 3;
- optim.rollback_skip_steps past the run and an epoch: exit 3 at once (it spun forever); a rollback that skips an
  epoch lands where the arithmetic says;
- a micro-batch x world past 2^31 (SIGFPE in train and check) and a batch no machine holds (std::bad_alloc): exit 3
  naming data.micro_batch_size;
- a run length whose tokens pass int64 (negative counts, `check: ok`): exit 3 naming the key, in check and train,
  leaving no run directory; a warmup as long as a run that epochs or max_tokens end, the same; mixture weights
  summing to inf: exit 3;
- a run directory that is a file: exit 8 naming logging.run_dir; a divergence says "training diverged" once."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "sotu"), work, 4096, "sotu-bpe4k", 0.02)


def run(cmd, np=None, timeout=300, env=None):
    """(returncode, stdout, stderr) of the binary alone, or under mpirun -np NP, in WORK; `env` added to the caller's
    environment, less its SHARDTRAIN_RANKS_PER_NODE."""
    full_env = {k: v for k, v in os.environ.items() if k != "SHARDTRAIN_RANKS_PER_NODE"}
    full_env.update(env or {})
    st = os.path.abspath(args.shardtrain)
    full = [args.mpiexec, "--oversubscribe", "-np", str(np), st, *cmd] if np else [st, *cmd]
    p = subprocess.run(full, capture_output=True, text=True, errors="replace", timeout=timeout, env=full_env, cwd=work)
    return p.returncode, p.stdout, p.stderr


SMALL = ["--config", os.path.join(args.source, "configs/tiny-cpu.toml"), "--data.path", ds, "--model.hidden_size", "64",
         "--model.intermediate_size", "128", "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4",
         "--schedule.warmup_steps", "1", "--schedule.eval_every", "2", "--schedule.eval_batches", "1",
         "--checkpoint.every_n_steps", "2", "--schedule.max_steps", "3", "--logging.peak_flops", "1e12",
         "--logging.progress", "lines"]


def options(*extra):
    """SMALL with `extra` (--key value pairs) in place of its own values: an option given twice is a usage error."""
    merged = dict(zip(SMALL[::2], SMALL[1::2]))
    merged.update(zip(extra[::2], extra[1::2]))
    return [x for kv in merged.items() for x in kv]


def train(*extra, np=None, env=None):
    return run(["train", *options(*extra)], np=np, env=env)


def snapshot(d):
    """{relative path: bytes} of every file under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def error_lines(err):
    return [l for l in err.splitlines() if " E] " in l]


# 1. A directory of the user's: its config.toml and result.json are not the run's, and nothing in it changes.
user = os.path.join(work, "userdir")
os.makedirs(os.path.join(user, "failures"))
open(os.path.join(user, "config.toml"), "w").write("my own notes\n")
open(os.path.join(user, "failures", "notes.txt"), "w").write("important\n")
open(os.path.join(user, "result.json"), "w").write('{"mine":1}\n')
before = snapshot(user)
rc, out, err = train("--logging.run_dir", user)
check(rc == 3 and f"logging.run_dir: {user}/config.toml was not written by shardtrain" in err and len(error_lines(err)) == 1,
      f"a user's config.toml: exit {rc}: {err[-1500:]}")
check(snapshot(user) == before, f"the user's directory changed: {sorted(snapshot(user))}")
rc, out, err = run(["check", *options("--logging.run_dir", user)])
check(rc == 3 and "outputs    FAILED: configuration error: logging.run_dir:" in out and "config.toml was not written" in out,
      f"check of a user's config.toml: exit {rc}: {out[-1500:]}")
os.remove(os.path.join(user, "config.toml"))
rc, out, err = train("--logging.run_dir", user)
check(rc == 3 and f"{user}/result.json was not written by shardtrain" in err, f"a user's result.json: exit {rc}: {err[-1500:]}")
os.remove(os.path.join(user, "result.json"))
open(os.path.join(user, "failures", "rank_00001.json"), "w").write('{"exit_code":6}\n')  # an earlier start's record
rc, out, err = train("--logging.run_dir", user, "--schedule.max_steps", "2")
result = json.load(open(os.path.join(user, "result.json"))) if rc == 0 else {}
check(rc == 0 and sorted(os.listdir(os.path.join(user, "failures"))) == ["notes.txt"]
      and open(os.path.join(user, "failures", "notes.txt")).read() == "important\n",
      f"failures/ keeps what is not a record: exit {rc}: {os.listdir(os.path.join(user, 'failures'))}: {err[-1500:]}")
check(result.get("written_by") == "shardtrain train" and result.get("status") == "finished", f"result.json's mark: {result}")
check(open(os.path.join(user, "config.toml")).read().startswith("# resolved configuration of this run"), "the run's config.toml")

# 2. A finished 4-rank run (2 simulated nodes, HYBRID_SHARD); starts refused by their resume or by its checkpoints
# change nothing of it, and its documented continuation works.
r_h4 = os.path.join(work, "r_h4")
rc, out, err = train("--fsdp.strategy", "HYBRID_SHARD", "--logging.run_dir", r_h4, np=4, env={"SHARDTRAIN_RANKS_PER_NODE": "2"})
check(rc == 0, f"4-rank HYBRID_SHARD run: exit {rc}: {err[-1500:]}")
finished = snapshot(r_h4)
events = sorted(f for f in finished if f.startswith("events.out.tfevents"))
for extra, needle in [(["--model.num_hidden_layers", "3", "--resume", "auto"], "num_hidden_layers = 2, the configured model 3"),
                      (["--optim.lr", "1e-3"], "holds 2 complete checkpoint(s)")]:
    rc, out, err = train("--logging.run_dir", r_h4, *extra)
    now = snapshot(r_h4)
    check(rc == 5 and needle in err, f"{extra}: exit {rc}, expected 5: {err[-1500:]}")
    for f in ("config.toml", "metrics.jsonl"):
        check(now.get(f) == finished[f], f"{extra}: {f} changed by a refused start")
    check(sorted(f for f in now if f.startswith("events.out.tfevents")) == events, f"{extra}: event files {sorted(now)}")
    check("result.json" not in now, f"{extra}: the earlier start's result.json is still there after a refused start")
    check(all(now.get(f) == b for f, b in finished.items() if f.startswith("checkpoints/step_")), f"{extra}: checkpoints changed")
rc, out, err = run(["train", "--config", os.path.join(r_h4, "config.toml"), "--resume", "auto", "--schedule.max_steps", "5"])
check(rc == 0 and "train: done: 2 steps, 4096 tokens in " in err and "(steps 4 to 5 of 5; 10240 tokens over the run's life)" in err,
      f"the continuation and its closing line: exit {rc}: {err[-1500:]}")
result = json.load(open(os.path.join(r_h4, "result.json"))) if rc == 0 else {}
check(result.get("step") == 5 and result.get("status") == "finished", f"the continuation's result.json: {result}")

# 3. The metrics file in one of the run directory's own folders, or in any folder.
for name in ("failures", "checkpoints"):
    rc, out, err = train("--logging.run_dir", os.path.join(work, "mf"), "--logging.metrics_file", name)
    check(rc == 3 and f"logging.metrics_file: expected a file name inside the run directory" in err and f"got '{name}'" in err,
          f"metrics_file {name}: exit {rc}: {err[-800:]}")
os.makedirs(os.path.join(work, "mf2", "mine"))
rc, out, err = train("--logging.run_dir", os.path.join(work, "mf2"), "--logging.metrics_file", "mine")
check(rc == 3 and "logging.metrics_file: " in err and "mine is a folder" in err, f"metrics_file a folder: exit {rc}: {err[-800:]}")

# 4. Rollback: a skip past the run and an epoch is refused at once; a skip of an epoch lands one epoch on.
ROLLBACK = ["--optim.on_divergence", "rollback", "--optim.max_consecutive_nonfinite", "1", "--checkpoint.every_n_steps", "1"]
try:
    rc, out, err = run(["train", *options(*ROLLBACK, "--optim.rollback_skip_steps", "9223372036854775807", "--logging.run_dir",
                                          os.path.join(work, "rb_huge"))], timeout=60)
except subprocess.TimeoutExpired:
    rc, err = None, "timed out"
check(rc == 3 and "optim.rollback_skip_steps: 9223372036854775807 global batches" in err and "expected at most" in err
      and not os.path.exists(os.path.join(work, "rb_huge")), f"rollback_skip_steps 2^63 - 1: exit {rc}: {err[-800:]}")
rc, out, err = run(["check", *options(*ROLLBACK, "--optim.rollback_skip_steps", "9223372036854775807")])
check(rc == 3 and "schedule   FAILED: configuration error: optim.rollback_skip_steps" in out, f"check: exit {rc}: {out[-800:]}")
per_epoch = re.search(r"= (\d+) steps per epoch", out)
per_epoch = int(per_epoch.group(1)) if per_epoch else 0
rb = os.path.join(work, "rb_epoch")
rc, out, err = train(*ROLLBACK, "--optim.rollback_skip_steps", str(per_epoch), "--schedule.max_steps", "4", "--logging.run_dir", rb,
                     env={"SHARDTRAIN_FAULT": "bad_data:32-47"})  # step 3's samples
back = [l for l in map(json.loads, open(os.path.join(rb, "metrics.jsonl"))) if l["kind"] == "rollback"] if rc == 0 else []
# Step 3 read samples 32..47 of epoch 0, then an epoch of global batches is skipped: sample 48 of epoch 1, counted
# from the checkpoint of step 2 (sample 32 of epoch 0).
check(per_epoch > 3 and len(back) == 1 and back[0]["to_step"] == 2 and back[0]["skipped_samples"] == 16 * (per_epoch + 1),
      f"a rollback skipping {per_epoch} global batches: exit {rc}: {back}: {err[-1500:]}")

# 5. Batches past int32 and past any machine's memory.
BIG = ["--data.micro_batch_size", "1073741824", "--data.global_batch_size", "1073741824"]
rc, out, err = run(["check", *options(*BIG), "--nodes", "1", "--gpus-per-node", "4"])
check(rc == 3 and "world      FAILED: configuration error: data.micro_batch_size: 1073741824 sequences per rank x 4 ranks = "
      "4294967296 per micro-step" in out, f"check, micro-batch x 4 ranks past 2^31: exit {rc}: {out[-1500:]}")
rc, out, err = train(*BIG, "--logging.run_dir", os.path.join(work, "big2"), np=2)
check(rc == 3 and "data.micro_batch_size: 1073741824 sequences per rank x 2 ranks = 2147483648 per micro-step" in err,
      f"train, micro-batch x 2 ranks past 2^31: exit {rc}: {err[-1500:]}")
rc, out, err = train(*BIG, "--logging.run_dir", os.path.join(work, "big1"))
check(rc == 3 and "data.micro_batch_size: a training step needs at least" in err
      and "the activations of a micro-batch of 1073741824 x 128 tokens" in err and not os.path.exists(os.path.join(work, "big1")),
      f"a micro-batch no machine holds: exit {rc}: {err[-1500:]}")

# 6. Run lengths whose tokens pass int64; mixture weights summing to inf.
for key, value in (("schedule.max_tokens", "9223372036854775807"), ("schedule.epochs", "4611686018427387904")):
    rc, out, err = run(["check", *options("--schedule.max_steps", "0", f"--{key}", value)])
    check(rc == 3 and f"schedule   FAILED: configuration error: {key}: {value}" in out and "check: ok" not in out,
          f"check {key} {value}: exit {rc}: {out[-1500:]}")
    rc, out, err = train("--schedule.max_steps", "0", f"--{key}", value, "--logging.runs_root", os.path.join(work, "runs6"))
    check(rc == 3 and f"configuration error: {key}: {value}" in err and not os.path.exists(os.path.join(work, "runs6")),
          f"train {key} {value}: exit {rc}: {err[-1500:]}")
# A warmup as long as the run that epochs or max_tokens end (max_steps 0): check said ok, and train refused it after
# making the run directory (config.toml, a lock and a failure record left in it).
for key, value in (("schedule.epochs", "1"), ("schedule.max_tokens", "40000")):
    rc, out, err = run(["check", *options("--schedule.max_steps", "0", f"--{key}", value, "--schedule.warmup_steps", "100000")])
    check(rc == 3 and "schedule.warmup_steps: 100000 warmup steps leave no decay in a run of" in out and "check: ok" not in out,
          f"check {key} {value} with a longer warmup: exit {rc}: {out[-1500:]}")
    rc, out, err = train("--schedule.max_steps", "0", f"--{key}", value, "--schedule.warmup_steps", "100000",
                         "--logging.runs_root", os.path.join(work, "runs6w"))
    check(rc == 3 and "schedule.warmup_steps: 100000 warmup steps leave no decay in a run of" in err
          and not os.path.exists(os.path.join(work, "runs6w")), f"train {key} {value} with a longer warmup: exit {rc}: {err[-1500:]}")
ds2 = os.path.join(work, "copy.h5")
open(ds2, "wb").write(open(ds, "rb").read())
rc, out, err = train("--data.mixture", f"{ds}:1e308,{ds2}:1e308", "--logging.run_dir", os.path.join(work, "mix"))
check(rc == 3 and "data.mixture: the weights sum to inf" in err, f"mixture weights summing to inf: exit {rc}: {err[-1500:]}")

# 7. Messages: a run directory that is a file; one "training diverged".
afile = os.path.join(work, "afile")
open(afile, "w").write("x\n")
rc, out, err = train("--logging.run_dir", afile)
check(rc == 8 and f"I/O error: logging.run_dir: {afile} exists and is not a directory" in err, f"run_dir a file: exit {rc}: {err[-800:]}")
rc, out, err = train("--optim.max_consecutive_nonfinite", "2", "--logging.run_dir", os.path.join(work, "diverge"),
                     env={"SHARDTRAIN_FAULT": "nan_grad:2-3"})
check(rc == 9 and "E] training diverged: 2 steps in a row" in err and err.count("training diverged") == 1,
      f"divergence: exit {rc}: {error_lines(err)}")

check.finish("start_checks_test: all checks passed")
