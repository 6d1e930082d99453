#!/usr/bin/env python3
"""`shardtrain evaluate`: the loss of trained weights on a dataset split, checked against the training run itself.
A 2-rank run logs its validation loss at steps 6 and 12 and saves a checkpoint at each; evaluate must give
the same loss, to the last bit, from each checkpoint on the same ranks and batches, and from the f32
consolidated file and Hugging Face directory of step 12 (the same weights); a bf16 export is close but not
equal. Over the whole split the loss does not depend on the rank count, and the counts follow from the
dataset (whole batches of the split's samples, every position a target in the packed layout). Bad input:
weights of another tokenizer, a missing path, bad --batches / --split, no dataset: one error each, the
documented exit code. evaluate writes nothing into the run directory, only --json, whole. --every-checkpoint
skips a damaged checkpoint (a garbage DONE, a chunk only one rank reads) with its reason, on every rank alike. A tokenizer
that never answers (a FIFO) ends the job with exit code 10 after fsdp.startup_timeout (before: a hang)."""
import json
import math
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
tok, ds = clitest.prepare_dataset(args, moby, work, 512, "moby512", 0.1)
_, other = clitest.prepare_dataset(args, moby, work, 384, "moby384", 0.1)  # another tokenizer, same texts

SEQ, GB = 64, 8
config = os.path.join(work, "run.toml")
with open(config, "w") as f:
    f.write(f"""[model]
vocab_size = 512
max_position_embeddings = 128
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2

[schedule]
warmup_steps = 2
max_steps = 12
eval_every = 6
eval_batches = 3

[data]
path = "{ds}"
seq_len = {SEQ}
global_batch_size = {GB}

[checkpoint]
every_n_steps = 6

[logging]
progress = "off"
peak_flops = 1e10
""")
info = json.loads(subprocess.run([st, "dataset", "info", ds, "--seq-len", str(SEQ), "--json"], capture_output=True, text=True,
                                 check=True).stdout)["datasets"][0]
val_samples, train_samples = info["validation"]["packed"]["samples"], info["train"]["packed"]["samples"]

run_dir = os.path.join(work, "run")
mpi = [args.mpiexec, "--oversubscribe", "-np", "2"]
p = subprocess.run([*mpi, st, "train", "--config", config, "--logging.run_dir", run_dir], capture_output=True, text=True)
if p.returncode != 0:
    check(False, f"the training run: exit {p.returncode}: {p.stderr[-2000:]}")
    check.finish("")
evals = {e["step"]: e for e in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if e["kind"] == "eval"}
check(sorted(evals) == [6, 12], f"validation losses at steps 6 and 12: {sorted(evals)}")
before = sorted(os.listdir(run_dir)), open(os.path.join(run_dir, "metrics.jsonl")).read()
ckpts = os.path.join(run_dir, "checkpoints")


