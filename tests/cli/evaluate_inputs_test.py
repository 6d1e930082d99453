#!/usr/bin/env python3
"""`shardtrain evaluate` and its inputs (a 4-step 2-rank run, its checkpoint, consolidated file and Hugging Face export):
1. --json never replaces what is there: an HDF5 or safetensors file (weights, a dataset, a checkpoint's index.h5), a file
   inside a checkpoint, a device other than /dev/null (kept a device: written in place), a FIFO, nor one of the
   evaluation's inputs however spelled (a link, ../, a file in the weights' folder, the config, a tokenizer): exit 2, the
   input byte for byte as it was; /dev/null and /dev/stdout are written in place. Before, each was replaced by the JSON.
2. A Hugging Face directory's tokenizer.json is checked against the dataset's tokenizer as a checkpoint's record is
   (evaluate and train's checkpoint.init_from: exit 5); one without tokenizer.json is evaluated with a warning. Before,
   both ran on the other tokenizer's ids.
3. evaluate validates only the keys it reads: a --config without [schedule], a warmup longer than the run, a
   micro-batch that does not divide the global batch, a rollback without checkpoints evaluate (with the same loss);
   train still refuses them. Before, exit 3.
4. An empty validation split is said to be empty, with what to do (evaluate: exit 4; train: a warning); a split with
   tokens but fewer than one sequence keeps its seq_len message.
5. Ranks given other --split or --batches (exit 2), or that find other newest checkpoints in --weights' folder (exit
   5); a mixture with a source of another tokenizer (exit 4); --json over the training run's config.toml, metrics or
   result.json (exit 2, unchanged); a --model override said to be unused; generate without a prompt begins a packed
   run's model from EOT; ids with a leading 0 read as decimal."""
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = os.path.abspath(args.shardtrain)
moby = clitest.corpus(args, "moby-dick")
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby512", 0.1)
other_tok, other = clitest.prepare_dataset(args, moby, work, 384, "moby384", 0.1)  # another tokenizer, same texts

SEQ, GB = 32, 8
config = os.path.join(work, "run.toml")
with open(config, "w") as f:
    f.write(f"""[model]
vocab_size = 512
max_position_embeddings = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 1

[schedule]
warmup_steps = 1
max_steps = 4
eval_every = 2
eval_batches = 1

[data]
path = "{ds}"
seq_len = {SEQ}
global_batch_size = {GB}

[checkpoint]
every_n_steps = 4

[logging]
progress = "off"
peak_flops = 1e10
""")


def run(cmd, np=None):
    full = [args.mpiexec, "--oversubscribe", "-np", str(np), st, *cmd] if np else [st, *cmd]
    return subprocess.run(full, capture_output=True, text=True, errors="replace", cwd=work)


p = run(["train", "-c", config, "--logging.run_dir", "run"], np=2)
if p.returncode != 0:
    check(False, f"the training run: exit {p.returncode}: {p.stderr[-2000:]}")
    check.finish("")
step = os.path.join("run", "checkpoints", "step_00000004")
for out, extra in (("w.h5", []), ("hf", ["--format", "safetensors"])):
    subprocess.run([st, "consolidate", step, "-o", out, *extra, "--log-level", "warn"], check=True, cwd=work)


def digest(path):
    """sha256 of a file, or of every file of a folder with its names."""
    path = os.path.join(work, path)
    h = hashlib.sha256()
    if os.path.isdir(path):
        for root, _, files in sorted(os.walk(path)):
            for n in sorted(files):
                h.update(os.path.relpath(os.path.join(root, n), path).encode())
                h.update(open(os.path.join(root, n), "rb").read())
    else:
        h.update(open(path, "rb").read())
    return h.hexdigest()


def evaluate(*extra, np=None):
    return run(["evaluate", "--batches", "1", *extra], np=np)


hf = ["-w", "hf", "-c", config]

# ---- 2. a Hugging Face directory's tokenizer against the dataset's ------------------------------------------------
theirs = "moby384.json (fnv1a64:"  # the dataset's tokenizer, as the dataset names it
for weights in ("hf", "w.h5", "run/checkpoints"):
    p = evaluate("-w", weights, "-c", config, "--data.path", other, "--split", "train", "--json", "x.json", np=2)
    named = step if weights == "run/checkpoints" else weights  # a directory of checkpoints: its newest
    check(p.returncode == 5 and f"{named}: trained with tokenizer" in p.stderr and theirs in p.stderr
          and f"but data.path {other} was tokenized with" in p.stderr and not os.path.exists(os.path.join(work, "x.json")),
          f"evaluate -w {weights} on another tokenizer's dataset: exit 5: exit {p.returncode}: {p.stderr[-800:]}")
