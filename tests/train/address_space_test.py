#!/usr/bin/env python3
"""`shardtrain train` under an address-space limit (`ulimit -v`, RLIMIT_AS; a login node's limit that sbatch
carries into the job): OpenBLAS 0.3 retries a failed buffer allocation without end, so a run short of address
space used to spin in its first GEMM until the job's time ran out. Through the binary, on a tiny model:
- limits from 1.4 GB up in steps of 0.2 GB until a run trains: every run ends within a minute (no hang); each ends
  with exit 3 naming the address-space limit and how to raise it, or exit 7 out of host memory whose failure
  record is not restartable and blames no node, or trains (exit 0, a finite loss); never in another way, never a
  refusal after a limit that trained, and both a refusal and a run that trains occur;
- a refusal on 2 ranks under mpirun is one error line, exit 3, and leaves no checkpoint behind;
- `evaluate` and `bench model` under a limit too tight for OpenBLAS are exit 7 at once (they hung), and an evaluate
  batch past the limit is exit 7 out of host memory (it was an internal error, exit 1)."""
import json
import math
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
tok, ds = clitest.prepare_dataset(args, clitest.corpus(args, "sotu"), work, 4096, "sotu-bpe4k", 0.02)

TINY = ["--config", os.path.join(args.source, "configs/tiny-cpu.toml"), "--data.path", ds, "--model.hidden_size", "64",
        "--model.intermediate_size", "128", "--model.num_hidden_layers", "2", "--model.num_attention_heads", "4",
        "--data.global_batch_size", "8", "--schedule.warmup_steps", "0", "--schedule.max_steps", "2",
        "--schedule.eval_every", "0", "--checkpoint.every_n_steps", "1", "--logging.progress", "lines"]
GB = 10**9


