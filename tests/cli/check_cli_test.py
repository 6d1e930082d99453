#!/usr/bin/env python3
"""`shardtrain check`, the offline preflight of a training run, against values computed here and against what
`train` itself does. The dataset is byte-level (no merges: one token per byte), so its sample counts follow
from the texts. Checked: the run's length (steps per epoch, steps, epochs) for max_steps, epochs and
max_tokens; the mesh and batch of an allocation; every problem of a command line reported in one call with
the first one's exit code; a damaged block found by --verify-data and by nothing less; the checkpoint
`--resume auto` would load (its step, the steps left) and its refusals (another model, another tokenizer, a
path that is no checkpoint); output directories that cannot be made; and that check creates nothing. Where
the run itself would stop (a model that does not match the checkpoint, data too small for one batch), the
same command under mpirun stops with the same exit code and message."""
import os
import shutil
import struct
import subprocess
import sys
import json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain

# Documents of known lengths; ASCII, so one token per byte.
lengths = [300 + 37 * i for i in range(40)]
corpus = os.path.join(work, "corpus")
os.makedirs(corpus)
for i, n in enumerate(lengths):
    with open(os.path.join(corpus, f"doc_{i:02d}.txt"), "w") as f:
        f.write("".join(chr(97 + (i * 5 + k * 3) % 26) for k in range(n)))
tok, ds = os.path.join(work, "bytes.json"), os.path.join(work, "bytes.h5")
subprocess.run([st, "tokenizer", "train", "--input", corpus, "--vocab-size", "260", "--min-frequency", "1000000000", "--output", tok,
                "--log-level", "error"], check=True)
subprocess.run([st, "prepare-data", "-t", tok, "-i", corpus, "-o", ds, "--validation-fraction", "0.1", "--log-level", "warn"], check=True)
# The same texts with another tokenizer (a BPE with merges): a checkpoint trained on `ds` must refuse it.
tok2, ds2 = os.path.join(work, "bpe.json"), os.path.join(work, "bpe.h5")
subprocess.run([st, "tokenizer", "train", "--input", corpus, "--vocab-size", "300", "--output", tok2, "--log-level", "error"], check=True)
subprocess.run([st, "prepare-data", "-t", tok2, "-i", corpus, "-o", ds2, "--validation-fraction", "0.1", "--log-level", "warn"], check=True)

SEQ, GB = 32, 8
config = os.path.join(work, "run.toml")
with open(config, "w") as f:
    f.write(f"""[model]
vocab_size = 300
max_position_embeddings = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 2
num_key_value_heads = 1

[schedule]
warmup_steps = 1
max_steps = 40
eval_every = 0
eval_batches = 2

[data]
path = "{ds}"
seq_len = {SEQ}
global_batch_size = {GB}

[logging]
progress = "lines"
peak_flops = 1e10
""")

info = json.loads(subprocess.run([st, "dataset", "info", ds, "--seq-len", str(SEQ), "--json"], capture_output=True, text=True,
                                 check=True).stdout)["datasets"][0]
