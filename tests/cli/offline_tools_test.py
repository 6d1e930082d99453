#!/usr/bin/env python3
"""What a hostile audit of the offline tools found (2026-11-28, audit B), each now refused by name or fixed:
- consolidate's temporaries: OUT.tmp, a user's file or folder, was replaced or deleted (A1); a failed consolidation
  left its temporary behind (E2); -o "" and a trailing slash failed with "internal error" after the work and left
  .tmp files (B4); a read-only folder for safetensors was "internal error" (B4): now 2 before any work, 8 naming
  the path, and nothing left but the user's own files;
- a tokenizer that is not the model's (C3): generate printed garbage with exit 0, consolidate shipped it (or an
  invalid or missing file, "none shipped"); --tokenizer with --format hdf5 was ignored: now 4 naming the file, 2;
- a Hugging Face config.json with fewer layers than its weights loaded a smaller model without a word (C4): 5
  naming the first tensor left over and its file, in generate and evaluate;
- NaN weights made generate print garbage and evaluate a NaN loss (C8): 5 naming the tensor;
- a damaged consolidated file's data was a data error (4), a truncated one a checkpoint error (5): both 5 (E6);
- checkpoint info FILE said "no such checkpoint directory", paths were printed twice, --temperature inf ran (F);
- a SIGKILLed export's temporary (OUT.tmp-HOST-PID) stayed for ever: the next export of OUT on that host removes it."""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = os.path.abspath(args.shardtrain)
source = os.path.abspath(args.source)
tiny = os.path.join(source, "configs/tiny-cpu.toml")
tokenizers = os.path.join(source, "data/fetched/tokenizers")
if not os.path.isdir(tokenizers):
    print(f"FAIL: {tokenizers} missing: run ./scripts/fetch-data.sh first", file=sys.stderr)
    sys.exit(1)
# The quickstart's tokenizer and dataset, made here (a clean clone has neither before quickstart.sh runs).
os.makedirs(os.path.join(work, "dataset"))
own_tokenizer, dataset = clitest.prepare_dataset(args, clitest.corpus(args, "sotu"), os.path.join(work, "dataset"), 4096,
                                                 "sotu-bpe4k", 0.02)


run = clitest.shardtrain_runner(args, work)


def expect(what, cmd, code, *needles, np=None):
    rc, out, err = run(cmd, np=np)
    lines = [line for line in err.splitlines() if " E] " in line]
    check(rc == code and all(n in err for n in needles) and "internal error" not in err,
          f"{what}: exit {rc} (expected {code}) naming {needles}: {err[-700:]}")
    check(len(lines) == 1, f"{what}: one error line, got {len(lines)}")
    return rc, out, err


def text_of(path):
    try:
        return open(path, errors="replace").read()
    except OSError as e:
        return str(e)


def names():
    return sorted(os.listdir(work))


def leftovers(before):
    return [n for n in names() if n not in before]


