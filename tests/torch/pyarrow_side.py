"""Inside scripts/torch-env.sh: Parquet and Arrow IPC files written by pyarrow (Arrow C++: the library
fineweb's own files were written with, and the one the `datasets` library saves with) for
parquet_pyarrow_test.py and arrow_pyarrow_test.py to give to shardtrain prepare-data.

    python3 pyarrow_side.py parquet|arrow TEXTS.json OUT_DIR [TOKENIZER_JSON]

TEXTS.json is a list of strings. OUT_DIR gets one file per case below, and pyarrow's own reading of each
text column as CASE.jsonl ({"text": ...} per row), for the test to prepare the same texts from; prints a
JSON object {"pyarrow": version, "cases": {case: {...}}}. Parquet cases report "rows", "row_groups",
"codec", "encodings", "chunk_end" (where the text column's last chunk ends, inside its last page) and
"created_by"; Arrow cases "rows", "batches", "bytes", "path" and pyarrow's reading "stats" (record batches,
dictionary batches, deltas). With TOKENIZER_JSON, arrow also writes OUT_DIR/tokenized, a save_to_disk folder of
the texts as transformers' fast tokenizer of that file tokenizes them (input_ids, attention_mask), the way
`dataset.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])` leaves them."""
import json
import os
import sys

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

mode, texts_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
tokenizer_json = sys.argv[4] if len(sys.argv) > 4 else None
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


