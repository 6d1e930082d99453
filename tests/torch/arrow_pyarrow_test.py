#!/usr/bin/env python3
"""shardtrain prepare-data on Arrow IPC files that pyarrow wrote (Arrow C++, which the `datasets` library
saves with): a save_to_disk folder as datasets writes it (two streams of 1000-row batches with its metadata,
state.json, dataset_info.json), LZ4-frame and zstd bodies, the file format, Feather v2, string views, large
strings and dictionary deltas. Each dataset must equal, token for token, the one prepared from the JSONL of
pyarrow's own reading. A dataset tokenized by transformers' fast tokenizer (GPT-2's tokenizer.json), saved
as datasets saves one and as Parquet files pyarrow writes (its defaults; v2 pages, zstd, no dictionary, small
pages; int64 ids), imported with --token-field input_ids, must equal the one shardtrain tokenizes from the
same texts with the same file. A null text and a cut-short compressed file are exit 4 with the file named and
no dataset left behind."""
import os

from pyarrow_common import prepare as prepare_file, pyarrow_side, same_tokens, sample_texts
from torch_env import Test

t = Test()
args, check, work, env = t.args, t.check, t.work, t.env
texts = sample_texts(args.source)
gpt2 = os.path.join(args.source, "data", "fetched", "tokenizers", "gpt2-hf", "tokenizer.json")
report = pyarrow_side(env, "arrow", texts, work, gpt2)
if report is None:
    raise SystemExit(1)
cases = report["cases"]
print(f"pyarrow {report['pyarrow']}: {len(texts)} texts in {len(cases)} cases")


def prepare(inp, name):
    return prepare_file(args, work, inp, name)


plain = cases["plain"]["bytes"]
tokenized = cases.pop("tokenized")
for name, case in cases.items():
    check(case["rows"] == len(texts), f"{name}: {case['rows']} rows for {len(texts)} texts")
    rc_a, from_arrow, err_a = prepare(case["path"], f"{name}-arrow")
    rc_j, from_jsonl, err_j = prepare(os.path.join(work, f"{name}.jsonl"), f"{name}-jsonl")
    check(rc_a == 0, f"{name}: prepare-data of the Arrow input: exit {rc_a}: {err_a[-1500:]}")
    check(rc_j == 0, f"{name}: prepare-data of pyarrow's JSONL: exit {rc_j}: {err_j[-1500:]}")
    equal = rc_a == 0 and rc_j == 0 and same_tokens(from_arrow, from_jsonl)
    check(equal, f"{name}: the datasets from Arrow and from pyarrow's reading differ")
    print(f"{name:18s} {case['batches']:3d} batches {case['bytes']:>10,d} bytes {case.get('stats', {})}: "
          f"{'the same tokens' if equal else 'DIFFERENT'}")

# The compressed cases really are (so their bodies went through LZ4 frames or zstd), and the deltas are deltas.
for name in ("lz4", "zstd-file", "feather", "large-string-zstd"):
    check(cases[name]["bytes"] < 0.8 * plain, f"{name}: {cases[name]['bytes']} bytes, not compressed against {plain}")
deltas = cases["dictionary-deltas"]["stats"]
check(deltas["num_dictionary_deltas"] >= 2 and deltas["num_replaced_dictionaries"] == 0,
      f"dictionary-deltas: pyarrow read {deltas}, expected delta dictionaries and no replacements")
check(cases["saved"]["batches"] >= 2 * ((len(texts) // 2) // 1000), f"saved: {cases['saved']['batches']} batches")

# Already tokenized by transformers: imported as they are, they equal shardtrain's own tokenization.
rc_i, imported, err_i = prepare_file(args, work, tokenized["path"], "tokenized-imported", gpt2, ("--token-field", "input_ids"))
rc_t, own, err_t = prepare_file(args, work, os.path.join(work, "tokenized.jsonl"), "tokenized-own", gpt2)
check(rc_i == 0, f"tokenized: prepare-data --token-field input_ids: exit {rc_i}: {err_i[-1500:]}")
check(rc_t == 0, f"tokenized: prepare-data of the texts: exit {rc_t}: {err_t[-1500:]}")
equal = rc_i == 0 and rc_t == 0 and same_tokens(imported, own)
check(equal, "tokenized: the ids transformers' tokenizer made differ from shardtrain's tokenization of the same texts")
print(f"tokenized by {tokenized['tokenizer']}: {tokenized['tokens']:,d} ids in {tokenized['rows']} rows, imported: "
      f"{'the same tokens as shardtrain tokenizing the texts' if equal else 'DIFFERENT'}")

# The same ids as Parquet files pyarrow wrote (Arrow C++'s writer), imported with --token-field as well.
want = {"defaults": ("SNAPPY", "RLE_DICTIONARY", "INT32"), "v2-zstd-plain": ("ZSTD", "PLAIN", "INT32"),
        "int64-gzip": ("GZIP", "RLE_DICTIONARY", "INT64")}
for name, (codec, encoding, physical) in want.items():
    case = tokenized["parquet"][name]
    check(case["codec"] == codec and encoding in case["encodings"] and case["physical_type"] == physical
          and case["column"] == "input_ids.list.element",
          f"tokenized-{name}: pyarrow wrote {case}, the case asks for {codec}, {encoding}, {physical}")
    rc_p, from_parquet, err_p = prepare_file(args, work, case["path"], f"tokenized-{name}", gpt2, ("--token-field", "input_ids"))
    check(rc_p == 0, f"tokenized-{name}: prepare-data --token-field input_ids: exit {rc_p}: {err_p[-1500:]}")
    same = rc_p == 0 and rc_t == 0 and same_tokens(from_parquet, own)
    check(same, f"tokenized-{name}: the ids imported from Parquet differ from shardtrain's tokenization of the texts")
    print(f"tokenized-{name}.parquet ({case['row_groups']} row groups, {case['codec']}, {'/'.join(case['encodings'])}, "
          f"{case['physical_type']}): {'the same tokens' if same else 'DIFFERENT'}")

rc, ds, err = prepare(os.path.join(work, "with-null.arrow"), "with-null")
check(rc == 4 and 'with-null.arrow: row 10: column "text" is null' in err, f"a null text: exit {rc}: {err[-600:]}")
check(not os.path.exists(ds), "a failed prepare-data left a dataset behind")

# An LZ4 stream cut in the middle of a message: exit 4 naming the file.
cut = os.path.join(work, "lz4-cut.arrow")
with open(cases["lz4"]["path"], "rb") as f:
    data = f.read()
with open(cut, "wb") as f:
    f.write(data[: len(data) // 2 + 5])
rc, ds, err = prepare(cut, "lz4-cut")
check(rc == 4 and f"{cut}: the message at byte" in err, f"a cut-short stream: exit {rc}: {err[-600:]}")
check(not os.path.exists(ds), "a failed prepare-data left a dataset behind")
print("cut short:", err.strip().splitlines()[-1] if err.strip() else "(no message)")

check.finish("PASS: prepare-data reads pyarrow's Arrow files and datasets' save_to_disk folders as pyarrow does, and imports transformers' token ids as shardtrain tokenizes")
