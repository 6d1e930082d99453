#!/usr/bin/env python3
"""What a hostile week of command lines found (2026-11-27), each now one line and a documented exit code:
- counts whose product overflowed: plan and predict with --nodes x --gpus-per-node past 2^20 ranks (predict died of
  SIGFPE, plan said "world size 0"), and --gpus-per-node past 4096: exit 2 naming the options;
- rates and fractions that printed inf, NaN or negative step times (plan --gpu-tflops 0, --mfu nan or 5, a negative
  link speed): exit 2 naming the option;
- values that stood for "not given" inside and so were taken silently (bench ops --batch -1, bench model
  --intermediate -5, parity dump --pad-id -1) or crashed (bench model --warmup -1: a segfault): exit 2;
- predict --resume, which predict never read: an unknown option (2); an --ops-profile-exclude no profile row has (a
  typo excluded nothing): 2, with the profiles' ops;
- sizes past the memory (bench model --hidden 65536, bench attention of 1e5 x 1e5): 3 before any allocation, not
  std::bad_alloc as "internal error";
- an unknown or missing second-level command (bench foo, checkpoint frob, bench): exit 2 naming it and the list;
- an output file option that is empty or a folder (--json "" wrote nothing; --json DIR failed after the work with
  "internal error"): exit 2 before any work;
- a file system call that fails on a path (parity dump into a file's "folder"): exit 8 naming the call and the path,
  not 1 ("internal error");
- an offline command under a launcher with 2 processes (mpirun -np 2 consolidate): it runs once, on launcher rank 0,
  says so once, and exits 0 with the output whole (the two processes raced on one output and exited 8 after writing
  it);
- --resume with --checkpoint.resume (one silently won): 2; a config that is a folder (read as an empty config): 3
  saying so;
- evaluate of weights on a dataset of a larger vocabulary: 5 (weights of another tokenizer), not 3 naming a config key;
- a JSON result on a full file system (root only: a tmpfs): exit 8 naming "No space left on device", no file and no
  temporary left (result.json was renamed into place empty while the run exited 0);
- `train` started without a launcher (an MPI singleton) and failing: the error line alone, without Open MPI's
  MPI_ABORT banner (2026-11-29)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = os.path.abspath(args.shardtrain)
tiny = os.path.join(args.source, "configs/tiny-cpu.toml")
# The quickstart's dataset, made here (a clean clone has none before quickstart.sh runs).
os.makedirs(os.path.join(work, "dataset"))
_, dataset = clitest.prepare_dataset(args, clitest.corpus(args, "sotu"), os.path.join(work, "dataset"), 4096, "sotu-bpe4k",
                                     0.02)
os.makedirs(os.path.join(work, "a-folder"))


run = clitest.shardtrain_runner(args, work)


def expect(what, cmd, code, *needles, np=None, short=True):
    rc, out, err = run(cmd, np=np)
    first = [line for line in err.splitlines() if needles[0] in line]
    check(rc == code and all(n in err for n in needles) and "internal error" not in err,
          f"{what}: exit {rc} (expected {code}) naming {needles}: {err[-600:]}")
    check(len(first) == 1, f"{what}: one line with '{needles[0]}', got {len(first)}")
    check(not short or len(err) < 400, f"{what}: a short message, got {len(err)} characters")
    return rc, out, err


# Counts whose product overflowed.
expect("predict 65536 x 4096", ["predict", "-c", tiny, "--nodes", "65536", "--gpus-per-node", "4096"], 2,
       "--nodes 65536 x --gpus-per-node 4096: expected 1 to 1048576 ranks in all")
expect("predict --gpus-per-node 65536", ["predict", "-c", tiny, "--gpus-per-node", "65536"], 2,
       "--gpus-per-node: Value 65536 not in range 1 to 4096")
expect("plan 65536 x 32", ["plan", "--nodes", "65536", "--gpus-per-node", "32"], 2,
       "--nodes 65536 x --gpus-per-node 32: expected 1 to 1048576 ranks in all")
expect("check 2^20 x 2", ["check", "-c", tiny, "--nodes", str(2**20), "--gpus-per-node", "2"], 2,
       f"--nodes {2**20} x --gpus-per-node 2")
expect("predict --nodes 0", ["predict", "-c", tiny, "--nodes", "0"], 2, "--nodes: Value 0 not in range 1 to 1073741824")

# A storage dtype none of them takes: the option named, and what it takes ("unknown dtype 'fp16' (expected fp32, bf16,
# fp64, int32, int64, uint32 or uint8)" named neither).
for what, cmd, option in (("plan --param-dtype", ["plan", "-c", tiny, "--param-dtype", "fp16"], "--param-dtype"),
                          ("plan --reduce-dtype", ["plan", "-c", tiny, "--reduce-dtype", "int32"], "--reduce-dtype"),
                          ("bench ops --dtype", ["bench", "ops", "-c", tiny, "--dtype", "fp16"], "--dtype"),
                          ("consolidate --dtype", ["consolidate", "x", "-o", "y", "--dtype", "fp16"], "--dtype")):
    value = cmd[-1]
    expect(what, cmd, 2, f"usage error: {option}: {value}: expected fp32 or bf16")

# Rates and fractions.
# From a thousandth: --mfu 1e-300 printed a step time of 300 digits.
for option, value, needle in (("--gpu-tflops", "0", "0: expected a number from 0.001 to 1000000"),
                              ("--gpu-tflops", "-1", "-1: expected a number from 0.001"),
                              ("--mfu", "nan", "nan: expected a number from 0.001 to 1"),
                              ("--mfu", "5", "5: expected a number from 0.001 to 1"),
                              ("--mfu", "1e-300", "1e-300: expected a number from 0.001 to 1"),
                              ("--inter-gbps", "-1", "-1: expected a number from 0.001"),
                              ("--intra-gbps", "inf", "inf: expected a number from 0.001"),
                              ("--mfu", "0.5x", "0.5x: expected a number")):
    expect(f"plan {option} {value}", ["plan", "--nodes", "2", "--gpus-per-node", "2", option, value], 2,
           f"{option}: {needle}")
rc, out, _ = run(["plan", "--nodes", "2", "--gpus-per-node", "2", "--mfu", "1", "--gpu-tflops", "989", "--json"])
check(rc == 0 and json.loads(out)["strategies"], f"plan at the bounds (--mfu 1): exit {rc}")

# Values that stood for "not given".
expect("bench model --warmup -1", ["bench", "model", "--warmup", "-1"], 2, "--warmup: Value -1 not in range 0 to 100000")
expect("bench model --intermediate -5", ["bench", "model", "--intermediate", "-5"], 2, "--intermediate: Value -5")
expect("bench ops --batch -1", ["bench", "ops", "--batch", "-1"], 2, "--batch: Value -1 not in range 1")
expect("bench ops --layers 0", ["bench", "ops", "--layers", "0"], 2, "--layers: Value 0 not in range 1")
expect("parity dump --pad-id -1", ["parity", "dump", "-c", tiny, "-o", "pd", "--pad-id", "-1"], 2,
       "--pad-id: Value -1 not in range 0")
check(not os.path.exists(os.path.join(work, "pd")), "parity dump refused before making its folder")
expect("predict --resume", ["predict", "-c", tiny, "--resume", "auto"], 2, "--resume")
expect("predict --ops-profile-exclude typo", ["predict", "-c", tiny, "--ops-profile",
                                              os.path.join(args.source, "profiles/h200/seed-b64-s512.json"),
                                              "--ops-profile-exclude", "attention_fwd"], 2,
       "--ops-profile-exclude attention_fwd: no row of the profiles is that op (theirs: attention_backward, attention_forward")
expect("predict --ops-profile of a tokenizer", ["predict", "-c", tiny, "--ops-profile",
                                                os.path.join(args.source, "configs/README.md")], 3,
       "README.md: not valid JSON (expected `shardtrain bench ops --json` output)")

# Sizes past the memory: refused by size before anything is allocated (std::bad_alloc, "internal error", before).
expect("bench model --hidden 65536", ["bench", "model", "--hidden", "65536", "--layers", "1", "--seq", "64", "--vocab",
                                      "64", "--iters", "1"], 3,
       "bench model: 6.87e+10 parameters need 512 GiB of f32 weights and gradients, more than this host's", short=False)
expect("bench attention 1e5 x 1e5", ["bench", "attention", "--shape", "100000,100000,64,64,128", "--iters", "1",
                                     "--warmup", "0"], 3,
       "bench attention: --shape '100000,100000,64,64,128' needs about 3.66e+06 GiB, more than the", short=False)

# Two answers to one question, and a config that is a folder (it read as an empty config: "schedule.max_steps").
expect("--resume and --checkpoint.resume", ["train", "-c", tiny, "--resume", "auto", "--checkpoint.resume", "x",
                                          "--print-config"], 2,
       "--resume auto and --checkpoint.resume x: give one of them", np=1, short=False)
expect("-c FOLDER", ["train", "-c", "a-folder", "--print-config"], 3,
       "a-folder: is a folder (expected a TOML file", np=1, short=False)

# Second-level commands.
expect("bench foo", ["bench", "foo"], 2, "unknown bench command 'foo' (expected one of: model, ops, step, attention, comm")
expect("checkpoint frob", ["checkpoint", "frob", "x"], 2, "unknown checkpoint command 'frob' (expected one of: info")
expect("bench", ["bench"], 2, "bench: no command given (expected one of: model, ops")

# Command-line errors in the one-line format of every error (docs/exit-codes.md), not CLI11's own.
_, _, err = expect("a key given twice", ["train", "-c", tiny, "--model.hidden_size", "64", "--model.hidden_size", "32"], 2,
                   "usage error: --model.hidden_size: given 2 times; give it once (see shardtrain train --help)")
check(err.startswith("[r0") and "Run with --help" not in err, f"the log line's format: {err!r}")
_, _, err = expect("an unknown key", ["check", "-c", tiny, "--model.hidden_sizee", "64"], 2,
                   "usage error: --model.hidden_sizee: unknown key 'model.hidden_sizee' (the keys of [model] are: ",
                   short=False)
check("hidden_size, " in err or "hidden_size)" in err, f"the section's keys are listed: {err!r}")
expect("an unknown option", ["plan", "--frobnicate"], 2, "usage error: The following argument was not expected: --frobnicate")
expect("an unknown command", ["trian"], 2, "usage error: unknown command 'trian' (expected one of: ")
# Sizes whose activation bytes wrapped int64 (plan printed 12884901888 GiB for about 3.9e14): refused, not printed.
expect("plan 2^30 x 2^30", ["plan", "--micro-batch", str(2**30), "--seq", str(2**30)], 3,
       f"configuration error: a micro-batch of {2**30} x {2**30} tokens needs more than an exabyte", short=False)
rc, out, _ = run(["plan", "--micro-batch", "1", "--seq", str(2**30)])
check(rc == 0 and "GiB" in out, f"plan at seq 2^30, micro-batch 1, still plans: exit {rc}")

# Output file options, before any work.
expect("predict --json ''", ["predict", "-c", tiny, "--json", ""], 2, "--json: expected a file name")
expect("predict --trace FOLDER", ["predict", "-c", tiny, "--trace", "a-folder"], 2,
       "--trace: a-folder is a folder: expected a file name")
expect("evaluate --json FOLDER", ["evaluate", "-w", "nowhere", "--json", "a-folder"], 2,
       "--json: a-folder is a folder: expected a file name")
expect("bench ops --json ''", ["bench", "ops", "--json", ""], 2, "--json: expected a file name")
# Written after the work: a folder that is not there ended an evaluation of every checkpoint with exit 8, nothing shown.
# Unsigned values: "-1" was read as 2^64 - 1 without a word. A split pattern that does not compile is a bad value (2),
# not a data error (4).
expect("generate --seed -1", ["generate", "-w", "nowhere", "--prompt", "x", "--seed", "-1"], 2, "--seed: -1: expected 0 or more")
expect("tokenizer train --pattern (", ["tokenizer", "train", "--input", clitest.corpus(args, "moby-dick"), "--output", "t.json", "--pattern", "("], 2,
       "usage error: --pattern: split pattern does not compile at offset 1: missing closing parenthesis")
expect("evaluate --json in no folder", ["evaluate", "-w", "nowhere", "--json", "no-such-folder/x.json"], 2,
       "--json: no-such-folder/x.json: its folder no-such-folder does not exist (the file is written after the work)")

# A file system call that fails on a path: an I/O error (8), with the call's own words and the path.
open(os.path.join(work, "a-file"), "w").write("x\n")
expect("parity dump -o a-file/sub", ["parity", "dump", "-c", tiny, "-o", "a-file/sub"], 8,
       "I/O error: filesystem error:", "Not a directory", "a-file/sub")

# An offline command under mpirun -np 2: once, on launcher rank 0.
rc, out, err = run(["predict", "-c", tiny, "--nodes", "1", "--gpus-per-node", "2", "--json", "p.json"], np=2)
check(rc == 0 and err.count("predict is an offline command: it runs once, here (launcher rank 0); the other 1 "
                            "processes exit at once") == 1 and out.count("PREDICTION, not a measurement") == 1,
      f"predict under mpirun -np 2: exit {rc}, one report and one warning: {out[-400:]} {err[-600:]}")
check(json.load(open(os.path.join(work, "p.json")))["prediction"] is True, "predict's JSON, written once")
check(not [f for f in os.listdir(work) if f.startswith("p.json.tmp")], "no temporary left beside p.json")

# A tiny run's weights for the evaluations below.
rc, out, err = run(["train", "-c", tiny, "--logging.run_dir", "run", "--schedule.max_steps", "1",
                    "--checkpoint.every_n_steps", "1", "--schedule.warmup_steps", "0", "--schedule.eval_every", "0",
                    "--logging.progress", "lines", "--data.path", dataset], np=1)
check(rc == 0, f"the tiny run: exit {rc}: {err[-800:]}")
weights = "run/checkpoints/step_00000001"

# A dataset of a larger vocabulary than the weights' (GPT-2's 50257 ids against the run's 4096): weights trained
# with another tokenizer (5), not a config key to raise (3, "model.vocab_size", before).
corpus = os.path.join(args.source, "data/fetched/corpus/sotu/1790_george_washington_n.txt")
subprocess.run([st, "prepare-data", "-t", os.path.join(args.source, "data/fetched/tokenizers/r50k_base.tiktoken"),
                "-i", corpus, "-o", os.path.join(work, "gpt2.h5"), "--log-level", "warn"], check=True, capture_output=True)
expect("evaluate on a GPT-2 dataset", ["evaluate", "-w", weights, "--data.path", "gpt2.h5", "--batches", "1"], 5,
       f"{weights}: a model of 4096 token ids, but gpt2.h5 holds ids of r50k_base (50257)", np=1, short=False)

# A JSON result on a full file system (a tmpfs, so root only): exit 8 and the reason, nothing left behind.
full = os.path.join(work, "full")
os.makedirs(full)
if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full]).returncode == 0:
    try:
        fd = os.open(os.path.join(full, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # No space left on device: the disk is full
            pass
        os.close(fd)
        # evaluate's --json goes through the writer of the trainer's result.json (write_json_file).
        expect("evaluate --json on a full disk",
               ["evaluate", "-w", weights, "--batches", "1", "--json", os.path.join(full, "e.json")],
               8, "cannot write the evaluation (--json): No space left on device", np=1, short=False)
        check(sorted(os.listdir(full)) == ["filler"], f"nothing left on the full disk: {os.listdir(full)}")
    finally:
        subprocess.run(["umount", full])
else:
    print("full disk: skipped (needs root to mount a tmpfs)")

# `shardtrain train` typed alone (an MPI singleton, no launcher) on a missing dataset: the one error line and its code,
# without Open MPI's MPI_ABORT banner (it has no other rank to end) nor its "ORTE_ERROR_LOG" line, seen under it.
rc, out, err = run(["train", "-c", tiny, "--logging.run_dir", "alone", "--data.path", "no-such.h5"])
check(rc == 4 and "no-such.h5: no such file" in err and "MPI_ABORT" not in err + out and "ORTE_ERROR_LOG" not in err + out,
      f"train alone on a missing dataset: exit {rc} (expected 4), one line without MPI's banner: {err[-800:]}")
rc, out, err = run(["train", "-c", tiny, "--logging.run_dir", "under-mpirun", "--data.path", "no-such.h5"], np=2)
check(rc == 4 and "no-such.h5: no such file" in err, f"the same under mpirun -np 2: exit {rc} (expected 4): {err[-800:]}")

check.finish("PASS: bad command lines")
