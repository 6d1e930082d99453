#!/usr/bin/env python3
"""`shardtrain dataset info` against values computed here. The tokenizer has no merges (vocabulary: the 3
special tokens and the 256 bytes), so every document's token count is its byte count and every figure can be
derived from the texts alone: documents, tokens, lengths, samples per layout, what padding cuts and pads,
a mixture's shares. --verify reads every block and stops at one damaged on disk (exit 4, the file named),
which opening and a plain `info` do not notice; a file that is no dataset is refused with exit 4 too."""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import clitest  # noqa: E402

args = clitest.parse_args()
check = clitest.Checks()
work = clitest.fresh_workdir(args)
st = args.shardtrain

# Documents of known byte lengths (ASCII: one byte per character, one token per byte).
lengths = [5, 17, 64, 65, 100, 250, 700, 1024, 3000, 4, 63, 129]
corpus = os.path.join(work, "corpus")
os.makedirs(corpus)
for i, n in enumerate(lengths):
    text = "".join(chr(97 + (i * 7 + k) % 26) for k in range(n))
    with open(os.path.join(corpus, f"doc_{i:02d}.txt"), "w") as f:
        f.write(text)
tok, ds = os.path.join(work, "bytes.json"), os.path.join(work, "bytes.h5")
subprocess.run([st, "tokenizer", "train", "--input", corpus, "--vocab-size", "260", "--min-frequency", "1000000000", "--output", tok, "--log-level", "error"], check=True)
subprocess.run([st, "prepare-data", "-t", tok, "-i", corpus, "-o", ds, "--validation-fraction", "0", "--log-level", "warn"], check=True)


def info(*extra):
    return subprocess.run([st, "dataset", "info", *extra], capture_output=True, text=True)


SEQ = 64
r = info(ds, "--seq-len", str(SEQ), "--json")
check(r.returncode == 0, f"dataset info: {r.stderr}")
j = json.loads(r.stdout)["datasets"][0]
check(j["documents"] == len(lengths) and j["tokens"] == sum(lengths), f"documents and tokens: {j['documents']} {j['tokens']}")
srt = sorted(lengths)
check(j["document_tokens"] == {"min": srt[0], "median": srt[len(srt) // 2], "mean": sum(lengths) / len(lengths), "max": srt[-1]},
      f"lengths: {j['document_tokens']}")
check(j["tokenizer"]["vocab_size"] == 259 and (j["tokenizer"]["bot_id"], j["tokenizer"]["eot_id"], j["tokenizer"]["pad_id"]) == (0, 1, 2),
      f"tokenizer: {j['tokenizer']}")
check(j["tokens_mapped"] and j["file_bytes"] == os.path.getsize(ds), "format 2, mapped; the file's size")
train = j["train"]
check(train["documents"] == len(lengths) and train["tokens"] == sum(lengths) and j["validation"]["documents"] == 0, f"splits: {train}")
# packed: the documents joined with one EOT each, cut into windows of SEQ + 1 with stride SEQ.
check(train["packed"]["samples"] == (sum(n + 1 for n in lengths) - 1) // SEQ, f"packed samples: {train['packed']}")
# padded: [BOT] doc [EOT] in SEQ + 1 positions.
cut = sum(1 for n in lengths if n > SEQ - 1)
lost = sum(max(0, n + 1 - (SEQ + 1)) for n in lengths)
padding = 1 - sum(min(n + 2, SEQ) for n in lengths) / (len(lengths) * SEQ)
p = train["padded"]
check(p["samples"] == len(lengths) and p["documents_cut"] == cut and p["tokens_cut"] == lost
      and abs(p["padding_fraction"] - padding) < 1e-12, f"padded: {p}, expected cut {cut}, lost {lost}, padding {padding}")
text = info(ds, "--seq-len", str(SEQ))
check(text.returncode == 0 and f"{len(lengths)} documents, {sum(lengths)} tokens" in text.stdout
      and f"padded {len(lengths)} samples ({cut} documents cut" in text.stdout, f"text output: {text.stdout}")

# A mixture preview: the dataset with itself under another name, 3:1. N = both sources' samples; shares by
# largest remainder.
copy = os.path.join(work, "copy.h5")
with open(ds, "rb") as a, open(copy, "wb") as b:
    b.write(a.read())
r = info(f"{ds}:3", f"{copy}:1", "--seq-len", str(SEQ), "--json")
check(r.returncode == 0, f"mixture preview: {r.stderr}")
mix = json.loads(r.stdout)["mixture"]
n = train["packed"]["samples"]
check(mix["samples_per_epoch"] == 2 * n, f"mixture epoch: {mix}")
shares = [s["samples_per_epoch"] for s in mix["sources"]]
exact = [0.75 * 2 * n, 0.25 * 2 * n]
check(sum(shares) == 2 * n and all(abs(a - b) < 1 for a, b in zip(shares, exact)), f"shares {shares}, exact {exact}")
check(abs(mix["sources"][0]["times_seen_per_epoch"] - shares[0] / n) < 1e-12, f"times seen: {mix['sources'][0]}")

# Damage one token of the stored file (an id stays inside the vocabulary, so only the checksum can tell).
# Its place: the first document's ids, little-endian u32, found in the file.
ids = json.loads(subprocess.run([st, "tokenizer", "encode", "-t", tok, "--json", "--text", "abcde"],
                                capture_output=True, text=True, check=True).stdout)
ids = ids["ids"] if isinstance(ids, dict) else ids
raw = bytearray(open(ds, "rb").read())
at = raw.find(struct.pack(f"<{len(ids)}I", *ids))
check(at > 0, f"the first document's ids {ids} are in the file")
damaged = os.path.join(work, "damaged.h5")
raw[at] = raw[at] ^ 0x01
open(damaged, "wb").write(raw)
r = info(damaged, "--seq-len", str(SEQ))
check(r.returncode == 0, f"a plain info does not read the tokens: {r.stderr}")
r = info(damaged, "--verify")
check(r.returncode == 4 and damaged in r.stderr and "do not match their checksum" in r.stderr,
      f"--verify finds the damage: exit {r.returncode}: {r.stderr}")
r = info(ds, "--verify")
check(r.returncode == 0 and "checksums: ok (1 blocks" in r.stdout, f"--verify on the intact file: {r.stdout} {r.stderr}")

# Bad input: not a dataset; a bad mixture entry; a bad seq_len.
r = info(tok)
check(r.returncode == 4 and tok in r.stderr, f"not HDF5: exit {r.returncode}: {r.stderr}")
r = info(f"{ds}:0")
check(r.returncode == 2 and "argument 1: the weight of" in r.stderr and "positive number" in r.stderr,
      f"weight 0: exit {r.returncode} (a command line's value: 2): {r.stderr}")
# Entries read as data.mixture reads them: one file twice however spelled, and an unweighted entry among weighted ones,
# are refused as train refuses them (they were previewed as shares).
twice = os.path.join(os.path.dirname(ds), ".", os.path.basename(ds))
r = info(f"{ds}:1", f"{twice}:1")
check(r.returncode == 2 and "argument 2: " in r.stderr and "is the same file as argument 1" in r.stderr,
      f"one file twice: exit {r.returncode}: {r.stderr}")
r = info(f"{ds}:0.5", ds)
check(r.returncode == 2 and "argument 2: expected PATH:WEIGHT" in r.stderr, f"a weighted and an unweighted entry: exit {r.returncode}: {r.stderr}")
r = info(ds, "--seq-len", "0")
check(r.returncode != 0 and "--seq-len" in r.stderr, f"seq-len 0: exit {r.returncode}: {r.stderr}")

check.finish("all dataset info checks passed")
