// bench_data: tokenizer encode throughput (one thread, cold cache per run, median of 3) on the default
// corpus, and loader throughput (tokens/s delivered by next()) on a prepared dataset.
//   build-data/bin/bench_data [DATASET.h5]
// With --write-synthetic N VOCAB OUT.h5 it writes a dataset of N random tokens (documents of 1-3000);
// with --open DATASET.h5 it times TokenDataset::open and a loader's first 100 micro-batches, and prints the
// process's anonymous and file-backed resident memory after each (docs/performance.md, dataset files);
// with --mixture SEQ PATH:WEIGHT... it times a data mixture (mixture_bench below);
// with --parquet FILE [COLUMN] it times reading a Parquet file's text column (parquet_bench below);
// with --documents INPUT... it times reading the inputs' documents (any format), JSONL lines parsed, and
// with --raw-documents INPUT... the reading prepare-data does on its one reading thread (JSONL lines not parsed).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "shardtrain/data/documents.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/data/parquet.hpp"
#include "shardtrain/data/tokenizer.hpp"

using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "RssAnon" / "RssFile" of /proc/self/status, in MiB.
double rss_mib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field) + 1)) / 1024.0;
  }
  return -1;
}

int write_synthetic(size_t n, int64_t vocab, const std::string& out) {
  std::mt19937_64 rng(42);
  std::vector<TokenId> tokens;
  tokens.reserve(n);
  std::vector<int64_t> offsets{0};
  while (tokens.size() < n) {
    const size_t len = std::min<size_t>(1 + rng() % 3000, n - tokens.size());
    for (size_t i = 0; i < len; ++i) tokens.push_back(static_cast<TokenId>(rng() % static_cast<uint64_t>(vocab - 1)));
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  DatasetInfo info;
  info.tokenizer_name = "synthetic";
  info.tokenizer_hash = "synthetic";
  info.vocab_size = vocab;
  info.eot_id = static_cast<TokenId>(vocab - 1);
  info.validation_fraction = 0.001;
  const auto t0 = std::chrono::steady_clock::now();
  write_dataset(out, tokens, offsets, info);
  fmt::print("wrote {}: {} tokens, {} documents in {:.2f} s\n", out, n, offsets.size() - 1, seconds_since(t0));
  return 0;
}

int open_bench(const std::string& path) {
  fmt::print("before open: anon {:.1f} MiB, file {:.1f} MiB\n", rss_mib("RssAnon:"), rss_mib("RssFile:"));
  auto t0 = std::chrono::steady_clock::now();
  auto ds = std::make_shared<TokenDataset>(TokenDataset::open(path));
  fmt::print("open: {:.3f} s, {} tokens, mapped {}; anon {:.1f} MiB, file {:.1f} MiB\n", seconds_since(t0), ds->num_tokens(),
             ds->mapped(), rss_mib("RssAnon:"), rss_mib("RssFile:"));
  LoaderOptions o;
  o.seq_len = 1024;
  o.micro_batch_size = 8;
  o.global_batch_size = 8;
  o.seed = 1;
  t0 = std::chrono::steady_clock::now();
  {
    Loader loader(ds, o);
    for (int i = 0; i < 100; ++i) loader.recycle(loader.next());
  }
  fmt::print("first 100 micro-batches (8 x 1024, shuffled): {:.3f} s; anon {:.1f} MiB, file {:.1f} MiB\n", seconds_since(t0),
             rss_mib("RssAnon:"), rss_mib("RssFile:"));
  return 0;
}

// Builds a MixedSource over the given "PATH:WEIGHT" entries at `seq` (packed, shuffled) and reports its
// construction time and memory, the time per locate() (median of 3 runs over 10M indices) and a loader's
// first 200 micro-batches of 8 x seq (docs/performance.md, data mixtures).
int mixture_bench(int seq, const std::vector<std::string>& entries) {
  std::vector<MixtureComponent> sources;
  for (const auto& e : entries) {
    const MixtureEntry m = parse_mixture_entry(e, "--mixture");
    sources.push_back({std::make_shared<TokenDataset>(TokenDataset::open(m.path)), m.weight});
  }
  const double anon0 = rss_mib("RssAnon:");
  auto t0 = std::chrono::steady_clock::now();
  MixedSource mix(sources, DatasetSplit::Train, BatchLayout::Packed, seq, 1, true);
  fmt::print("mixture of {} at seq {}: {} samples per epoch, built in {:.3f} s, +{:.1f} MiB anon\n", sources.size(), seq,
             mix.num_samples(), seconds_since(t0), rss_mib("RssAnon:") - anon0);
  for (size_t k = 0; k < mix.size(); ++k)
    fmt::print("  source {} {}: weight {:.3g}, {} of its {} samples per epoch\n", k, mix.dataset(k).path(), mix.weight(k),
               mix.samples_per_epoch(k), mix.source_samples(k));
  std::vector<double> ns;
  uint64_t sink = 0;
  for (int run = 0; run < 3; ++run) {
    std::mt19937_64 rng(run);
    const size_t n = 10'000'000;
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) sink += mix.locate(3, rng() % mix.num_samples()).sample;
    ns.push_back(seconds_since(t0) * 1e9 / static_cast<double>(n));
  }
  std::sort(ns.begin(), ns.end());
  fmt::print("locate: {:.1f} ns per sample (median of 3 x 10M random indices, checksum {})\n", ns[1], sink % 1000);
  LoaderOptions o;
  o.seq_len = seq;
  o.micro_batch_size = 8;
  o.global_batch_size = 8;
  o.seed = 1;
  for (const bool mixed : {false, true}) {
    t0 = std::chrono::steady_clock::now();
    {
      Loader loader(mixed ? sources : std::vector<MixtureComponent>{sources.front()}, o);
      for (int i = 0; i < 200; ++i) loader.recycle(loader.next());
    }
    fmt::print("{}: first 200 micro-batches (8 x {}) in {:.3f} s\n", mixed ? "mixture" : "first source alone", seq,
               seconds_since(t0));
  }
  return 0;
}