def weight_bytes(name, begin, count):
    """count float32 values of a tensor, from the f32 export hf/, as they lie in any uncompressed file."""
    with open(os.path.join(work, "hf", "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        start = json.loads(f.read(n))[name]["data_offsets"][0]
        f.seek(8 + n + start + 4 * begin)
        return f.read(4 * count)


def flip_data_byte(path):
    """Flips a byte of a weight's data (not of HDF5's metadata): found by its values."""
    data = open(path, "rb").read()
    at = data.find(weight_bytes("model.layers.1.mlp.down_proj.weight", 1000, 16))
    check(at > 0, f"{path}: the weight's bytes found")
    flip_byte(path, at + 6)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def greedy(checkpoint, *extra):
    rc, out, err = run(["generate", "--checkpoint", checkpoint, "--prompt", "The nation", "--max-tokens", "6",
                        "--temperature", "0", *extra])
    check(rc == 0, f"generate from {checkpoint} {extra}: exit {rc}: {err[-500:]}")
    return out


# A tiny run's checkpoint, which records its tokenizer (sotu-bpe4k.json: path and hash).
rc, _, err = run(["train", "-c", tiny, "--logging.run_dir", "run", "--schedule.max_steps", "1",
                  "--checkpoint.every_n_steps", "1", "--schedule.warmup_steps", "0", "--schedule.eval_every", "0",
                  "--logging.progress", "lines", "--data.path", dataset], np=1)
if rc != 0:
    check(False, f"the tiny run: exit {rc}: {err[-800:]}")
    check.finish("")
ck = "run/checkpoints/step_00000001"
reference = greedy(ck)
check(reference.startswith("The nation") and len(reference) > len("The nation\n"), f"greedy text: {reference!r}")

# A1: OUT.tmp, a user's folder and a user's file, are untouched; the outputs are whole and nothing else is left.
os.makedirs(os.path.join(work, "hf.tmp"))
open(os.path.join(work, "hf.tmp", "notes.txt"), "w").write("important\n")
open(os.path.join(work, "full.h5.tmp"), "w").write("keep\n")
before = names()
rc, _, err = run(["consolidate", ck, "-o", "hf", "--format", "safetensors"])
check(rc == 0, f"consolidate to hf beside a user's hf.tmp: exit {rc}: {err[-500:]}")
rc, _, err = run(["consolidate", ck, "-o", "full.h5"])
check(rc == 0, f"consolidate to full.h5 beside a user's full.h5.tmp: exit {rc}: {err[-500:]}")
check(text_of(os.path.join(work, "hf.tmp", "notes.txt")) == "important\n", "hf.tmp/notes.txt survives")
check(text_of(os.path.join(work, "full.h5.tmp")) == "keep\n", "full.h5.tmp survives, unchanged")
check(leftovers(before) == ["full.h5", "hf"], f"only the two outputs are new: {leftovers(before)}")
check(sorted(os.listdir(os.path.join(work, "hf"))) ==
      ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"],
      f"the export's files: {os.listdir(os.path.join(work, 'hf'))}")
check(greedy("hf") == reference and greedy("full.h5") == reference, "the exports give the checkpoint's greedy text")

# What a SIGKILLed export of this host left (no handler runs: the out-of-memory killer) is removed by the next export of
# that output, with a warning; another host's, a running process's and a user's look-alike stay.
host = socket.gethostname()
sleeper = subprocess.Popen(["sleep", "60"])
dead = subprocess.Popen(["true"])
dead.wait()
leftover = {f"hf2.tmp-{host}-{dead.pid}": True, f"hf2.tmp-{host}-{dead.pid}-3": True, f"hf2.tmp-{host}-{sleeper.pid}": False,
            f"hf2.tmp-elsewhere-{dead.pid}": False, f"hf2.tmp-{host}-x{dead.pid}": False}
for name in leftover:
    os.makedirs(os.path.join(work, name))
    open(os.path.join(work, name, "model.safetensors"), "w").write("half\n")
rc, _, err = run(["consolidate", ck, "-o", "hf2", "--format", "safetensors"])
sleeper.kill()
for name, swept in leftover.items():
    check(os.path.exists(os.path.join(work, name)) != swept and (f"{name}: removed, the temporary of an export on this host" in err) == swept,
          f"{name}: {'removed' if swept else 'kept'} by the next export: exit {rc}: {err[-800:]}")
check(rc == 0 and greedy("hf2") == reference, f"the export after the sweep: exit {rc}")
for name in leftover:
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
shutil.rmtree(os.path.join(work, "hf2"), ignore_errors=True)

# B4: outputs checked before any work.
before = names()
expect("consolidate -o ''", ["consolidate", ck, "-o", ""], 2, "--output: expected a file or folder name")
expect("consolidate -o x.h5/ (hdf5)", ["consolidate", ck, "-o", "x.h5/"], 2,
       "--output x.h5/: a folder name, but --format hdf5 writes one file")
expect("consolidate -o hf (exists)", ["consolidate", ck, "-o", "hf/", "--format", "safetensors"], 2,
       "hf/: already exists; consolidation never overwrites")
open(os.path.join(work, "a-file"), "w").write("x\n")
expect("consolidate -o a-file/sub", ["consolidate", ck, "-o", "a-file/sub", "--format", "safetensors"], 8,
       "a-file/sub: cannot create the temporary folder a-file/sub.tmp-", "Not a directory")
check(leftovers(before) == ["a-file"], f"nothing left by the refusals: {leftovers(before)}")
rc, out, err = run(["consolidate", ck, "-o", "slash/", "--format", "safetensors"])
check(rc == 0 and os.path.isfile(os.path.join(work, "slash", "model.safetensors")) and
      not os.path.exists(os.path.join(work, "slash", ".tmp")) and
      open(os.path.join(work, "slash", "model.safetensors"), "rb").read() ==
      open(os.path.join(work, "hf", "model.safetensors"), "rb").read(),
      f"-o slash/: the export in slash, as in hf: exit {rc}: {err[-400:]} {os.listdir(work)}")
ro = os.path.join(work, "ro")
os.makedirs(ro)
if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", ro]).returncode == 0:
    try:
        expect("consolidate into a read-only folder", ["consolidate", ck, "-o", "ro/hfx", "--format", "safetensors"],
               8, "I/O error: ro/hfx: cannot create the temporary folder ro/hfx.tmp-", "Read-only file system")
    finally:
        subprocess.run(["umount", ro])
else:
    print("read-only folder: skipped (needs root to mount a tmpfs)")

# E2: a failed consolidation leaves nothing (a flipped data byte: 5).
shutil.copytree(os.path.join(work, ck), os.path.join(work, "ck_flip"))
flip_data_byte(os.path.join(work, "ck_flip", "rank_00000.h5"))
before = names()
for fmt in ("hdf5", "safetensors"):
    expect(f"consolidate a damaged checkpoint ({fmt})", ["consolidate", "ck_flip", "-o", f"flip-{fmt}", "--format", fmt],
           5, "checkpoint error: ck_flip/rank_00000.h5: cannot read", "(corrupted data fails its checksum)")
check(leftovers(before) == [], f"no temporary left by the failed consolidations: {leftovers(before)}")
_, _, err = run(["checkpoint", "info", "ck_flip", "--verify"])
check(err.count("ck_flip/rank_00000.h5") == 1, f"the file named once: {err[-400:]}")

# C3: a tokenizer that is not the model's.
small = os.path.join(work, "small.json")
subprocess.run([st, "tokenizer", "train", "--input", os.path.join(clitest.corpus(args, "sotu"), "1790_george_washington_n.txt"),
                "--vocab-size", "300", "--output", small, "--log-level", "warn"], check=True, capture_output=True)
r50k = os.path.join(tokenizers, "r50k_base.tiktoken")
expect("generate --tokenizer r50k", ["generate", "--checkpoint", ck, "--prompt", "The", "--tokenizer", r50k], 4,
       f"data error: {r50k}: 50257 token ids, more than the model's vocabulary of 4096")
expect("generate --tokenizer small.json", ["generate", "--checkpoint", ck, "--prompt", "The", "--tokenizer", small], 4,
       f"data error: {small}: tokenizer fnv1a64:", "is not the one run/checkpoints/step_00000001 was trained with",
       "fnv1a64:")
expect("generate hf --tokenizer small.json", ["generate", "--checkpoint", "hf", "--prompt", "The", "--tokenizer", small],
       4, f"{small}: tokenizer fnv1a64:", "is not the one hf was trained with (hf/tokenizer.json")
check(greedy(ck, "--tokenizer", own_tokenizer) == reference,
      "generate --tokenizer with the model's own tokenizer")
open(os.path.join(work, "bad.json"), "w").write("{not json\n")
before = names()
for name, tok, needle in (("llama3", os.path.join(tokenizers, "llama3"), "128256 token ids, more than the model's"),
                          ("small", small, "is not the one"),
                          ("bad", "bad.json", "--tokenizer bad.json: cannot be read: bad.json: not valid JSON"),
                          ("missing", "/nonexistent.json", "--tokenizer /nonexistent.json: cannot be read")):
    expect(f"consolidate --tokenizer {name}", ["consolidate", ck, "-o", f"hf_{name}", "--format", "safetensors",
                                               "--tokenizer", tok], 4, "data error:", needle)
rc, out, err = run(["consolidate", ck, "-o", "hf_forced", "--format", "safetensors", "--tokenizer", small,
                    "--tokenizer-unchecked"])
check(rc == 0 and text_of(os.path.join(work, "hf_forced", "tokenizer.json")) == text_of(small),
      f"--tokenizer-unchecked ships the tokenizer it is given: exit {rc}: {err[-300:]}")
shutil.rmtree(os.path.join(work, "hf_forced"), ignore_errors=True)
expect("consolidate --tokenizer with hdf5", ["consolidate", ck, "-o", "t.h5", "--tokenizer", small], 2,
       f"--tokenizer {small}: only --format safetensors ships a tokenizer")
check(leftovers(before) == [], f"nothing left by the tokenizer refusals: {leftovers(before)}")

# C4: a config.json with fewer layers than its weights.
shutil.copytree(os.path.join(work, "hf"), os.path.join(work, "hf3"))
cfg_path = os.path.join(work, "hf3", "config.json")
cfg = json.load(open(cfg_path))
cfg["num_hidden_layers"] -= 1
json.dump(cfg, open(cfg_path, "w"))
last = cfg["num_hidden_layers"]
expect("generate hf3", ["generate", "--checkpoint", "hf3", "--prompt", "The"], 5,
       f"checkpoint error: hf3/model.safetensors: tensor 'model.layers.{last}.input_layernorm.weight' is not part of "
       "the model that hf3 describes")
eval_args = ["--data.path", dataset, "--data.seq_len", "32", "--data.global_batch_size", "2", "--batches", "1"]
expect("evaluate hf3", ["evaluate", "-w", "hf3", *eval_args], 5, f"tensor 'model.layers.{last}.", np=1)

# C8: NaN weights.
shutil.copytree(os.path.join(work, "hf"), os.path.join(work, "hfnan"))
with open(os.path.join(work, "hfnan", "model.safetensors"), "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    begin, end = json.loads(f.read(n))["model.norm.weight"]["data_offsets"]
    f.seek(8 + n + begin + 4 * 5)
    f.write(struct.pack("<f", float("nan")))
expect("generate hfnan", ["generate", "--checkpoint", "hfnan", "--prompt", "The"], 5,
       "checkpoint error: hfnan/model.safetensors: tensor 'model.norm.weight' holds nan at element 5")
expect("evaluate hfnan", ["evaluate", "-w", "hfnan", *eval_args], 5, "tensor 'model.norm.weight' holds nan", np=1)
rc, out, err = run(["evaluate", "-w", "hf", *eval_args], np=1)
check(rc == 0 and " loss " in out and "nan" not in out, f"evaluate hf: exit {rc}: {out[-300:]} {err[-300:]}")

# E6: a consolidated file's damaged data, like a truncated one, is a checkpoint error.
shutil.copy(os.path.join(work, "full.h5"), os.path.join(work, "full_flip.h5"))
flip_data_byte(os.path.join(work, "full_flip.h5"))
expect("generate full_flip.h5", ["generate", "--checkpoint", "full_flip.h5", "--prompt", "The"], 5,
       "checkpoint error: full_flip.h5: cannot read", "(corrupted data fails its checksum)")
with open(os.path.join(work, "full_cut.h5"), "wb") as f:
    f.write(open(os.path.join(work, "full.h5"), "rb").read()[:4096])
expect("generate full_cut.h5", ["generate", "--checkpoint", "full_cut.h5", "--prompt", "The"], 5, "full_cut.h5")

# F: messages.
_, _, err = expect("checkpoint info FILE", ["checkpoint", "info", "full.h5"], 5,
                   "full.h5: is a file, not a checkpoint: expected a step_N folder")
expect("checkpoint info CHECKPOINT/index.h5", ["checkpoint", "info", ck + "/index.h5"], 5,
       f"{ck}/index.h5: is a file of the checkpoint {ck}: pass that folder")
_, _, err = expect("generate --checkpoint tok.json", ["generate", "--checkpoint", "bad.json", "--prompt", "x"], 5,
                   "bad.json: not an HDF5 file")
check(err.count("bad.json") == 1, f"the file named once: {err[-300:]}")
expect("generate --temperature inf", ["generate", "--checkpoint", ck, "--temperature", "inf"], 2,
       "--temperature inf: expected a finite number >= 0")

check.finish("PASS: offline tools refuse what they cannot do well, and leave nothing behind")