PARQUET_CASES = {
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


def write_jsonl(name, back):
    assert back == texts, name
    with open(os.path.join(out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
        for t in back:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")


def parquet_cases():
    report = {}
    for name, options in PARQUET_CASES.items():
        options = dict(options)
        table = fineweb_table(options.pop("text_type", pa.string()))
        path = os.path.join(out, f"{name}.parquet")
        pq.write_table(table, path, **options)
        write_jsonl(name, pq.read_table(path, columns=["text"]).column("text").to_pylist())
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
    return report


def dictionary_batches(batch_rows):
    """The texts dictionary-encoded, batch by batch, each batch's dictionary extending the one before (what
    emit_dictionary_deltas turns into delta dictionary batches)."""
    uniques, index, batches = [], {}, []
    for begin in range(0, n, batch_rows):
        ids = []
        for t in texts[begin:begin + batch_rows]:
            if t not in index:
                index[t] = len(uniques)
                uniques.append(t)
            ids.append(index[t])
        column = pa.DictionaryArray.from_arrays(pa.array(ids, type=pa.int32()), pa.array(list(uniques)))
        batches.append(pa.record_batch({"text": column}))
    return batches


def save_to_disk(folder, parts, metadata):
    """A folder as datasets' save_to_disk writes one: a stream per part (1000-row batches), state.json,
    dataset_info.json."""
    os.makedirs(folder, exist_ok=True)
    files = []
    for k, part in enumerate(parts):
        name = f"data-{k:05d}-of-{len(parts):05d}.arrow"
        with pa.RecordBatchStreamWriter(os.path.join(folder, name), part.schema.with_metadata(metadata)) as w:
            w.write_table(part, max_chunksize=1000)
        files.append({"filename": name})
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"_data_files": files, "_fingerprint": "a1b2c3", "_format_columns": None, "_format_kwargs": {},
                   "_format_type": None, "_output_all_columns": False, "_split": "train"}, f, indent=2)
    with open(os.path.join(folder, "dataset_info.json"), "w") as f:
        json.dump({"features": {c: {"_type": "Value"} for c in parts[0].column_names}}, f, indent=2)
    return [os.path.join(folder, x["filename"]) for x in files]


def tokenized_case():
    """The texts through transformers' fast tokenizer, saved as a tokenized dataset is."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json)
    enc = tok(texts)
    table = pa.table({"input_ids": pa.array(enc["input_ids"], type=pa.list_(pa.int32())),
                      "attention_mask": pa.array(enc["attention_mask"], type=pa.list_(pa.int8()))})
    meta = {b"huggingface": json.dumps({"info": {"features": {
        "input_ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"},
        "attention_mask": {"feature": {"dtype": "int8", "_type": "Value"}, "_type": "Sequence"}}}}).encode()}
    half = n // 2
    save_to_disk(os.path.join(out, "tokenized"), [table.slice(0, half), table.slice(half)], meta)
    write_jsonl("tokenized", texts)
    # The same table as Parquet (what the Hub's Parquet export of a tokenized dataset holds): pyarrow's defaults
    # (snappy, dictionary, v1 pages); v2 pages, zstd, no dictionary, small pages and row groups; int64 ids.
    parquet = {}
    wide = table.set_column(0, "input_ids", table.column("input_ids").cast(pa.list_(pa.int64())))
    for name, t, options in (("defaults", table, {}),
                             ("v2-zstd-plain", table, {"data_page_version": "2.0", "compression": "zstd", "use_dictionary": False,
                                                       "row_group_size": 5000, "data_page_size": 8192}),
                             ("int64-gzip", wide, {"compression": "gzip", "row_group_size": 20000})):
        path = os.path.join(out, f"tokenized-{name}.parquet")
        pq.write_table(t, path, **options)
        md = pq.ParquetFile(path).metadata
        chunks = [md.row_group(g).column(0) for g in range(md.num_row_groups)]
        parquet[name] = {"path": path, "row_groups": md.num_row_groups, "codec": chunks[0].compression,
                         "encodings": sorted({e for c in chunks for e in c.encodings}),
                         "physical_type": chunks[0].physical_type, "column": chunks[0].path_in_schema}
    return {"rows": table.num_rows, "batches": (half + 999) // 1000 + (n - half + 999) // 1000, "bytes": 0,
            "path": os.path.join(out, "tokenized"), "tokens": sum(len(x) for x in enc["input_ids"]),
            "tokenizer": type(tok).__name__, "parquet": parquet}


def arrow_cases():
    """Arrow streams as `datasets` writes them (its ArrowWriter: a RecordBatchStreamWriter, batches of 1000 rows,
    its features in the schema's metadata) in a save_to_disk folder, and pyarrow's other forms: LZ4 and zstd
    bodies, the file format, Feather v2, string views, large strings, dictionary deltas."""
    hf_meta = {b"huggingface": json.dumps({"info": {"features": {"text": {"dtype": "string", "_type": "Value"}}}}).encode()}
    fineweb = fineweb_table()
    # Views built 1000 rows at a time: a slice of one big view array would carry all of its data buffers into
    # every batch (63 x 11 MB).
    views = fineweb.set_column(0, "text", pa.chunked_array([pa.array(texts[i:i + 1000], type=pa.string_view())
                                                            for i in range(0, n, 1000)]))
    lz4 = pa.ipc.IpcWriteOptions(compression="lz4")
    zstd = pa.ipc.IpcWriteOptions(compression="zstd")
    cases = {
        "plain": ("stream", fineweb, None, 1000),
        "lz4": ("stream", fineweb, lz4, 1000),
        "zstd-file": ("file", fineweb, zstd, 700),
        "feather": ("feather", fineweb, None, 1500),
        "string-view": ("stream", views, None, 1000),
        "large-string-zstd": ("stream", fineweb_table(pa.large_string()), zstd, 1000),
        "dictionary-deltas": ("stream", dictionary_batches(900),
                              pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True, compression="lz4"), None),
    }
    report = {}
    for name, (form, table, options, chunk) in cases.items():
        path = os.path.join(out, f"{name}.feather" if form == "feather" else f"{name}.arrow")
        if form == "feather":  # Feather v2: the file format, LZ4 by default
            feather.write_feather(table, path, chunksize=chunk)
            back = feather.read_table(path)
        else:
            schema = table[0].schema if isinstance(table, list) else table.schema
            opener = pa.ipc.new_file if form == "file" else pa.ipc.new_stream
            with opener(path, schema, options=options) as w:
                if isinstance(table, list):
                    for b in table:
                        w.write_batch(b)
                else:
                    w.write_table(table, max_chunksize=chunk)
            reader = pa.ipc.open_file(path) if form == "file" else pa.ipc.open_stream(path)
            back = reader.read_all()
            stats = {k: getattr(reader.stats, k) for k in ("num_record_batches", "num_dictionary_batches",
                                                           "num_dictionary_deltas", "num_replaced_dictionaries")}
        write_jsonl(name, back.column("text").cast(pa.string()).to_pylist())
        report[name] = {"rows": back.num_rows, "batches": len(back.to_batches()), "bytes": os.path.getsize(path),
                        "path": path, "stats": stats if form != "feather" else {}}

    # A save_to_disk folder: two stream files of the texts in halves, state.json and dataset_info.json.
    half = n // 2
    saved = save_to_disk(os.path.join(out, "saved"), [fineweb.slice(0, half), fineweb.slice(half)], hf_meta)
    back = pa.concat_tables([pa.ipc.open_stream(f).read_all() for f in saved])
    write_jsonl("saved", back.column("text").to_pylist())
    report["saved"] = {"rows": back.num_rows, "batches": len(back.to_batches()), "bytes": 0,
                       "path": os.path.join(out, "saved")}
    if tokenizer_json:
        report["tokenized"] = tokenized_case()

    with pa.ipc.new_stream(os.path.join(out, "with-null.arrow"), pa.schema([("text", pa.string())]), options=zstd) as w:
        w.write_table(pa.table({"text": pa.array(texts[:10] + [None] + texts[10:20])}))
    return report


report = parquet_cases() if mode == "parquet" else arrow_cases()
print(json.dumps({"pyarrow": pa.__version__, "cases": report}))
