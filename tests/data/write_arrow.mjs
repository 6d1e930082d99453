// Writes Arrow IPC files with two independent writers, for tests/data/arrow_test.cpp to read back: the Arrow
// JavaScript library (streams and files, every string layout it builds) and arrow-rs (the Rust Arrow
// implementation, through parquet-wasm, which writes the stream it is handed back out as its own). Both are
// fetched by scripts/fetch-data.sh.
//
//   node write_arrow.mjs FETCHED_DIR SPEC.json
//
// SPEC.json: {"texts": [string or null, ...], "ids": [[integer, ...] or null, ...], "files": [{"path": ...,
//   "writer": "arrow-js" | "arrow-rs", "format": "stream" | "file",
//   "type": "Utf8" | "LargeUtf8" | "Utf8View" | "Binary" | "Dictionary"
//         | "List<Int32>" | "List<UInt16>" | "LargeList<Int64>" | "FixedSizeList<Int32>",
//   "columns": "text" | "fineweb" | "nested" | "tokens", "batch_rows": N}, ...]}
// columns: "text" is the one column; "fineweb" puts fineweb's other columns around it (id, url, a double, an
// int64), and a boolean and a list of strings before it, whose buffers a reader must step over; "nested" puts the text in a nullable struct, as "meta.text" (a null
// text is a null struct or a null inside one, in turn).
// "tokens" writes "ids" (instead of "texts") as a tokenized dataset does: input_ids in the list type given, and
// an attention_mask of Int8 ones. batch_rows cuts the rows into record batches of that many (the last one
// shorter).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";

const [fetched, specPath] = process.argv.slice(2);
if (!specPath) {
  console.error("usage: node write_arrow.mjs FETCHED_DIR SPEC.json");
  process.exit(2);
}
const modules = join(fetched, "node_modules");
const require = createRequire(join(modules, "package.json"));
const arrow = require(join(modules, "apache-arrow", "Arrow.node.js"));
const pw = require(join(modules, "parquet-wasm", "node", "parquet_wasm.js"));

const spec = JSON.parse(readFileSync(specPath, "utf8"));
const encoder = new TextEncoder();

function idsType(name) {
  const item = (t) => new arrow.Field("item", t, true);
  switch (name) {
    case "List<Int32>": return new arrow.List(item(new arrow.Int32()));
    case "List<UInt16>": return new arrow.List(item(new arrow.Uint16()));
    case "LargeList<Int64>": return new arrow.LargeList(item(new arrow.Int64()));
    case "FixedSizeList<Int32>": return new arrow.FixedSizeList(spec.ids.find((r) => r !== null).length, item(new arrow.Int32()));
    default: throw new Error(`unknown ids type ${name}`);
  }
}

function textType(name) {
  switch (name ?? "Utf8") {
    case "Utf8": return new arrow.Utf8();
    case "LargeUtf8": return new arrow.LargeUtf8();
    case "Utf8View": return new arrow.Utf8View();
    case "Binary": return new arrow.Binary();
    case "Dictionary": return new arrow.Dictionary(new arrow.Utf8(), new arrow.Int32());
    default: throw new Error(`unknown type ${name}`);
  }
}

// One record batch of rows [begin, end).
function batchTable(f, begin, end) {
  if (f.columns === "tokens") {
    const rows = spec.ids.slice(begin, end);
    const wide = f.type === "LargeList<Int64>";
    const values = rows.map((r) => (r === null ? null : wide ? r.map((x) => BigInt(x)) : r));
    const mask = rows.map((r) => (r === null ? null : r.map(() => 1)));
    return new arrow.Table({
      input_ids: arrow.vectorFromArray(values, idsType(f.type)),
      attention_mask: arrow.vectorFromArray(mask, new arrow.List(new arrow.Field("item", new arrow.Int8(), true))),
    });
  }
  const texts = spec.texts.slice(begin, end);
  const type = textType(f.type);
  const values = f.type === "Binary" ? texts.map((t) => (t === null ? null : encoder.encode(t))) : texts;
  const text = arrow.vectorFromArray(values, type);
  const rows = [...Array(end - begin).keys()].map((i) => i + begin);
  const utf8 = (v) => arrow.vectorFromArray(v, new arrow.Utf8());
  switch (f.columns ?? "text") {
    case "nested": {
      const struct = new arrow.Struct([new arrow.Field("lang", new arrow.Utf8(), true), new arrow.Field("text", type, true)]);
      // Half the null texts as a null struct, half as a null inside one.
      let nulls = 0;
      const rowsOf = texts.map((t) => (t === null && nulls++ % 2 === 0 ? null : { lang: "en", text: t }));
      const meta = arrow.vectorFromArray(rowsOf, struct);
      return new arrow.Table({ id: utf8(rows.map((i) => `doc-${i}`)), meta });
    }
    case "fineweb":
      return new arrow.Table({
        id: utf8(rows.map((i) => `<urn:uuid:${String(i).padStart(8, "0")}>`)),
        kept: arrow.vectorFromArray(rows.map((i) => i % 3 !== 0), new arrow.Bool()),
        tags: arrow.vectorFromArray(rows.map((i) => (i % 4 === 0 ? null : ["a", `t${i}`])),
                                    new arrow.List(new arrow.Field("item", new arrow.Utf8(), true))),
        text,
        url: utf8(rows.map((i) => `https://example.org/page/${i}`)),
        language_score: arrow.vectorFromArray(rows.map((i) => 0.5 + (i % 7) / 16), new arrow.Float64()),
        token_count: arrow.vectorFromArray(rows.map((i) => BigInt(i * 3)), new arrow.Int64()),
      });
    default:
      return new arrow.Table({ text });
  }
}

function table(f) {
  const n = (f.columns === "tokens" ? spec.ids : spec.texts).length;
  const step = f.batch_rows ?? n;
  let t = null;
  for (let begin = 0; begin < n; begin += step) {
    const part = batchTable(f, begin, Math.min(n, begin + step));
    t = t === null ? part : t.concat(part);
  }
  return t;
}

for (const f of spec.files) {
  const format = f.format ?? "stream";
  let bytes = arrow.tableToIPC(table(f), format);
  if ((f.writer ?? "arrow-js") === "arrow-rs") {
    if (format !== "stream") throw new Error("parquet-wasm writes Arrow streams only");
    bytes = pw.Table.fromIPCStream(bytes).intoIPCStream();
  }
  writeFileSync(f.path, bytes);
}