def evaluate(*extra, ranks=2, name="out"):
    """Runs evaluate with --json; returns (process, the JSON or None)."""
    out = os.path.join(work, f"{name}.json")
    if os.path.exists(out):
        os.unlink(out)
    cmd = [st, "evaluate", *extra, "--json", out]
    p = subprocess.run([*([args.mpiexec, "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []), *cmd], capture_output=True, text=True)
    return p, (json.load(open(out)) if os.path.exists(out) else None)


def rel(a, b):
    return abs(a - b) / abs(b)


# ---- the run's own validation loss, from each checkpoint: same ranks, same batches -------------------------
for step in (6, 12):
    p, j = evaluate("--weights", os.path.join(ckpts, f"step_{step:08d}"), "--batches", "3", name=f"step{step}")
    check(p.returncode == 0 and j is not None, f"step {step}: exit {p.returncode}: {p.stderr[-1500:]}")
    if j:
        check(j["loss"] == evals[step]["val_loss"] and j["tokens"] == evals[step]["val_tokens"] and j["step"] == step,
              f"step {step}: evaluate {j['loss']!r} ({j['tokens']} tokens), the run logged {evals[step]['val_loss']!r} "
              f"({evals[step]['val_tokens']} tokens)")
        check(j["sources"][0]["sequences"] == 3 * GB and j["tokens"] == 3 * GB * SEQ and j["config"] == "the run config saved with the weights",
              f"step {step}: 3 batches of {GB} x {SEQ} tokens, the checkpoint's config: {j}")
        check(f"loss {j['loss']:.6f}" in p.stdout and f"{3 * GB} of {val_samples} samples (3 batch(es) of {GB})" in p.stdout,
              f"step {step}: the printed report: {p.stdout}")
p, j = evaluate("--weights", ckpts, "--batches", "3", name="newest")
check(j is not None and j["step"] == 12 and j["loss"] == evals[12]["val_loss"], f"a directory of checkpoints: its newest: {j} {p.stderr[-800:]}")
# Every checkpoint of the directory in one call (one trainer, the weights imported in turn): the run's losses
# at 6 and 12 again, in step order, and a table.
p, j = evaluate("--weights", ckpts, "--every-checkpoint", "--batches", "3", name="every")
got = [(c["step"], c["loss"], c["tokens"]) for c in j["checkpoints"]] if j else None
check(got == [(s, evals[s]["val_loss"], evals[s]["val_tokens"]) for s in (6, 12)], f"--every-checkpoint: {got} {p.stderr[-800:]}")
check("every checkpoint of" in p.stdout and f"{evals[6]['val_loss']:.6f}" in p.stdout.split("every checkpoint of")[-1],
      f"--every-checkpoint prints the table: {p.stdout}")
p, j = evaluate("--weights", os.path.join(ckpts, "step_00000006"), "--every-checkpoint", ranks=1, name="every_none")
check(p.returncode == 5 and "--every-checkpoint: no complete checkpoint" in p.stderr and j is None,
      f"--every-checkpoint on one checkpoint: exit {p.returncode}: {p.stderr[-600:]}")

# A damaged checkpoint among them is skipped with its reason, not the end of the table: a garbage DONE marker on the
# newest (its run config then comes from the one before), and a chunk of step 6's second rank file with bytes
# flipped, which only the rank reading that file meets (every rank skips it alike; no rank waits for another).
damaged = os.path.join(work, "damaged_ckpts")
shutil.copytree(ckpts, damaged)
open(os.path.join(damaged, "step_00000012", "DONE"), "w").write("garbage\n")
p, j = evaluate("--weights", damaged, "--every-checkpoint", "--batches", "3", name="every_damaged")
rows = j["checkpoints"] if j else []
check(p.returncode == 0 and [r["step"] for r in rows] == [6, 12] and rows[0].get("loss") == evals[6]["val_loss"]
      and "DONE" in rows[1].get("error", "") and "loss" not in rows[1],
      f"--every-checkpoint past a damaged DONE: exit {p.returncode}: {rows}: {p.stderr[-1500:]}")
check("(damaged: not evaluated)" in p.stdout and p.stderr.count("skipped, damaged") == 1,
      f"the damaged checkpoint's row and one warning: {p.stdout[-800:]} {p.stderr[-800:]}")
shutil.copy(os.path.join(ckpts, "step_00000012", "DONE"), os.path.join(damaged, "step_00000012", "DONE"))
rank1 = os.path.join(damaged, "step_00000006", "rank_00001.h5")
raw = os.path.join(work, "param0.bin")  # the first unit's parameters as stored, to find them in the file's bytes
subprocess.run(["h5dump", "-d", "/units/0000/param", "-b", "LE", "-o", raw, rank1], check=True, capture_output=True)
data = bytearray(open(rank1, "rb").read())
at = data.find(open(raw, "rb").read()[:256])
check(at > 0, f"the first unit's parameters in {rank1}: at {at}")
for i in range(at, at + 64):
    data[i] ^= 0xFF
open(rank1, "wb").write(bytes(data))
p, j = evaluate("--weights", damaged, "--every-checkpoint", "--batches", "3", name="every_chunk")
rows = j["checkpoints"] if j else []
check(p.returncode == 0 and [r["step"] for r in rows] == [6, 12] and rows[0].get("error", "").startswith("rank 1: ")
      and "rank_00001.h5" in rows[0]["error"] and rows[1].get("loss") == evals[12]["val_loss"],
      f"--every-checkpoint past a chunk only rank 1 reads: exit {p.returncode}: {rows}: {p.stderr[-1500:]}")
open(os.path.join(damaged, "step_00000012", "DONE"), "w").write("garbage\n")
p, j = evaluate("--weights", damaged, "--every-checkpoint", "--batches", "3", name="every_none_good")
check(p.returncode == 5 and "none of its 2 complete checkpoint(s) could be evaluated" in p.stderr and j is None,
      f"--every-checkpoint with every checkpoint damaged: exit {p.returncode}: {p.stderr[-800:]}")
p, j = evaluate("--weights", os.path.join(damaged, "step_00000006"), "--batches", "3", name="one_damaged")
check(p.returncode == 5 and "rank_00001.h5" in p.stderr and j is None,
      f"the damaged checkpoint named alone: exit {p.returncode}: {p.stderr[-800:]}")

# ---- the same weights in the other forms ---------------------------------------------------------------------
exports = {}
for name, cmd in (("full.h5", []), ("hf", ["--format", "safetensors"]), ("hf-bf16", ["--format", "safetensors", "--dtype", "bf16"])):
    exports[name] = os.path.join(work, name)
    subprocess.run([st, "consolidate", os.path.join(ckpts, "step_00000012"), "-o", exports[name], *cmd, "--log-level", "warn"], check=True)
for name in ("full.h5", "hf"):
    p, j = evaluate("--weights", exports[name], "--config", config, "--batches", "3", name=name)
    check(j is not None and j["loss"] == evals[12]["val_loss"] and j["step"] == -1,
          f"{name} (f32, the step-12 weights): {j and j['loss']!r} vs {evals[12]['val_loss']!r}: {p.stderr[-800:]}")
p, j = evaluate("--weights", exports["hf-bf16"], "--config", config, "--batches", "3", name="bf16")
check(j is not None and 0 < rel(j["loss"], evals[12]["val_loss"]) < 1e-2,
      f"bf16 export: near the f32 loss but not equal: {j and j['loss']!r} vs {evals[12]['val_loss']!r}")
# Without a config, a Hugging Face directory has no data: said, exit 3 (the defaults' data.path is empty).
p, j = evaluate("--weights", exports["hf"], ranks=1, name="noconfig")
check(p.returncode == 3 and "data.path" in p.stderr and j is None, f"no config, no data: exit {p.returncode}: {p.stderr[-800:]}")
p, j = evaluate("--weights", exports["hf"], "--data.path", ds, "--data.seq_len", str(SEQ), "--data.global_batch_size", str(GB),
                "--batches", "3", name="hfdata")
check(j is not None and j["loss"] == evals[12]["val_loss"], f"a Hugging Face directory with --data.*: {j and j['loss']!r}: {p.stderr[-800:]}")

# ---- the whole split: the counts from the dataset; the loss independent of the rank count ------------------
whole = val_samples - val_samples % GB
p1, j1 = evaluate("--weights", ckpts, ranks=1, name="whole1")
p2, j2 = evaluate("--weights", ckpts, ranks=2, name="whole2")
for r, (p, j) in enumerate(((p1, j1), (p2, j2)), 1):
    check(j is not None and j["sources"][0]["samples"] == val_samples and j["sources"][0]["sequences"] == whole and j["tokens"] == whole * SEQ
          and j["ranks"] == r, f"the whole split on {r} rank(s): {whole} sequences of {val_samples}: {j} {p.stderr[-800:]}")
if j1 and j2:
    check(rel(j1["loss"], j2["loss"]) < 1e-6, f"1 rank vs 2 ranks: {j1['loss']!r} vs {j2['loss']!r}")
    check(j1["loss"] != evals[12]["val_loss"], "the whole split is more than the run's 3 batches")
p, j = evaluate("--weights", ckpts, "--split", "train", "--batches", "2", name="train")
check(j is not None and j["split"] == "train" and j["sources"][0]["samples"] == train_samples and j["tokens"] == 2 * GB * SEQ,
      f"--split train --batches 2: {j} {p.stderr[-800:]}")

# ---- bits per byte: the targets' bytes, counted independently of the tokenizer ---------------------------------
# Short documents of known text, each whole in one padded row ([BOT] doc [EOT]: every byte of it is a target,
# and one [EOT] per row, which stands for no bytes). A byte-level tokenizer (one token per byte) and a BPE with
# merges must count the same bytes: the validation documents' text, which is the byte-level dataset's token count.
short = os.path.join(work, "short")
os.makedirs(short)
for i in range(40):
    with open(os.path.join(short, f"doc_{i:02d}.txt"), "w") as f:
        f.write("".join("the quick brown fox jumps over a lazy dog "[(i * 5 + k * 3) % 42] for k in range(20 + 2 * i)))
bytes_tok, bytes_ds = os.path.join(work, "bytes.json"), os.path.join(work, "bytes.h5")
subprocess.run([st, "tokenizer", "train", "--input", short, "--vocab-size", "260", "--min-frequency", "1000000000", "--output", bytes_tok,
                "--log-level", "error"], check=True)
subprocess.run([st, "prepare-data", "-t", bytes_tok, "-i", short, "-o", bytes_ds, "--validation-fraction", "0.2", "--log-level", "warn"],
               check=True)
bpe_tok, bpe_ds = clitest.prepare_dataset(args, short, work, 300, "short-bpe", 0.2)
vinfo = {}
for d in (bytes_ds, bpe_ds):
    vinfo[d] = json.loads(subprocess.run([st, "dataset", "info", d, "--seq-len", "128", "--json"], capture_output=True, text=True,
                                         check=True).stdout)["datasets"][0]["validation"]
text_bytes, docs = vinfo[bytes_ds]["tokens"], vinfo[bytes_ds]["documents"]
# The weights only need to run here (the counts are the data's): the export without its tokenizer.json, which on these
# datasets of other tokenizers is evaluated with a warning (with it, refused: exit 5).
exports["hf-notok"] = os.path.join(work, "hf-notok")
shutil.copytree(exports["hf"], exports["hf-notok"])
os.unlink(os.path.join(exports["hf-notok"], "tokenizer.json"))
padded = ["--weights", exports["hf-notok"], "--config", config, "--data.layout", "padded", "--data.seq_len", "128"]  # rows hold every document
for d in (bytes_ds, bpe_ds):
    p, j = evaluate(*padded, "--data.path", d, name="bpb")
    s = j["sources"][0] if j else {}
    check(j is not None and s["sequences"] == docs and s["tokens"] == vinfo[d]["tokens"] + docs and s["bytes"] == text_bytes,
          f"{os.path.basename(d)}: {docs} rows, tokens = the documents' {vinfo[d]['tokens']} + one [EOT] each, bytes = the text's "
          f"{text_bytes}: {s} {p.stderr[-800:]}")
    if j:
        check(vinfo[d]["padded"]["documents_cut"] == 0 and abs(s["bits_per_byte"] - s["loss"] * s["tokens"] / math.log(2) / s["bytes"]) < 1e-12 and j["bits_per_byte"] == s["bits_per_byte"],
              f"bits per byte = loss x tokens / ln 2 / bytes: {s}")
p, j = evaluate(*padded, "--data.path", bytes_ds, "--tokenizer", bpe_tok, name="wrongtok")
check(p.returncode == 4 and "is not the tokenizer of" in p.stderr and j is None, f"--tokenizer of another dataset: exit {p.returncode}: {p.stderr[-800:]}")
# A mixture: each source's loss and bytes, and the sources' mean in the mixture's weights. Its sources share a tokenizer
# (the second: the same texts, another held-out fifth); one of another tokenizer is refused as train refuses it (it was
# evaluated, exit 0, its bits per byte by the first source's tokenizer).
bytes2_ds = os.path.join(work, "bytes2.h5")
subprocess.run([st, "prepare-data", "-t", bytes_tok, "-i", short, "-o", bytes2_ds, "--validation-fraction", "0.2", "--seed", "9",
                "--log-level", "warn"], check=True)
p, j = evaluate(*padded, "--data.mixture", f"{bytes_ds}:1,{ds}:3", "--batches", "1", name="mixture_two_tokenizers")
check(p.returncode == 4 and "every source of a mixture must use the same tokenizer" in p.stderr and j is None,
      f"a mixture of two tokenizers: exit {p.returncode}: {p.stderr[-800:]}")
p, j = evaluate(*padded, "--data.mixture", f"{bytes_ds}:1,{bytes2_ds}:3", "--batches", "1", name="mixture")
check(j is not None and len(j["sources"]) == 2, f"a mixture reports each source: {j} {p.stderr[-800:]}")
if j and len(j["sources"]) == 2:
    a, b = j["sources"]
    check(abs(j["loss"] - (a["loss"] + 3 * b["loss"]) / 4) < 1e-12 and abs(j["bits_per_byte"] - (a["bits_per_byte"] + 3 * b["bits_per_byte"]) / 4) < 1e-12,
          f"the mixture's loss and bits per byte are the sources' in weights 1:3: {j}")

# ---- bad input: one error each, its exit code, no JSON -------------------------------------------------------
p, j = evaluate("--weights", ckpts, "--data.path", other, ranks=2, name="othertok")
check(p.returncode == 5 and "trained with tokenizer" in p.stderr and other in p.stderr and j is None,
      f"weights of another tokenizer: exit {p.returncode}: {p.stderr[-800:]}")
big = 2 * (val_samples // 2 + 1)  # one evaluation batch (micro-batch x 2 ranks) larger than the split
p, j = evaluate("--weights", ckpts, "--data.global_batch_size", str(big), ranks=2, name="toobig")
check(p.returncode == 4 and f"no source has {big} validation samples" in p.stderr and j is None,
      f"a split smaller than one batch: exit {p.returncode}: {p.stderr[-800:]}")
# A split with no sample at all: evaluate's own words (it said "train: ...: no validation loss"), once for the job, as
# every rank finds the same (each rank said it).
noval = os.path.join(work, "noval.h5")
subprocess.run([st, "prepare-data", "-t", tok, "-i", short, "-o", noval, "--validation-fraction", "0", "--log-level", "warn"],
               check=True)
p, j = evaluate("--weights", ckpts, "--data.path", noval, ranks=2, name="noval")
said = f"evaluate: {noval}: the validation split is empty (0 documents, 0 tokens)"
check(p.returncode == 4 and p.stderr.count(said) == 1 and p.stderr.count("--validation-fraction above 0") == 1 and j is None,
      f"a split without a sample: exit {p.returncode}, one warning '{said}': {p.stderr[-1500:]}")
p, j = evaluate("--weights", os.path.join(work, "nowhere"), ranks=1, name="missing")
check(p.returncode == 5 and "nowhere" in p.stderr and j is None, f"missing weights: exit {p.returncode}: {p.stderr[-800:]}")
for bad, what in ((["--batches", "0"], "--batches '0'"), (["--split", "test"], "--split 'test'")):
    p, j = evaluate("--weights", ckpts, *bad, ranks=1, name="bad")
    check(p.returncode == 2 and what in p.stderr and j is None, f"{bad}: exit {p.returncode}: {p.stderr[-800:]}")

# ---- nothing written but --json -------------------------------------------------------------------------------
# A tokenizer file that never answers (a FIFO with no writer: what a file system that stopped answering looks like to
# the reader): every rank is held up reading it, before the evaluation's collectives. Before, the job hung for ever;
# now its stage runs out of fsdp.startup_timeout and ends the job with exit code 10, naming the stage.
os.makedirs(os.path.join(work, "stuck"), exist_ok=True)
stuck = os.path.join(work, "stuck", "tokenizer.json")
if not os.path.exists(stuck):
    os.mkfifo(stuck)
p, _ = evaluate("-w", os.path.join(ckpts, "step_00000012"), "--tokenizer", stuck, "--fsdp.startup_timeout", "3",
                name="stuck")
check(p.returncode == 10 and "start-up: reading the dataset's tokenizer has not finished after 3 s (fsdp.startup_timeout)" in p.stderr,
      f"a tokenizer that never answers: exit {p.returncode}: {p.stderr[-1200:]}")

after = sorted(os.listdir(run_dir)), open(os.path.join(run_dir, "metrics.jsonl")).read()
check(after == before, f"the run directory is unchanged: {before[0]} -> {after[0]}")
check(not [n for n in os.listdir(work) if n.endswith(".tmp")], f"no temporary files left: {os.listdir(work)}")
check.finish(f"evaluate: the run's validation losses at steps 6 and 12 bit for bit (from checkpoints, f32 exports), the whole split "
             f"({whole} of {val_samples} samples) on 1 and 2 ranks, bad input refused: all passed")