check("hf: trained with tokenizer hf/tokenizer.json" in evaluate("-w", "hf", "-c", config, "--data.path", other).stderr,
      "the message names the shipped tokenizer.json")
p = evaluate("-w", "hf", "-c", config, np=2)
check(p.returncode == 0 and "cannot be checked" not in p.stderr, f"hf on its own tokenizer's dataset: exit {p.returncode}: {p.stderr[-800:]}")
shutil.copytree(os.path.join(work, "hf"), os.path.join(work, "hf-notok"))
os.unlink(os.path.join(work, "hf-notok", "tokenizer.json"))
p = evaluate("-w", "hf-notok", "-c", config, "--data.path", other, "--split", "train", np=2)
check(p.returncode == 0 and p.stderr.count("cannot be checked") == 1 and "hf-notok: no tokenizer recorded" in p.stderr,
      f"a Hugging Face directory without tokenizer.json: evaluated, one warning: exit {p.returncode}: {p.stderr[-800:]}")
p = run(["train", "-c", config, "--data.path", other, "--checkpoint.init_from", "hf", "--schedule.max_steps", "2",
         "--logging.run_dir", "init"], np=2)
check(p.returncode == 5 and "hf: trained with tokenizer hf/tokenizer.json" in p.stderr and theirs in p.stderr
      and not os.path.exists(os.path.join(work, "init", "metrics.jsonl")),
      f"train --checkpoint.init_from hf on another tokenizer's dataset: exit 5, nothing trained: exit {p.returncode}: {p.stderr[-800:]}")

# ---- 3. only what evaluate reads is validated ----------------------------------------------------------------
eval_toml = os.path.join(work, "eval.toml")
open(eval_toml, "w").write(f'[data]\npath = "{ds}"\nseq_len = {SEQ}\nglobal_batch_size = {GB}\n')


def loss_of(*argv):
    out = os.path.join(work, "loss.json")
    if os.path.exists(out):
        os.unlink(out)
    p = evaluate("-w", "hf", *argv, "--json", out, np=2)
    return p, (json.load(open(out)) if p.returncode == 0 else None)


_, base = loss_of("-c", config)
check(base is not None and base["sources"][0]["sequences"] == GB, f"the run's config: {base}")
for argv, what in ((["-c", eval_toml], "a config of [data] alone (no run length)"),
                   (["-c", config, "--schedule.warmup_steps", "10"], "warmup steps past schedule.max_steps"),
                   (["-c", config, "--optim.on_divergence", "rollback", "--checkpoint.every_n_steps", "0"],
                    "rollback without checkpoints"),
                   (["-c", config, "--schedule.max_steps", "0"], "no run length"),
                   (["-c", config, "--logging.metrics_file", "a/b"], "a metrics file that is no plain name")):
    p, j = loss_of(*argv)
    check(p.returncode == 0 and base is not None and j is not None and j["loss"] == base["loss"],
          f"{what}: evaluated, the same loss {base and base['loss']!r}: exit {p.returncode}: {j and j['loss']!r} {p.stderr[-600:]}")
p, j = loss_of("-c", config, "--data.micro_batch_size", "3")  # 8 is not a multiple of 3: no matter to evaluation
check(p.returncode == 0 and j is not None and j["sources"][0]["sequences"] == 3 * 2 and j["tokens"] == 3 * 2 * SEQ,
      f"--data.micro_batch_size 3 on 2 ranks: one batch of 6 sequences: exit {p.returncode}: {j} {p.stderr[-600:]}")
for argv, said in ((["--data.seq_len", "0"], "data.seq_len: expected 1 or more, got 0"),
                   (["--data.seq_len", "128"], "data.seq_len: 128 is longer than model.max_position_embeddings = 64"),
                   (["--fsdp.startup_timeout", "-1"], "fsdp.startup_timeout"),
                   (["--data.global_batch_size", "1"], "data.global_batch_size: 1 sequence(s) leave none to each of 2 ranks")):
    p = evaluate("-w", "hf", "-c", config, *argv, np=2)
    check(p.returncode == 3 and said in p.stderr, f"evaluate {argv}: still exit 3, '{said}': exit {p.returncode}: {p.stderr[-600:]}")