samples = info["train"]["packed"]["samples"]
val_samples = info["validation"]["packed"]["samples"]
per_epoch = samples // GB
big = (samples // 2 + 1) * 2  # a global batch larger than the data that 2 ranks can split


def run_check(*extra):
    return subprocess.run([st, "check", "--config", config, *extra], capture_output=True, text=True)


def line(r, what):
    """The report's lines for one check, e.g. line(r, "data")."""
    return [l.strip() for l in r.stdout.splitlines() if l.strip().startswith(what + " ")]


# ---- the run's length, from the data --------------------------------------------------------------------
r = run_check()
check(r.returncode == 0 and r.stdout.rstrip().endswith("check: ok"), f"a good run: exit {r.returncode}: {r.stdout} {r.stderr}")
data = " ".join(line(r, "data"))
check(f"{samples} training samples (packed, seq_len {SEQ}) = {per_epoch} steps per epoch; the run: 40 steps, "
      f"{40 * GB * SEQ} tokens, {40 / per_epoch:.3g} epochs" in data, f"data line: {data} (expected {samples} samples)")
check(line(r, "world") == ["world      note: not checked (give --nodes and --gpus-per-node for an allocation)"], f"world: {line(r, 'world')}")
check(f"{val_samples} samples, 2 evaluation batch(es) of {GB}" in " ".join(line(r, "validation")), f"validation: {line(r, 'validation')}")
# The world a config names (fsdp.num_processes over fsdp.num_machines, what an Accelerate file gives) is checked as
# `plan` and the run take it: 7 processes for a batch of 8 said "check: ok", and the run refused it (exit 3).
r = run_check("--fsdp.num_processes", "7")
check(r.returncode == 3 and "cannot be split evenly over 7 ranks" in " ".join(line(r, "world")) and "check: ok" not in r.stdout,
      f"7 processes, a batch of {GB}: exit {r.returncode}: {r.stdout}")
r = run_check("--fsdp.num_processes", "4", "--fsdp.num_machines", "2", "--fsdp.strategy", "HYBRID_SHARD")
world = " ".join(line(r, "world"))
check(r.returncode == 0 and "from fsdp.num_processes 4 and fsdp.num_machines 2" in world and "2 node(s) x 2 ranks" in world,
      f"4 processes on 2 machines: exit {r.returncode}: {r.stdout}")
check("off (checkpoint.resume is empty)" in " ".join(line(r, "resume")), f"resume: {line(r, 'resume')}")
r = run_check("--schedule.max_steps", "0", "--schedule.epochs", "2")
check(f"the run: {2 * per_epoch} steps" in " ".join(line(r, "data")), f"epochs = 2: {line(r, 'data')}")
r = run_check("--schedule.max_tokens", str(5 * GB * SEQ + 1))
check("the run: 6 steps" in " ".join(line(r, "data")), f"max_tokens just over 5 steps: {line(r, 'data')}")

# ---- an allocation: its mesh and batch ------------------------------------------------------------------
r = run_check("--nodes", "2", "--gpus-per-node", "2", "--data.micro_batch_size", "1")
check(r.returncode == 0 and "2 node(s) x 2 ranks, mesh 1 (replicate) x 4 (shard): micro-batch 1 x 2 accumulation step(s) per rank = 8 "
      "sequences per step" in " ".join(line(r, "world")), f"2 x 2 (FULL_SHARD) with micro-batch 1: {r.stdout}")
check(f"{val_samples} samples, 2 evaluation batch(es) of 4" in " ".join(line(r, "validation")),
      f"an evaluation batch is micro-batch x world: {line(r, 'validation')}")
r = run_check("--nodes", "1", "--gpus-per-node", "3")
check(r.returncode == 3 and "data.global_batch_size: 8 sequences cannot be split evenly over 3 ranks" in " ".join(line(r, "world")),
      f"3 ranks: exit {r.returncode}: {r.stdout}")
check(r.stdout.count(" ok: ") >= 4, f"the other checks still ran: {r.stdout}")
# The mesh is the trainer's: HYBRID_SHARD puts one shard group in each node, and a shard size that does not
# fit the allocation is refused with the trainer's message.
r = run_check("--nodes", "2", "--gpus-per-node", "2", "--fsdp.strategy", "HYBRID_SHARD")
check(r.returncode == 0 and "mesh 2 (replicate) x 2 (shard)" in " ".join(line(r, "world")), f"HYBRID_SHARD on 2 x 2: {r.stdout}")
r = run_check("--nodes", "2", "--gpus-per-node", "2", "--fsdp.strategy", "HYBRID_SHARD", "--fsdp.shard_size", "3")
check(r.returncode == 3 and "shard_size 3 does not divide world size 4" in " ".join(line(r, "world")),
      f"shard size 3 on 4 ranks: exit {r.returncode}: {r.stdout}")
r = run_check("--nodes", "3", "--gpus-per-node", "4", "--fsdp.strategy", "HYBRID_SHARD", "--fsdp.shard_size", "6",
              "--data.global_batch_size", "12")
check(r.returncode == 3 and "shard_size 6 neither divides nor is a multiple of ranks_per_node 4" in " ".join(line(r, "world")),
      f"a shard group across part of a node: exit {r.returncode}: {r.stdout}")

# ---- --gpu-memory: the seed's model on 2 x 2, by plan's accounting -------------------------------------------
seed_cfg = os.path.join(args.source, "configs", "llama-seed.toml")
plan = json.loads(subprocess.run([st, "plan", "--config", seed_cfg, "--nodes", "2", "--gpus-per-node", "2", "--json"], capture_output=True,
                                 text=True, check=True).stdout)
full_shard = next(e for e in plan["strategies"] if e["strategy"] == "FULL_SHARD")
need = full_shard["device_bytes"] / 2**30
# The run's own start check (check_step_memory) leaves the op scratch out: its lower bound.
low = (full_shard["device_bytes"] - full_shard["op_scratch_bytes"]) / 2**30
# (This small data set holds fewer than the seed's 64 sequences of a global batch: the data check fails, exit 4,
# after the memory check, which the run meets first and is what is asserted here.)
seed = ["--config", seed_cfg, "--data.path", ds, "--nodes", "2", "--gpus-per-node", "2"]
r = subprocess.run([st, "check", *seed, "--gpu-memory", "80GiB"], capture_output=True, text=True)
check(f"memory     ok: about {need:.2f} of 80 GiB per GPU" in r.stdout,
      f"the seed's model on 2 x 2 GPUs: plan says {need:.2f} GiB: exit {r.returncode}: {line(r, 'memory')} {r.stderr[-500:]}")
# Below the run's lower bound: refused as the run refuses it (train::check_step_memory), in its words.
budget = f"{low - 0.1:.2f}GiB"
r = subprocess.run([st, "check", *seed, "--gpu-memory", budget], capture_output=True, text=True)
mem = " ".join(line(r, "memory"))
check(r.returncode == 3 and f"memory     FAILED: configuration error: data.global_batch_size: a training step needs at least {low:.2f} GiB "
      f"per rank" in mem and f"more than --gpu-memory {budget} has for this rank" in mem and "fsdp.activation_checkpointing = true" in mem
      and "the run would stop on: configuration error: data.global_batch_size: a training step needs" in r.stderr,
      f"--gpu-memory {budget} (the run's lower bound {low:.2f}): exit {r.returncode}: {mem} {r.stderr[-300:]}")
r = subprocess.run([st, "check", *seed, "--gpu-memory", "0.25GiB"], capture_output=True, text=True)
mem = " ".join(line(r, "memory"))
check(r.returncode == 3 and "whose fp32 weights, gradients and Adam state take" in mem and "--gpu-memory 0.25GiB has 256.0 MiB for this rank" in mem,
      f"a model whose state alone does not fit: exit {r.returncode}: {mem}")
# Between the run's lower bound and plan's estimate with the op scratch: the run would start and run out of memory.
budget = f"{(low + need) / 2:.3f}GiB"
r = subprocess.run([st, "check", *seed, "--gpu-memory", budget], capture_output=True, text=True)
mem = " ".join(line(r, "memory"))
check(r.returncode == 3 and f"about {need:.2f} GiB per GPU" in mem and "run out of device memory in its first step" in mem
      and "fsdp.activation_checkpointing = true" in mem, f"--gpu-memory {budget}: exit {r.returncode}: {mem}")
r = subprocess.run([st, "check", *seed, "--gpu-memory", budget, "--fsdp.activation_checkpointing", "true"], capture_output=True, text=True)
mem = " ".join(line(r, "memory"))
check("memory     ok" in r.stdout and "activation_checkpointing" not in mem, f"with activation checkpointing it fits: {mem}")
r = subprocess.run([st, "check", *seed], capture_output=True, text=True)
check("memory     note: not checked (give --gpu-memory)" in r.stdout, f"an allocation without --gpu-memory: a note: {r.stdout}")
r = run_check("--gpu-memory", "80GiB")
check(r.returncode == 0 and "not checked" in " ".join(line(r, "memory")), f"--gpu-memory without an allocation: a note: {r.stdout}")
r = run_check("--gpu-memory", "lots")
check(r.returncode == 2 and "--gpu-memory: 'lots'" in r.stderr, f"--gpu-memory lots: exit {r.returncode}: {r.stderr[-300:]}")

# ---- several problems in one call: each named, the first one's exit code --------------------------------
r = run_check("--data.path", os.path.join(work, "missing.h5"), "--checkpoint.dir", "/proc/shardtrain-check", "--resume", "auto")
check(r.returncode == 4, f"missing data + unwritable checkpoints: exit {r.returncode}, expected 4 (data, the first): {r.stdout} {r.stderr}")
check("missing.h5" in " ".join(line(r, "data")) and "FAILED" in " ".join(line(r, "data")), f"data named: {line(r, 'data')}")
check("checkpoint.dir: cannot create /proc/shardtrain-check" in " ".join(line(r, "outputs")), f"outputs named: {line(r, 'outputs')}")
check("2 problem(s)" in r.stderr, f"the count of problems: {r.stderr}")
# The data a job queued before the run will make (submit.sh PREPARE=1): a note, and the rest still checked.
r = run_check("--data.path", os.path.join(work, "missing.h5"), "--data-pending", "--verify-data")
data = " ".join(line(r, "data"))
check(r.returncode == 0 and "missing.h5: not checked: a job queued before the run makes it" in data and "data       note:" in r.stdout
      and not line(r, "verify") and not line(r, "validation") and line(r, "outputs"), f"--data-pending: exit {r.returncode}: {r.stdout}")
r = run_check("--data.path", os.path.join(work, "missing.h5"), "--data-pending", "--checkpoint.dir", "/proc/shardtrain-check")
check(r.returncode == 8, f"--data-pending checks the outputs still: exit {r.returncode}: {r.stdout}")
r = run_check("--model.vocab_size", "200")
check(r.returncode == 3 and "model.vocab_size: 200 is smaller than the vocabulary" in r.stdout, f"vocab 200: {r.returncode} {r.stdout}")
r = run_check("--data.global_batch_size", str(big))
check(r.returncode == 4 and f"the train split has {samples} samples of {SEQ} tokens, fewer than one global batch of {big}" in r.stdout,
      f"a batch larger than the data: {r.returncode} {r.stdout}")
r = run_check("--model.num_attention_heads", "3")
check(r.returncode == 3 and "nothing else was checked" in r.stderr and "data " not in r.stdout, f"a config that does not resolve: {r.stdout} {r.stderr}")

# ---- --verify-data: a damaged block (an id that stays inside the vocabulary: only the checksum tells) ------
raw = bytearray(open(ds, "rb").read())
enc = json.loads(subprocess.run([st, "tokenizer", "encode", "-t", tok, "--json", "--text", "".join(chr(97 + (k * 3) % 26) for k in range(8))],
                                capture_output=True, text=True, check=True).stdout)
first = enc["ids"] if isinstance(enc, dict) else enc
at = raw.find(struct.pack("<8I", *first))
check(at > 0, "the first document's ids are in the file")
damaged = os.path.join(work, "damaged.h5")
raw[at + 4] ^= 0x01
open(damaged, "wb").write(raw)
r = run_check("--data.path", damaged)
check(r.returncode == 0, f"without --verify-data the damage goes unseen (the run would stop on it when it reads it): {r.stdout} {r.stderr}")
r = run_check("--data.path", damaged, "--verify-data")
check(r.returncode == 4 and damaged in " ".join(line(r, "verify")) and "checksum" in " ".join(line(r, "verify")),
      f"--verify-data finds it: exit {r.returncode}: {r.stdout}")
r = run_check("--verify-data")
check(r.returncode == 0 and f"{ds}: 1 checksum block(s) read, every id below 259" in " ".join(line(r, "verify")), f"intact: {r.stdout}")

# ---- resume: the checkpoint --resume auto would load ------------------------------------------------------
run_dir = os.path.join(work, "run")
train = [args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", config, "--logging.run_dir", run_dir]
t = subprocess.run([*train, "--schedule.max_steps", "6", "--checkpoint.every_n_steps", "3", "--log-level", "warn"], capture_output=True,
                   text=True, timeout=300)
check(t.returncode == 0, f"the training run that leaves checkpoints: {t.stderr[-1500:]}")
ckpt6 = os.path.join(run_dir, "checkpoints", "step_00000006")
r = run_check("--logging.run_dir", run_dir, "--resume", "auto", "--verify-checkpoint")
res = " ".join(line(r, "resume"))
check(r.returncode == 0 and f"{ckpt6}: step 6, {6 * GB * SEQ} tokens seen, with the AdamW states; 34 of 40 steps left" in res,
      f"resume auto: {r.stdout} {r.stderr}")
check("elements read, every chunk's checksum verified" in res, f"--verify-checkpoint: {res}")
r = run_check("--logging.run_dir", run_dir, "--resume", "auto", "--schedule.max_steps", "6")
check(r.returncode == 0 and "the run has taken its 6 steps already" in " ".join(line(r, "resume")), f"nothing left: {r.stdout}")
r = run_check("--logging.run_dir", run_dir, "--resume", os.path.join(run_dir, "checkpoints", "step_00000003"))
check(r.returncode == 0 and "step_00000003: step 3," in " ".join(line(r, "resume")), f"an explicit checkpoint: {r.stdout}")
r = run_check("--logging.run_dir", run_dir, "--resume", os.path.join(work, "no-such-checkpoint"))
check(r.returncode == 5 and "no-such-checkpoint" in " ".join(line(r, "resume")), f"no checkpoint there: {r.returncode} {r.stdout}")
r = run_check("--logging.run_dir", run_dir, "--resume", "auto", "--data.path", ds2, "--data.global_batch_size", "2")
check(r.returncode == 5 and "trained with tokenizer" in " ".join(line(r, "resume")), f"another tokenizer: {r.returncode} {r.stdout}")
r = run_check("--logging.run_dir", run_dir, "--resume", "auto", "--model.num_hidden_layers", "3")
message = "the checkpoint's model has num_hidden_layers = 2, the configured model 3"
check(r.returncode == 5 and message in " ".join(line(r, "resume")), f"another model: {r.returncode} {r.stdout}")

# The run itself stops on the same problems, with the same exit code and message.
t = subprocess.run([*train, "--resume", "auto", "--model.num_hidden_layers", "3"], capture_output=True, text=True, timeout=300)
check(t.returncode == 5 and message in t.stderr, f"train agrees on the model: exit {t.returncode}: {t.stderr[-1500:]}")
t = subprocess.run([*train, "--data.global_batch_size", str(big)], capture_output=True, text=True, timeout=300)
check(t.returncode == 4 and f"fewer than one global batch of {big}" in t.stderr,
      f"train agrees on data too small for a batch: exit {t.returncode}: {t.stderr[-1500:]}")

# ---- check and train on the same bad input: the same exit code, and check's closing line names train's message ------
# Each of these once differed: check passed checkpoint.init_from unread (train refused it, 5, after the queue wait);
# named its own texts for --resume auto over damaged checkpoints and for directories that cannot be made; and gave
# the exit code of the first problem it listed, not the first one the run meets (a run directory's foreign
# config.toml is refused before the data is opened).
def agree(what, extra, code, message, setup=None):
    """check and `mpirun -np 2 train` with `extra`: both exit `code`, check's closing line is 'the run would stop on:
    <exit code name>: <text>' with `message` in it, and train's stderr holds that text verbatim."""
    if setup:
        setup()
    r = run_check(*extra)
    closing = [l.split("the run would stop on: ", 1)[1] for l in r.stderr.splitlines() if "the run would stop on: " in l]
    stop_on = closing[-1] if closing else ""
    check(r.returncode == code and message in stop_on, f"{what}: check exit {r.returncode} (expected {code}), stops on "
          f"'{stop_on}', expected '{message}': {r.stdout} {r.stderr[-600:]}")
    if setup:
        setup()
    t = subprocess.run([args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", config, *extra, "--log-level", "warn"],
                       capture_output=True, text=True, timeout=300)
    check(t.returncode == code and stop_on and stop_on in t.stderr,
          f"{what}: train exit {t.returncode} (expected {code}), expected '{stop_on}' in: {t.stderr[-1500:]}")

ckpt3 = os.path.join(run_dir, "checkpoints", "step_00000003")
fresh_run = os.path.join(work, "agree-run")


def clean():
    shutil.rmtree(fresh_run, ignore_errors=True)


agree("init_from another model", ["--logging.run_dir", fresh_run, "--checkpoint.init_from", ckpt6, "--model.num_hidden_layers", "3"], 5,
      f"checkpoint error: {ckpt6}: the checkpoint's model has num_hidden_layers = 2, the configured model 3", clean)
agree("init_from another tokenizer", ["--logging.run_dir", fresh_run, "--checkpoint.init_from", ckpt6, "--data.path", ds2,
                                      "--data.global_batch_size", "2"], 5, f"checkpoint error: {ckpt6}: trained with tokenizer", clean)
agree("init_from no weights", ["--logging.run_dir", fresh_run, "--checkpoint.init_from", config], 5, f"checkpoint error: {config}:", clean)
agree("resume auto: no checkpoint, init_from another model",
      ["--logging.run_dir", fresh_run, "--resume", "auto", "--checkpoint.init_from", ckpt6, "--model.num_hidden_layers", "3"], 5,
      "the checkpoint's model has num_hidden_layers = 2, the configured model 3", clean)
r = run_check("--logging.run_dir", run_dir, "--resume", "auto", "--checkpoint.init_from", ckpt6, "--model.num_hidden_layers", "2")
check(r.returncode == 0 and not line(r, "init_from"), f"a resumed run does not read init_from: {r.stdout}")
r = run_check("--logging.run_dir", fresh_run, "--checkpoint.init_from", ckpt3)
check(r.returncode == 0 and f"init_from  ok: {ckpt3}: this model's weights (step 3)" in r.stdout, f"init_from ok: {r.stdout} {r.stderr}")

# --resume auto where every complete checkpoint is damaged: the run's own refusal, each checkpoint's error named.
damaged_run = os.path.join(work, "damaged-run")


def damage_all():
    shutil.rmtree(damaged_run, ignore_errors=True)
    shutil.copytree(run_dir, damaged_run)
    for step in ("step_00000003", "step_00000006"):
        open(os.path.join(damaged_run, "checkpoints", step, "index.h5"), "wb").write(b"not hdf5")


damaged_ckpts = os.path.join(damaged_run, "checkpoints")
agree("resume auto, all damaged", ["--logging.run_dir", damaged_run, "--resume", "auto"], 5,
      f"checkpoint error: none of the 2 complete checkpoints in {damaged_ckpts} loads (resume = auto); "
      f"{damaged_ckpts}/step_00000006/index.h5: cannot be opened: not an HDF5 file (no HDF5 signature); "
      f"{damaged_ckpts}/step_00000003/index.h5: cannot be opened: not an HDF5 file (no HDF5 signature); nothing was changed or removed",
      damage_all)
# A checkpoint of another model and another tokenizer: the tokenizer is what the run reads first.
agree("resume: another model and tokenizer", ["--logging.run_dir", fresh_run, "--resume", ckpt6, "--data.path", ds2,
                                              "--data.global_batch_size", "2", "--model.num_hidden_layers", "3"], 5,
      f"checkpoint error: {ckpt6}: trained with tokenizer", clean)
# Directories that cannot be made: one text, from the probe both call.
agree("checkpoint.dir under a file", ["--logging.run_dir", fresh_run, "--checkpoint.dir", os.path.join(config, "sub")], 8,
      f"I/O error: checkpoint.dir: cannot create {config}/sub: {config} is not a directory", clean)
agree("run_dir under a file", ["--logging.run_dir", os.path.join(config, "sub"), "--checkpoint.dir", os.path.join(fresh_run, "ck")], 8,
      f"I/O error: logging.run_dir: cannot create {config}/sub: {config} is not a directory", clean)
agree("runs_root a file", ["--logging.runs_root", config], 8, f"I/O error: logging.runs_root: {config} exists and is not a directory")
# A name longer than the file system takes: check looked only where the first folder would be made and said "can be
# written"; train then failed to create it.
long_dir = os.path.join(work, "n" * 256, "ck")
agree("checkpoint.dir with a 256-byte name", ["--logging.run_dir", fresh_run, "--checkpoint.dir", long_dir], 8,
      f"I/O error: checkpoint.dir: cannot create {long_dir}: File name too long (a name of 256 bytes below {work}, whose file "
      "system takes at most 255)", clean)
# A generated run directory whose name (logging.name and the time) is too long names logging.name, the key the user set
# (it named logging.run_dir, which was not set).
roots = os.path.join(work, "long-name-runs")
t = subprocess.run([args.mpiexec, "--oversubscribe", "-np", "2", st, "train", "--config", config, "--logging.runs_root", roots,
                    "--logging.name", "x" * 300, "--log-level", "warn"], capture_output=True, text=True, timeout=300)
check(t.returncode == 8 and f"I/O error: logging.name: cannot create {roots}/{'x' * 300}-" in t.stderr
      and "File name too long" in t.stderr, f"a generated name too long: exit {t.returncode}: {t.stderr[-800:]}")
# check probes that name as train makes it (it looked only at logging.runs_root and said "can be written"); the time in
# the name differs from train's, not its length.
r = run_check("--logging.runs_root", roots, "--logging.name", "x" * 300)
check(r.returncode == 8 and f"the run would stop on: I/O error: logging.name: cannot create {roots}/{'x' * 300}-" in r.stderr
      and "File name too long (a name of 316 bytes" in r.stderr,
      f"check of a generated name too long: exit {r.returncode}: {r.stderr[-800:]}")
# Two problems: the run stops on the one it meets first, and so does check's exit code (the data is listed first).
foreign_run = os.path.join(work, "foreign-run")


def foreign():
    shutil.rmtree(foreign_run, ignore_errors=True)
    os.makedirs(foreign_run)
    open(os.path.join(foreign_run, "config.toml"), "w").write("x = 1\n")


agree("a foreign config.toml and missing data", ["--logging.run_dir", foreign_run, "--data.path", os.path.join(work, "missing.h5")], 3,
      f"configuration error: logging.run_dir: {foreign_run}/config.toml was not written by shardtrain", foreign)

# ---- outputs: what cannot be made is named; check itself makes nothing -------------------------------------
r = run_check("--logging.run_dir", config)
check(r.returncode == 8 and f"logging.run_dir: {config} exists and is not a directory" in " ".join(line(r, "outputs")),
      f"run_dir is a file: {r.returncode} {r.stdout}")
fresh = os.path.join(work, "fresh", "run")
r = run_check("--logging.run_dir", fresh, "--resume", "auto")
check(r.returncode == 0 and not os.path.exists(os.path.join(work, "fresh")), f"check created {fresh}: {r.stdout}")
check(f"auto: no complete checkpoint in {fresh}/checkpoints yet" in " ".join(line(r, "resume")), f"a fresh run: {line(r, 'resume')}")
check(not [n for n in os.listdir(work) if n.startswith(".shardtrain-probe")], "the writability probes are removed")

# ---- space: a checkpoint, by the save's own estimate, against the file system's free space --------------------
r = run_check("--logging.run_dir", fresh, "--checkpoint.every_n_steps", "10", "--checkpoint.keep_last", "2")
space = " ".join(line(r, "space"))
check(r.returncode == 0 and space.startswith("space      ok: a checkpoint takes") and "keep_last = 2 needs 2" in space, f"space: {r.stdout}")
# A 379B-parameter model: its checkpoint (4281 GiB) fits on no disk a test runs on.
r = run_check("--logging.run_dir", fresh, "--checkpoint.every_n_steps", "10", "--model.hidden_size", "16384", "--model.intermediate_size",
              "65536", "--model.num_hidden_layers", "100", "--model.num_attention_heads", "128", "--model.num_key_value_heads", "8")
space = " ".join(line(r, "space"))
check(r.returncode == 8 and "space      FAILED: I/O error: a checkpoint takes 4" in space and "TiB" not in space and "not even one fits" in space,
      f"a checkpoint larger than the disk: exit {r.returncode}: {r.stdout}")
check(not line(run_check(), "space"), "no periodic saves, no space line")

check.finish("all check checks passed")