// Reads the column whole (what prepare-data's reading costs before tokenizing), median of 3 after one
// warm-up, with the page cache warm: MB/s of text and of file.
int parquet_bench(const std::string& path, const std::string& column) {
  std::vector<double> seconds;
  uint64_t text = 0, rows = 0;
  ParquetReadStats stats;
  for (int run = 0; run < 4; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto file = ParquetFile::open(path);
    text = rows = 0;
    stats = {};
    file.for_each_string(
        file.string_column(column),
        [&](std::optional<std::string_view> v) {
          rows += 1;
          text += v ? v->size() : 0;
        },
        &stats);
    if (run > 0) seconds.push_back(seconds_since(t0));
  }
  std::sort(seconds.begin(), seconds.end());
  const double s = seconds[1];
  const double file_mb = static_cast<double>(fs::file_size(path)) / 1e6;
  fmt::print(
      "{}: {} rows, {:.1f} MB of text in a {:.1f} MB file: {:.3f} s (median of 3), {:.0f} MB/s of text, "
      "{:.0f} MB/s of file\n",
      path, rows, static_cast<double>(text) / 1e6, file_mb, s, static_cast<double>(text) / 1e6 / s, file_mb / s);
  for (const auto& [kind, count] : stats.pages) fmt::print("  {} x{}\n", kind, count);
  return 0;
}