for argv, said in ((["--data.micro_batch_size", "3"], "data.global_batch_size: 8 is not a multiple of data.micro_batch_size = 3"),
                   (["--schedule.warmup_steps", "10"], "warmup steps leave nothing to decay"),
                   (["--optim.on_divergence", "rollback", "--checkpoint.every_n_steps", "0"], "optim.on_divergence")):
    p = run(["train", "-c", config, *argv, "--logging.run_dir", "refused"])
    check(p.returncode == 3 and said in p.stderr, f"train {argv}: still exit 3, '{said}': exit {p.returncode}: {p.stderr[-600:]}")

# ---- 4. an empty validation split ------------------------------------------------------------------------------
noval = os.path.join(work, "noval.h5")
subprocess.run([st, "prepare-data", "-t", tok, "-i", moby, "-o", noval, "--validation-fraction", "0", "--log-level", "warn"], check=True)
p = evaluate("-w", "hf", "-c", config, "--data.path", noval, np=2)
check(p.returncode == 4 and "the validation split is empty (0 documents, 0 tokens)" in p.stderr
      and "--validation-fraction above 0" in p.stderr and "--split train" in p.stderr and "no packed sample" not in p.stderr,
      f"evaluate on an empty validation split: exit 4, said empty, what to do: exit {p.returncode}: {p.stderr[-1200:]}")
p = evaluate("-w", "hf", "-c", config, "--data.path", noval, "--split", "train", np=2)
check(p.returncode == 0, f"--split train of it: exit {p.returncode}: {p.stderr[-600:]}")
p = run(["train", "-c", config, "--data.path", noval, "--schedule.max_steps", "2", "--logging.run_dir", "noval_run"], np=2)
check(p.returncode == 0 and p.stderr.count("the validation split is empty (0 documents, 0 tokens)") == 1
      and "--validation-fraction above 0" in p.stderr and "no packed sample" not in p.stderr,
      f"train on it: one warning, said empty: exit {p.returncode}: {p.stderr[-1200:]}")
# Tokens, but fewer than one sequence: the seq_len message stays.
short = os.path.join(work, "short")
os.makedirs(short)
for i in range(10):
    open(os.path.join(short, f"doc_{i}.txt"), "w").write("the whale ")
short_ds = os.path.join(work, "short.h5")
subprocess.run([st, "prepare-data", "-t", tok, "-i", short, "-o", short_ds, "--validation-fraction", "0.2", "--log-level", "warn"],
               check=True)
p = evaluate("-w", "hf", "-c", config, "--data.path", short_ds, "--data.seq_len", "64")
check(p.returncode == 4 and "the validation split has no packed sample of seq_len 64" in p.stderr and "is empty" not in p.stderr,
      f"a validation split shorter than one sequence: exit 4, its seq_len message: exit {p.returncode}: {p.stderr[-800:]}")

