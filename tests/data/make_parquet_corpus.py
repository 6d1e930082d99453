"""A fineweb-shaped corpus for timing prepare-data on Parquet against JSONL (docs/performance.md): the default
corpus cut into documents of about 3 KB (fineweb's mean) at sentence ends, copied COPIES times, written as
FILES Parquet files with fineweb's columns by pyarrow as fineweb's writer called it (snappy, its defaults
otherwise), as the same number of JSONL files with the same texts in the same order, and as a folder the way
the datasets library's save_to_disk writes one (Arrow streams of 1000-row batches, uncompressed, and its
state.json). Run inside scripts/torch-env.sh, which has pyarrow:

    scripts/torch-env.sh run python3 tests/data/make_parquet_corpus.py CORPUS_DIR OUT_DIR COPIES FILES
"""
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

corpus, out, copies, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
docs = []
for name in sorted(os.listdir(corpus)):
    doc = ""
    for sentence in open(os.path.join(corpus, name), encoding="utf-8").read().split(". "):
        doc += sentence + ". "
        if len(doc) >= 3000:
            docs.append(doc)
            doc = ""
    if doc.strip():
        docs.append(doc)
docs = docs * copies
os.makedirs(os.path.join(out, "parquet"), exist_ok=True)
os.makedirs(os.path.join(out, "jsonl"), exist_ok=True)
os.makedirs(os.path.join(out, "arrow"), exist_ok=True)
data_files = []
per_file = (len(docs) + files - 1) // files
for f in range(files):
    part = docs[f * per_file:(f + 1) * per_file]
    n = len(part)
    table = pa.table({
        "text": part, "id": [f"<urn:uuid:{f:03d}-{i:08d}>" for i in range(n)], "dump": ["CC-MAIN-2024-10"] * n,
        "url": [f"https://example.org/{f}/{i}" for i in range(n)], "date": ["2024-02-21T00:00:00Z"] * n,
        "file_path": ["s3://commoncrawl/crawl-data/CC-MAIN-2024-10/0.warc.gz"] * n, "language": ["en"] * n,
        "language_score": pa.array([0.9] * n, type=pa.float64()),
        "token_count": pa.array([len(t) // 4 for t in part], type=pa.int64()),
    })
    pq.write_table(table, os.path.join(out, "parquet", f"{f:03d}_00000.parquet"), compression="snappy")
    with open(os.path.join(out, "jsonl", f"{f:03d}_00000.jsonl"), "w", encoding="utf-8") as j:
        for t in part:
            j.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    data_files.append({"filename": f"data-{f:05d}-of-{files:05d}.arrow"})
    with pa.RecordBatchStreamWriter(os.path.join(out, "arrow", data_files[-1]["filename"]), table.schema) as w:
        w.write_table(table, max_chunksize=1000)
with open(os.path.join(out, "arrow", "state.json"), "w") as st:
    json.dump({"_data_files": data_files, "_split": "train"}, st, indent=2)
print(f"{len(docs)} documents, {sum(len(d.encode()) for d in docs) / 1e6:.1f} MB of text, in {files} files of each kind")
