// Reference token ids from independent JavaScript tokenizers (fetched by scripts/fetch-data.sh),
// for tests/data/tokenizer_reference_test.cpp to compare shardtrain's tokenizers against.
//
//   node reference_ids.mjs IMPL FETCHED_DIR INPUT.json OUTPUT.json
//
// IMPL: r50k (gpt-tokenizer), cl100k (gpt-tokenizer), gpt2-encoder (gpt-3-encoder),
//       llama3 / llama2 / gpt2-hf (@lenml/tokenizers on the tokenizer.json files),
//       hf-json (@lenml/tokenizers on the tokenizer.json given as a fifth argument).
// INPUT.json is an array of strings; OUTPUT.json gets an array of id arrays, one per string.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [impl, fetched, inputPath, outputPath, jsonPath] = process.argv.slice(2);
if (!outputPath) {
  console.error("usage: node reference_ids.mjs IMPL FETCHED_DIR INPUT.json OUTPUT.json");
  process.exit(2);
}
const modules = join(fetched, "node_modules");
const load = (rel) => import(pathToFileURL(join(modules, rel)).href);

async function encoder() {
  switch (impl) {
    case "r50k":
    case "cl100k": {
      const file = impl === "r50k" ? "r50k_base" : "cl100k_base";
      const m = await load(`gpt-tokenizer/esm/encoding/${file}.js`);
      return (text) => m.encode(text, { disallowedSpecial: new Set() });
    }
    case "gpt2-encoder": {
      const require = createRequire(import.meta.url);
      const m = require(join(modules, "gpt-3-encoder", "index.js"));
      return (text) => m.encode(text);
    }
    case "llama3":
    case "llama2":
    case "gpt2-hf":
    case "hf-json": {
      const { TokenizerLoader } = await load("@lenml/tokenizers/dist/main.mjs");
      const pkg = { llama3: "tokenizer-llama3", llama2: "tokenizer-llama2" }[impl] ?? "tokenizer-gpt2";
      const dir = join(modules, "@lenml", pkg, "models");
      const json = impl === "hf-json" ? jsonPath : join(dir, "tokenizer.json");
      const tokenizer = TokenizerLoader.fromPreTrained({
        tokenizerJSON: JSON.parse(readFileSync(json, "utf8")),
        tokenizerConfig: impl === "hf-json" ? {} : JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
      });
      return (text) => tokenizer.encode(text, { add_special_tokens: false });
    }
    default:
      console.error(`reference_ids.mjs: unknown IMPL '${impl}'`);
      process.exit(2);
  }
}

const encode = await encoder();
const texts = JSON.parse(readFileSync(inputPath, "utf8"));
writeFileSync(outputPath, JSON.stringify(texts.map((t) => Array.from(encode(t)))));
