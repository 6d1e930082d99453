// bench_data: tokenizer encode throughput (one thread, cold cache per run, median of 3) on the default
// corpus, and loader throughput (tokens/s delivered by next()) on a prepared dataset.
//   build-data/bin/bench_data [DATASET.h5]
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "shardtrain/data/loader.hpp"
#include "shardtrain/data/tokenizer.hpp"

using namespace shardtrain::data;
namespace fs = std::filesystem;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
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