def train(limit, run_dir, np=None):
    """(returncode or None for a run still going after 60 s, stderr) of a run under RLIMIT_AS = limit bytes."""
    st = os.path.abspath(args.shardtrain)
    cmd = [st, "train", *TINY, "--logging.run_dir", run_dir]
    if np:
        cmd = [args.mpiexec, "--oversubscribe", "-np", str(np), *cmd]
    env = {k: v for k, v in os.environ.items() if k != "SHARDTRAIN_RANKS_PER_NODE"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", cwd=work,
                         env=env, start_new_session=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    try:
        _, err = p.communicate(timeout=60)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        _, err = p.communicate()
        return None, err


def errors(err):
    return [line for line in err.splitlines() if " E] " in line]


def record(run_dir):
    d = os.path.join(run_dir, "failures")
    files = sorted(os.listdir(d)) if os.path.isdir(d) else []
    return json.load(open(os.path.join(d, files[0]))) if files else {}


outcomes = []
limit = 14 * GB // 10
while limit <= 8 * GB:
    run_dir = os.path.join(work, f"as_{limit // (GB // 10)}")
    rc, err = train(limit, run_dir)
    where = f"RLIMIT_AS {limit / GB:.1f} GB: exit {rc}: {err[-1200:]}"
    check(rc is not None, f"a hang: {where}")
    if rc == 3:
        e = errors(err)
        check(len(e) == 1 and "the process's address-space limit (ulimit -v: " in e[0] and "mapped already" in e[0]
              and "raise the limit (`ulimit -v unlimited` before launching; under Slurm, submit with --propagate=NONE"
              in e[0], f"the refusal's message: {where}")
        check(not os.path.isdir(os.path.join(run_dir, "checkpoints", "step_00000001")), f"a refused run saved: {where}")
    elif rc == 7:
        r = record(run_dir)
        check("out of host memory" in r.get("message", "") and r.get("restartable") is False
              and r.get("suspect_nodes") == [], f"out of host memory, its record {r}: {where}")
    elif rc == 0:
        result = json.load(open(os.path.join(run_dir, "result.json")))
        check(result.get("status") == "finished" and math.isfinite(result.get("last_loss", float("nan"))),
              f"the run that trained: {result}")
    elif rc == 127 and outcomes == [] and "error while loading shared libraries" in err:
        pass  # a limit under what the libraries map: the dynamic loader's refusal, before shardtrain runs
    else:
        check(False, f"ended in none of the documented ways: {where}")
    outcomes.append(rc)
    print(f"RLIMIT_AS {limit / GB:.1f} GB: exit {rc}")
    if rc in (0, None):
        break
    limit += 2 * GB // 10

check(3 in outcomes and outcomes[-1] == 0, f"expected refusals, then a run that trains: {outcomes}")
check(all(rc != 0 for rc in outcomes[:-1]), f"a refusal after a limit that trained: {outcomes}")

# The smallest refused limit once more, on two ranks (each with fewer threads: less kept for them): one error line
# for the job, exit 3, nothing saved.
refused = [14 * GB // 10 + i * 2 * GB // 10 for i, rc in enumerate(outcomes) if rc == 3]
if refused:
    run_dir = os.path.join(work, "as_two_ranks")
    rc, err = train(refused[0], run_dir, np=2)
    e = errors(err)
    check(rc == 3 and len(e) == 1 and "address-space limit" in e[0], f"2 ranks: exit {rc}, {len(e)} error lines: {err[-1500:]}")
    check(not os.path.isdir(os.path.join(run_dir, "checkpoints", "step_00000001")), "2 ranks: a refused run saved")

# evaluate: the same limits. One that leaves less than threads and OpenBLAS take is refused at once (it hung: 1.6 and
# 1.8 GB ran past any timeout); one that leaves them room but not the batch ends out of host memory, exit 7 (it was
# "internal error: std::bad_alloc", exit 1): a micro-batch of 2048 x 128 has 1 GiB of logits per 256 rows.
def evaluate(limit, *extra):
    st = os.path.abspath(args.shardtrain)
    trained = os.path.join(work, f"as_{(14 + 2 * (len(outcomes) - 1))}")
    cmd = [st, "evaluate", "-w", os.path.join(trained, "checkpoints"), "-c", os.path.join(trained, "config.toml"),
           "--batches", "1", *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", cwd=work,
                         start_new_session=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    try:
        return p.communicate(timeout=60)[1], p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        return p.communicate()[1], None


if refused and outcomes[-1] == 0:
    err, rc = evaluate(refused[0])
    e = errors(err)
    check(rc == 7 and len(e) == 1 and "out of host memory before evaluate started: the process's address-space limit"
          in e[0] and "`ulimit -v unlimited`" in e[0], f"evaluate under {refused[0] / GB:.1f} GB: exit {rc}: {err[-1500:]}")
    print(f"evaluate under {refused[0] / GB:.1f} GB: exit {rc}")
    # bench runs GEMMs too: refused the same way (bench model hung like evaluate).
    b = subprocess.run([os.path.abspath(args.shardtrain), "bench", "model"], capture_output=True, text=True, cwd=work,
                       timeout=60, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (refused[0], refused[0])))
    check(b.returncode == 7 and "out of host memory before bench started" in b.stderr,
          f"bench model under {refused[0] / GB:.1f} GB: exit {b.returncode}: {b.stderr[-800:]}")
    trained_limit = 14 * GB // 10 + (len(outcomes) - 1) * 2 * GB // 10
    err, rc = evaluate(trained_limit + 2 * GB // 10, "--split", "train", "--data.micro_batch_size", "2048",
                       "--data.global_batch_size", "2048")
    e = errors(err)
    check(rc == 7 and len(e) == 1 and "out of host memory in evaluate (std::bad_alloc)" in e[0],
          f"evaluate of a batch past the limit: exit {rc}: {err[-1500:]}")
    print(f"evaluate of 2048 x 128 under {(trained_limit + 2 * GB // 10) / GB:.1f} GB: exit {rc}")

check.finish(f"address-space limits: {len(outcomes)} runs, none hung, outcomes {outcomes}")
