// Writes Parquet files with two independent writers, for tests/data/parquet_test.cpp to read back:
// arrow-rs (the Rust Arrow implementation, through parquet-wasm; every codec, data pages v1 and v2,
// dictionary on or off, a chosen fallback encoding) and hyparquet-writer (a JavaScript writer of its own:
// snappy, data pages v2). Both are fetched by scripts/fetch-data.sh.
//
//   node write_parquet.mjs FETCHED_DIR SPEC.json
//
// SPEC.json: {"texts": [string or null, ...], "files": [{"path": ..., "writer": "arrow-rs" | "hyparquet",
//   "compression": "SNAPPY", "version": 1 | 2, "dictionary": true, "encoding": "PLAIN",
//   "row_group_size": N, "page_bytes": N, "columns": "text" | "fineweb" | "nested" | "ids" | "ids64"}, ...]}
// columns: "text" is the one column; "fineweb" adds fineweb's other columns around it (id, url, a double
// and an int64); "nested" puts the text in an optional struct, as "meta.text"; "ids" and "ids64" are a
// tokenized dataset's: "input_ids", a List<Int32> (List<Int64>) of the spec's "ids" ([[int or null, ...] or
// null, ...]: a null row, or a null inside a list), beside the text ("ids") or alone ("ids64"); arrow-rs only.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [fetched, specPath] = process.argv.slice(2);
if (!specPath) {
  console.error("usage: node write_parquet.mjs FETCHED_DIR SPEC.json");
  process.exit(2);
}
const modules = join(fetched, "node_modules");
const require = createRequire(join(modules, "package.json"));
const arrow = require(join(modules, "apache-arrow", "Arrow.node.js"));
const pw = require(join(modules, "parquet-wasm", "node", "parquet_wasm.js"));
const { parquetWriteBuffer } = await import(pathToFileURL(join(modules, "hyparquet-writer", "src", "index.js")).href);

const spec = JSON.parse(readFileSync(specPath, "utf8"));
const texts = spec.texts;
const n = texts.length;
const ids = texts.map((_, i) => `<urn:uuid:${String(i).padStart(8, "0")}>`);
const urls = texts.map((_, i) => `https://example.org/page/${i}`);
const scores = texts.map((_, i) => 0.5 + (i % 7) / 16);
const counts = texts.map((t) => BigInt(t === null ? 0 : t.length));

function arrowTable(columns) {
  const utf8 = (values) => arrow.vectorFromArray(values, new arrow.Utf8());
  if (columns === "nested") {
    const type = new arrow.Struct([new arrow.Field("text", new arrow.Utf8(), true), new arrow.Field("lang", new arrow.Utf8(), true)]);
    const meta = arrow.vectorFromArray(texts.map((t) => ({ text: t, lang: "en" })), type);
    return new arrow.Table({ id: utf8(ids), meta });
  }
  if (columns === "ids" || columns === "ids64") {
    const wide = columns === "ids64";
    const item = new arrow.Field("item", wide ? new arrow.Int64() : new arrow.Int32(), true);
    const lists = spec.ids.map((row) => (row === null ? null : row.map((v) => (v === null ? null : wide ? BigInt(v) : v))));
    const input_ids = arrow.vectorFromArray(lists, new arrow.List(item));
    return wide ? new arrow.Table({ input_ids }) : new arrow.Table({ text: utf8(texts), input_ids });
  }
  if (columns === "fineweb") {
    return new arrow.Table({
      id: utf8(ids),
      text: utf8(texts),
      url: utf8(urls),
      language_score: arrow.vectorFromArray(scores, new arrow.Float64()),
      token_count: arrow.vectorFromArray(counts, new arrow.Int64()),
    });
  }
  return new arrow.Table({ text: utf8(texts) });
}

function writeArrowRs(f) {
  const table = pw.Table.fromIPCStream(arrow.tableToIPC(arrowTable(f.columns ?? "text"), "stream"));
  let b = new pw.WriterPropertiesBuilder()
    .setCompression(pw.Compression[f.compression ?? "SNAPPY"])
    .setWriterVersion((f.version ?? 1) === 2 ? pw.WriterVersion.V2 : pw.WriterVersion.V1)
    .setDictionaryEnabled(f.dictionary ?? true);
  if (f.encoding) b = b.setEncoding(pw.Encoding[f.encoding]);
  if (f.row_group_size) b = b.setMaxRowGroupSize(f.row_group_size);
  if (f.page_bytes) b = b.setDataPageSizeLimit(f.page_bytes).setDictionaryPageSizeLimit(f.page_bytes);
  return pw.writeParquet(table, b.build());
}

function writeHyparquet(f) {
  const columnData = [{ name: "text", data: texts, type: "STRING", nullable: true }];
  if ((f.columns ?? "text") === "fineweb") {
    columnData.unshift({ name: "id", data: ids, type: "STRING" });
    columnData.push({ name: "url", data: urls, type: "STRING" });
    columnData.push({ name: "language_score", data: scores, type: "DOUBLE" });
    columnData.push({ name: "token_count", data: counts, type: "INT64" });
  }
  if (f.encoding) columnData.forEach((c) => { if (c.type === "STRING") c.encoding = f.encoding; });
  return new Uint8Array(parquetWriteBuffer({
    columnData,
    codec: f.compression ?? "SNAPPY",
    rowGroupSize: f.row_group_size ?? n,
    pageSize: f.page_bytes ?? 1048576,
  }));
}

for (const f of spec.files) {
  const bytes = f.writer === "hyparquet" ? writeHyparquet(f) : writeArrowRs(f);
  writeFileSync(f.path, bytes);
}
