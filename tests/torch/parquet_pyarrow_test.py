#!/usr/bin/env python3
"""shardtrain prepare-data on Parquet files that pyarrow wrote (Arrow C++, the writer of fineweb's own
files): fineweb's columns and pyarrow's defaults, each codec, data pages v2, the DELTA string encodings,
large_string, page checksums. Each file's dataset must equal, token for token, the one prepared from the
JSONL of pyarrow's own reading of the same file. A byte changed in a checksummed page, and a null text, are
exit 4 with the file named."""
import os
import shutil

from pyarrow_common import prepare as prepare_file, pyarrow_side, same_tokens, sample_texts
from torch_env import Test

t = Test()
args, check, work, env = t.args, t.check, t.work, t.env
texts = sample_texts(args.source)
report = pyarrow_side(env, "parquet", texts, work)
if report is None:
    raise SystemExit(1)
print(f"pyarrow {report['pyarrow']}: {len(texts)} texts in {len(report['cases'])} files")

# What each case must have made pyarrow write, read from the files' own metadata.
expected = {
    "fineweb-snappy": ("SNAPPY", "RLE_DICTIONARY"), "zstd-v2-pages": ("ZSTD", "RLE_DICTIONARY"),
    "gzip": ("GZIP", "RLE_DICTIONARY"), "brotli": ("BROTLI", "RLE_DICTIONARY"), "lz4": ("LZ4", "RLE_DICTIONARY"),
    "none-plain": ("UNCOMPRESSED", "PLAIN"), "delta-byte-array": ("ZSTD", "DELTA_BYTE_ARRAY"),
    "delta-length": ("SNAPPY", "DELTA_LENGTH_BYTE_ARRAY"), "large-string": ("SNAPPY", "RLE_DICTIONARY"),
    "checksums": ("SNAPPY", "RLE_DICTIONARY"),
}


def prepare(inp, name):
    return prepare_file(args, work, inp, name)


for name, (codec, encoding) in expected.items():
    case = report["cases"].get(name)
    check(case is not None, f"{name}: pyarrow wrote no such case")
    if case is None:
        continue
    check(case["codec"] == codec, f"{name}: pyarrow wrote {case['codec']}, the case asks for {codec}")
    check(encoding in case["encodings"], f"{name}: the text column's encodings are {case['encodings']}, without {encoding}")
    check(case["rows"] == len(texts), f"{name}: {case['rows']} rows for {len(texts)} texts")
    rc_p, from_parquet, err_p = prepare(os.path.join(work, f"{name}.parquet"), f"{name}-parquet")
    rc_j, from_jsonl, err_j = prepare(os.path.join(work, f"{name}.jsonl"), f"{name}-jsonl")
    check(rc_p == 0, f"{name}: prepare-data of the Parquet file: exit {rc_p}: {err_p[-1500:]}")
    check(rc_j == 0, f"{name}: prepare-data of pyarrow's JSONL: exit {rc_j}: {err_j[-1500:]}")
    if rc_p == 0 and rc_j == 0:
        equal = same_tokens(from_parquet, from_jsonl)
        check(equal, f"{name}: the datasets from Parquet and from pyarrow's reading differ")
        print(f"{name:17s} {case['codec']:12s} {','.join(case['encodings']):45s} {case['row_groups']} row groups: "
              f"{'the same tokens' if equal else 'DIFFERENT'}")

# One byte of the last page of the checksummed file changed: both readers refuse it.
case = report["cases"]["checksums"]
bad = os.path.join(work, "checksums-corrupt.parquet")
shutil.copy(os.path.join(work, "checksums.parquet"), bad)
with open(bad, "r+b") as f:
    f.seek(case["chunk_end"] - 3)
    byte = f.read(1)
    f.seek(case["chunk_end"] - 3)
    f.write(bytes([byte[0] ^ 0x5A]))
rc, _, err = prepare(bad, "checksums-corrupt")
check(rc == 4, f"a corrupt checksummed page: prepare-data exit {rc}, expected 4")
check(f"{bad}: row group" in err and "CRC does not match" in err, f"a corrupt checksummed page: {err.strip()[-600:]}")
print("corrupt page:", err.strip().splitlines()[-1] if err.strip() else "(no message)")
rc_theirs, _, err_theirs = env.run("python3", "-c", "import sys, pyarrow.parquet as pq; "
                                   "pq.read_table(sys.argv[1], page_checksum_verification=True)", bad)
check(rc_theirs != 0 and "CRC" in err_theirs, f"pyarrow read the corrupt page: exit {rc_theirs} {err_theirs[-300:]}")

rc, _, err = prepare(os.path.join(work, "with-null.parquet"), "with-null")
check(rc == 4 and 'with-null.parquet: row 10: column "text" is null' in err, f"a null text: exit {rc}: {err[-600:]}")
check(not os.path.exists(os.path.join(work, "with-null.h5")), "a failed prepare-data left a dataset behind")

check.finish("PASS: prepare-data reads pyarrow's Parquet files as pyarrow does, and refuses a corrupt page and a null text")
