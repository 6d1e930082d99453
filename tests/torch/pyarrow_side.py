"""Inside scripts/torch-env.sh: Parquet files written by pyarrow (Arrow C++, the library fineweb's own files
were written with) for parquet_pyarrow_test.py to give to shardtrain prepare-data.

    python3 pyarrow_side.py TEXTS.json OUT_DIR

TEXTS.json is a list of strings. OUT_DIR gets one file per case below, and pyarrow's own reading of each
text column as CASE.jsonl ({"text": ...} per row), for the test to prepare the same texts from; prints a
JSON object {"pyarrow": version, "cases": {case: {"rows", "row_groups", "codec", "encodings", "chunk_end",
"created_by"}}}; chunk_end is where the text column's last chunk ends (inside its last page)."""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

texts_path, out = sys.argv[1], sys.argv[2]
texts = json.load(open(texts_path, encoding="utf-8"))
n = len(texts)


def fineweb_table(text_type=pa.string()):
    """fineweb's columns, in its order, around the texts."""
    return pa.table({
        "text": pa.array(texts, type=text_type),
        "id": [f"<urn:uuid:{i:08d}>" for i in range(n)],
        "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{i}" for i in range(n)],
        "date": ["2024-02-21T00:00:00Z"] * n,
        "file_path": ["s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/0/warc/0.warc.gz"] * n,
        "language": ["en"] * n,
        "language_score": pa.array([0.5 + (i % 7) / 16 for i in range(n)], type=pa.float64()),
        "token_count": pa.array([len(t) // 4 for t in texts], type=pa.int64()),
    })


CASES = {
    # what fineweb's writer asked of pyarrow: snappy, its defaults otherwise (dictionary, data pages v1)
    "fineweb-snappy": dict(compression="snappy"),
    "zstd-v2-pages": dict(compression="zstd", data_page_version="2.0", row_group_size=2000, data_page_size=16384),
    "gzip": dict(compression="gzip", row_group_size=5000),
    "brotli": dict(compression="brotli"),
    "lz4": dict(compression="lz4"),
    "none-plain": dict(compression="none", use_dictionary=False),
    "delta-byte-array": dict(compression="zstd", use_dictionary=False, column_encoding={"text": "DELTA_BYTE_ARRAY"}),
    "delta-length": dict(compression="snappy", use_dictionary=False, data_page_version="2.0",
                         column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY"}),
    "large-string": dict(compression="snappy", text_type=pa.large_string()),
    "checksums": dict(compression="snappy", write_page_checksum=True, data_page_size=65536),
}

report = {}
for name, options in CASES.items():
    options = dict(options)
    table = fineweb_table(options.pop("text_type", pa.string()))
    path = os.path.join(out, f"{name}.parquet")
    pq.write_table(table, path, **options)
    back = pq.read_table(path, columns=["text"]).column("text").to_pylist()
    assert back == texts, name
    with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
        for t in back:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    meta = pq.ParquetFile(path).metadata
    last = meta.row_group(meta.num_row_groups - 1).column(0)  # the text column's last chunk
    start = last.dictionary_page_offset if last.has_dictionary_page else last.data_page_offset
    report[name] = {
        "rows": meta.num_rows, "row_groups": meta.num_row_groups, "codec": last.compression,
        "encodings": sorted(set(e for g in range(meta.num_row_groups) for e in meta.row_group(g).column(0).encodings)),
        "chunk_end": start + last.total_compressed_size, "created_by": meta.created_by,
    }

# A null text among the others, for the error.
with_null = pa.table({"text": pa.array(texts[:10] + [None] + texts[10:20])})
pq.write_table(with_null, os.path.join(out, "with-null.parquet"))
print(json.dumps({"pyarrow": pa.__version__, "cases": report}))