// for_each_document over the inputs, on one thread, median of 3 after one warm-up: the serial part of
// prepare-data, which tokenizing on all cores does not hide.
int documents_bench(const std::vector<std::string>& inputs, bool raw) {
  const auto files = expand_inputs(inputs);
  std::vector<double> seconds;
  uint64_t text = 0, docs = 0;
  for (int run = 0; run < 4; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    text = docs = 0;
    for (const auto& f : files) {
      if (raw) for_each_raw_document(f, {}, [&](RawDocument&& d) { text += d.bytes.size(), ++docs; });
      else for_each_document(f, {}, [&](std::string&& d) { text += d.size(), ++docs; });
    }
    if (run > 0) seconds.push_back(seconds_since(t0));
  }
  std::sort(seconds.begin(), seconds.end());
  uint64_t file_bytes = 0;
  for (const auto& f : files) file_bytes += fs::file_size(f);
  fmt::print("{} files, {} documents, {:.1f} MB of {} in {:.1f} MB of files: {:.3f} s (median of 3), {:.0f} MB/s\n",
             files.size(), docs, static_cast<double>(text) / 1e6, raw ? "documents as read" : "text",
             static_cast<double>(file_bytes) / 1e6, seconds[1], static_cast<double>(text) / 1e6 / seconds[1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--write-synthetic")
    return write_synthetic(std::stoull(argv[2]), std::stoll(argv[3]), argv[4]);
  if (argc == 3 && std::string(argv[1]) == "--open") return open_bench(argv[2]);
  if (argc >= 3 && (std::string(argv[1]) == "--documents" || std::string(argv[1]) == "--raw-documents"))
    return documents_bench(std::vector<std::string>(argv + 2, argv + argc), std::string(argv[1]) == "--raw-documents");
  if ((argc == 3 || argc == 4) && std::string(argv[1]) == "--parquet")
    return parquet_bench(argv[2], argc == 4 ? argv[3] : "text");
  if (argc >= 4 && std::string(argv[1]) == "--mixture")
    return mixture_bench(std::stoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  const fs::path fetched = fs::path(SHARDTRAIN_SOURCE_DIR) / "data" / "fetched";
  std::vector<std::string> docs;
  size_t bytes = 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fetched / "corpus" / "sotu")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    docs.push_back(ss.str());
    bytes += docs.back().size();
  }
  fmt::print("| tokenizer | corpus MB | tokens | encode MB/s (1 thread) | decode MB/s |\n|---|---|---|---|---|\n");
  for (const char* rel : {"r50k_base.tiktoken", "cl100k_base.tiktoken", "llama3/tokenizer.json"}) {
    const Tokenizer tok = Tokenizer::load((fetched / "tokenizers" / rel).string());
    std::vector<double> enc_s, dec_s;
    size_t tokens = 0;
    for (int run = 0; run < 3; ++run) {
      Encoder enc(tok);
      std::vector<std::vector<TokenId>> ids;
      auto t0 = std::chrono::steady_clock::now();
      for (const auto& d : docs) ids.push_back(enc.encode(d));
      enc_s.push_back(seconds_since(t0));
      tokens = 0;
      t0 = std::chrono::steady_clock::now();
      size_t out = 0;
      for (const auto& v : ids) out += tok.decode(v).size(), tokens += v.size();
      dec_s.push_back(seconds_since(t0));
      if (out != bytes) return 1;
    }
    std::sort(enc_s.begin(), enc_s.end());
    std::sort(dec_s.begin(), dec_s.end());
    fmt::print("| {} | {:.1f} | {} | {:.1f} | {:.0f} |\n", tok.name(), bytes / 1e6, tokens, bytes / 1e6 / enc_s[1],
               bytes / 1e6 / dec_s[1]);
  }
  if (argc > 1) {
    auto ds = std::make_shared<TokenDataset>(TokenDataset::open(argv[1]));
    fmt::print("\n| layout | seq_len | micro-batch | tokens/s delivered | waits |\n|---|---|---|---|---|\n");
    for (auto layout : {BatchLayout::Packed, BatchLayout::Padded}) {
      LoaderOptions o;
      o.layout = layout;
      o.seq_len = 1024;
      o.micro_batch_size = 8;
      o.global_batch_size = 8;
      o.seed = 1;
      Loader loader(ds, o);
      const size_t n = 2000;
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < n; ++i) loader.recycle(loader.next());
      const double s = seconds_since(t0);
      fmt::print("| {} | {} | {} | {:.3g} | {} |\n", batch_layout_name(layout), o.seq_len, o.micro_batch_size,
                 n * o.seq_len * o.micro_batch_size / s, loader.waits());
    }
  }
  return 0;
}