# ---- 1. --json over what is there (last: a binary that replaced these inputs spoils nothing above) -----------
refusals = [
    # (arguments, the file that must stay as it was, what the message says)
    (["-w", "w.h5", "-c", config, "--json", "w.h5"], "w.h5", "--json: w.h5 is an HDF5 file"),
    ([*hf, "--json", "hf/model.safetensors"], "hf", "--json: hf/model.safetensors is a safetensors file"),
    ([*hf, "--json", ds], ds, f"--json: {ds} is an HDF5 file"),
    ([*hf, "--data.mixture", f"{ds}:1,{other}:1", "--data.path", "", "--json", other], other, f"--json: {other} is an HDF5 file"),
    ([*hf, "--json", f"{step}/index.h5"], "run/checkpoints", f"--json: {step}/index.h5 is an HDF5 file"),
    ([*hf, "--json", f"{step}/eval.json"], "run/checkpoints", f"--json: {step}/eval.json lies in the checkpoint"),
    ([*hf, "--json", "/dev/zero"], None, "--json: /dev/zero is a character device, not a file"),
]
fifo = os.path.join(work, "fifo")
os.mkfifo(fifo)
refusals.append(([*hf, "--json", "fifo"], None, "--json: fifo is a FIFO (named pipe), not a file"))
if os.geteuid() == 0:  # a device node of our own, with the zero device's numbers
    os.mknod(os.path.join(work, "myzero"), 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    refusals.append(([*hf, "--json", "myzero"], None, "--json: myzero is a character device, not a file"))
# The evaluation's own inputs, however spelled (evaluate's check: a config or a tokenizer is a text file any --json may
# name, and a file in the weights' folder may be a new one).
os.symlink("run.toml", os.path.join(work, "config-link.toml"))
os.makedirs(os.path.join(work, "sub"))
refusals += [
    ([*hf, "--json", "config-link.toml"], "run.toml", "--json config-link.toml: is the config --config"),
    ([*hf, "--json", "sub/../run.toml"], "run.toml", "--json sub/../run.toml: is the config --config"),
    ([*hf, "--json", "hf/tokenizer.json"], "hf", "--json hf/tokenizer.json: lies in the weights --weights (hf)"),
    ([*hf, "--json", "hf/new.json"], "hf", "--json hf/new.json: lies in the weights --weights (hf)"),
    (["-w", "run/checkpoints", "--every-checkpoint", "--json", "run/checkpoints/all.json"], "run/checkpoints",
     "--json run/checkpoints/all.json: lies in the weights --weights"),
    ([*hf, "--tokenizer", tok, "--json", tok], tok, f"--json {tok}: is the tokenizer --tokenizer"),
    ([*hf, "--json", tok], tok, f"--json {tok}: is the dataset's tokenizer"),
]
for argv, keep, said in refusals:
    before = digest(keep) if keep else None
    p = evaluate(*argv)
    check(p.returncode == 2 and said in p.stderr and (keep is None or digest(keep) == before),
          f"{' '.join(argv)}: exit 2, '{said}', {keep} unchanged: exit {p.returncode}: {p.stderr[-800:]}")
check(not os.path.exists(os.path.join(work, step, "eval.json")), "no JSON written into the checkpoint")
check(not os.path.exists(os.path.join(work, "hf", "new.json")), "no JSON written into the weights' folder")
check(stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO is still a FIFO")
p = run(["checkpoint", "info", step])
check(p.returncode == 0, f"checkpoint info after --json {step}/index.h5 was refused: exit {p.returncode}: {p.stderr[-600:]}")
# The null device and this process's standard output: written in place, never replaced.
p = evaluate(*hf, "--json", "/dev/null")
check(p.returncode == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode), f"--json /dev/null: exit {p.returncode}: {p.stderr[-600:]}")
if os.geteuid() == 0:
    mynull = os.path.join(work, "mynull")
    os.mknod(mynull, 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    p = evaluate(*hf, "--json", "mynull")
    check(p.returncode == 0 and stat.S_ISCHR(os.stat(mynull).st_mode),
          f"--json mynull (c 1 3): exit 0, still a character device: exit {p.returncode}, mode {oct(os.stat(mynull).st_mode)}")
p = evaluate(*hf, "--json", "/dev/stdout")
tail = p.stdout[p.stdout.find("{"):] if "{" in p.stdout else ""
try:
    printed = json.loads(tail)
except ValueError:
    printed = None
check(p.returncode == 0 and printed is not None and printed["weights"] == "hf" and printed["loss"] > 0,
      f"--json /dev/stdout: the JSON after the report: exit {p.returncode}: {p.stdout[-800:]} {p.stderr[-400:]}")
# An ordinary text file is still written over, whole.
open(os.path.join(work, "old.json"), "w").write("old\n")
p = evaluate(*hf, "--json", "old.json")
check(p.returncode == 0 and json.load(open(os.path.join(work, "old.json")))["weights"] == "hf",
      f"--json over a text file: exit {p.returncode}: {p.stderr[-600:]}")

# Weights without a run config and no dataset: said for what it is (it was "data.path: expected the dataset file").
for weights in ("w.h5", "hf"):
    p = evaluate("-w", weights)
    check(p.returncode == 3 and f"{weights}: these weights carry no run configuration" in p.stderr and "--data.path DATASET" in p.stderr,
          f"evaluate -w {weights} alone: exit {p.returncode}: {p.stderr[-600:]}")

# consolidate, prepare-data and tokenizer train into a checkpoint, or into a folder named as a save names one in the
# run's checkpoint directory: refused (exit 2), nothing written. A rotation, or the next start's cleanup of what looked
# like an unfinished save, deleted the export there without a word.
os.makedirs(os.path.join(work, "run", "checkpoints", "step_00000100"))
for argv, place in ((["consolidate", step, "-o", f"{step}/model.h5"], f"{step}/model.h5"),
                    (["consolidate", step, "-o", "run/checkpoints/step_00000100/model.h5"], "run/checkpoints/step_00000100/model.h5"),
                    (["consolidate", step, "-o", "run/checkpoints/step_00000100/hf", "--format", "safetensors"],
                     "run/checkpoints/step_00000100/hf"),
                    (["prepare-data", "-t", tok, "-i", short, "-o", f"{step}/data.h5"], f"{step}/data.h5"),
                    (["tokenizer", "train", "-i", short, "-o", "run/checkpoints/step_00000100/tok.json", "--vocab-size", "300"],
                     "run/checkpoints/step_00000100/tok.json"),
                    # A later step's name, not saved yet: the live run's save of that step set the export aside as .foreign.
                    (["consolidate", step, "-o", "run/checkpoints/step_00000900"], "run/checkpoints/step_00000900"),
                    (["consolidate", step, "-o", "run/checkpoints/step_00000901", "--format", "safetensors"],
                     "run/checkpoints/step_00000901")):
    p = run(argv)
    check(p.returncode == 2 and f"{place} lies in the checkpoint" in p.stderr and not os.path.exists(os.path.join(work, place)),
          f"{' '.join(argv)}: exit 2, nothing written: exit {p.returncode}: {p.stderr[-600:]}")
p = run(["consolidate", step, "-o", "run/model.h5"])
check(p.returncode == 0 and os.path.isfile(os.path.join(work, "run", "model.h5")), f"beside the checkpoints: exit {p.returncode}: {p.stderr[-600:]}")

# ---- 5. ranks that disagree, a mixture of two tokenizers, the run's own files, model overrides, octal ids --------
# (each exit 0 before 2026-11-29: the audit of what a user does with a trained model)
def mpmd(a, b, cwd_a=work, cwd_b=work):
    """One evaluate job whose two ranks run other command lines (mpirun's A : B), each in its own folder."""
    full = [args.mpiexec, "--oversubscribe", "-np", "1", "-wdir", cwd_a, st, "evaluate", *a, ":",
            "-np", "1", "-wdir", cwd_b, st, "evaluate", *b]
    return subprocess.run(full, capture_output=True, text=True, errors="replace", cwd=work, timeout=300)


for option, a, b in (("--split", "validation", "train"), ("--batches", "1", "2")):
    same = [] if option == "--batches" else ["--batches", "1"]
    p = mpmd(["-w", step, *same, option, a], ["-w", step, *same, option, b])
    check(p.returncode == 2 and f"the ranks were given different evaluations: {option}" in p.stderr,
          f"ranks given {option} {a} and {b}: exit {p.returncode}: {p.stderr[-800:]}")
# A folder of checkpoints whose newest differs between the ranks' disks (their working folders here): exit 5.
p = run(["train", "-c", config, "--schedule.max_steps", "2", "--checkpoint.every_n_steps", "2", "--logging.run_dir", "run2"], np=2)
step2 = os.path.join(work, "run2", "checkpoints", "step_00000002")
for node, steps in (("node_a", [step2, os.path.join(work, step)]), ("node_b", [step2])):
    for s_ in steps:
        shutil.copytree(s_, os.path.join(work, node, "ck", os.path.basename(s_)))
p = mpmd(["-w", "ck", "--batches", "1", "-c", config], ["-w", "ck", "--batches", "1", "-c", config],
         os.path.join(work, "node_a"), os.path.join(work, "node_b"))
check(p.returncode == 5 and "the ranks found different weights" in p.stderr and "step_00000004" in p.stderr,
      f"ranks whose folders' newest checkpoints differ: exit {p.returncode}: {p.stderr[-800:]}")
# A mixture with a source of another tokenizer: refused as train refuses it (the evaluator reads each source alone).
p = evaluate("-w", step, "-c", config, "--data.mixture", f"{ds}:1,{other}:1")
check(p.returncode == 4 and "every source of a mixture must use the same tokenizer" in p.stderr,
      f"a mixture of two tokenizers: exit {p.returncode}: {p.stderr[-800:]}")
# --json over the training run's own files: refused, the file unchanged; its eval.json is evaluate's.
for name in ("config.toml", "metrics.jsonl", "result.json"):
    before = digest(os.path.join("run", name))
    p = evaluate("-w", step, "--json", os.path.join("run", name))
    check(p.returncode == 2 and "is a file of the training run in run" in p.stderr and digest(os.path.join("run", name)) == before,
          f"--json run/{name}: exit {p.returncode}: {p.stderr[-800:]}")
p = evaluate("-w", step, "--json", os.path.join("run", "eval.json"), "--model.rope_theta", "500000")
check(p.returncode == 0 and os.path.exists(os.path.join(work, "run", "eval.json")), f"--json run/eval.json: exit {p.returncode}")
check("--model.rope_theta is not used: the model is the weights'" in p.stderr, f"a --model override: {p.stderr[-800:]}")
# Paths a run recorded relative to its folder (data.path, the dataset's tokenizer), used from another folder that holds
# other files of those names: the recorded ones (by their identities) are found above the checkpoint, as when the names
# are not here at all; before, evaluate read the other dataset (exit 0) and generate refused the other tokenizer (4).
rel, here = os.path.join(work, "rel"), os.path.join(work, "here")
os.makedirs(rel)
os.makedirs(here)
shutil.copy(tok, os.path.join(rel, "tok.json"))
shutil.copy(other_tok, os.path.join(here, "tok.json"))  # another tokenizer, and its dataset, under the recorded names
shutil.copy(other, os.path.join(here, "data.h5"))
subprocess.run([st, "prepare-data", "-t", "tok.json", "-i", moby, "-o", "data.h5", "--validation-fraction", "0.1",
                "--log-level", "warn"], check=True, cwd=rel)
p = subprocess.run([st, "train", "-c", config, "--data.path", "data.h5", "--schedule.max_steps", "2",
                    "--checkpoint.every_n_steps", "2", "--logging.run_dir", "run"], capture_output=True, text=True, cwd=rel)
rel_step = os.path.join(rel, "run", "checkpoints", "step_00000002")
results = {}
for where in (rel, here):  # from `here` on 2 ranks: the pass over the other data.h5 is said once, not per rank
    out = os.path.join(where, "e.json")
    mpi = [args.mpiexec, "--oversubscribe", "-np", "2"] if where == here else []
    p = subprocess.run([*mpi, st, "evaluate", "-w", rel_step, "--batches", "1", "--json", out], capture_output=True, text=True,
                       cwd=where)
    results[where] = (p.returncode, json.load(open(out))["loss"] if os.path.exists(out) else None, p.stderr)
check(results[here][0] == 0 and results[here][1] == results[rel][1] is not None
      and results[here][2].count("data.h5: not the data.h5 that was recorded") == 1,
      f"evaluate from a folder with another data.h5: {results[here][:2]} vs {results[rel][:2]}: {results[here][2][-800:]}")
p = subprocess.run([st, "generate", "--checkpoint", rel_step, "--prompt", "Call me", "--max-tokens", "3"], capture_output=True,
                   text=True, errors="replace", cwd=here)
check(p.returncode == 0 and "tok.json: not the tok.json that was recorded" in p.stderr,
      f"generate from a folder with another tok.json: exit {p.returncode}: {p.stderr[-800:]}")
# A consolidated file moved away from its run: the recorded tokenizer is not found; the message says so.
moved = os.path.join(work, "moved")
os.makedirs(moved)
subprocess.run([st, "consolidate", rel_step, "-o", os.path.join(moved, "w.h5"), "--log-level", "warn"], check=True, cwd=moved)
p = subprocess.run([st, "generate", "--checkpoint", "w.h5", "--prompt", "Call me", "--max-tokens", "3"], capture_output=True,
                   text=True, errors="replace", cwd=moved)
check(p.returncode == 4 and "the tokenizer its weights record, tok.json, is not here" in p.stderr and "--tokenizer" in p.stderr,
      f"generate on a moved file: exit {p.returncode}: {p.stderr[-800:]}")
# No prompt: a packed run's model begins after its EOT, what each of its documents followed (it began from [BOT], which
# packed rows never hold, and wrote "ONONON...").
eot = json.loads(run(["tokenizer", "info", "-t", tok]).stdout)["eot_id"]
p = subprocess.run([st, "generate", "--checkpoint", step, "--max-tokens", "3"], capture_output=True, text=True, errors="replace",
                   cwd=work)
check(p.returncode == 0 and f"no prompt: beginning from token {eot} (" in p.stderr and "packed rows followed" in p.stderr,
      f"generate without a prompt: exit {p.returncode}: {p.stderr[-800:]}")
# Integers are decimal: a leading 0 is no octal, a base prefix is refused.
texts = [run(["tokenizer", "decode", "-t", tok, ids]).stdout for ids in ("0120", "120")]
check(texts[0] == texts[1] and texts[0], f"tokenizer decode 0120 and 120: {texts}")
p = run(["tokenizer", "decode", "-t", tok, "0x10"])
check(p.returncode == 2 and "0x10: expected a decimal integer" in p.stderr, f"decode 0x10: exit {p.returncode}: {p.stderr[-400:]}")

check.finish("evaluate and its inputs: every check passed")
