// Shared helpers for the data tests: where scripts/fetch-data.sh put the corpus and tokenizers, real
// text samples, and reference ids from the JavaScript tokenizers (tests/data/reference_ids.mjs, run by node).
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data::testing {

namespace fs = std::filesystem;

inline fs::path fetched_dir() {
  if (const char* env = std::getenv("SHARDTRAIN_FETCH_DIR")) return env;
  return fs::path(SHARDTRAIN_SOURCE_DIR) / "data" / "fetched";
}

// Fails the test (never skips) when the fetched data is missing: these tests must not pass silently.
inline bool require_fetched() {
  if (!fs::exists(fetched_dir() / "tokenizers") || !fs::exists(fetched_dir() / "corpus")) {
    ADD_FAILURE() << "fetched data missing in " << fetched_dir().string() << ": run ./scripts/fetch-data.sh first";
    return false;
  }
  return true;
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

inline std::vector<fs::path> sorted_files(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// About `bytes` of real text: State of the Union addresses and Moby Dick chapters, alternately.
inline std::vector<std::string> real_texts(size_t bytes) {
  const auto sotu = sorted_files(fetched_dir() / "corpus" / "sotu", ".txt");
  const auto moby = sorted_files(fetched_dir() / "corpus" / "moby-dick", ".txt");
  std::vector<std::string> out;
  size_t total = 0;
  for (size_t i = 0; total < bytes && (i < sotu.size() || i < moby.size()); ++i) {
    for (const auto* list : {&sotu, &moby}) {
      if (i >= list->size() || total >= bytes) continue;
      // Spread over the years: every 7th address, so old and modern English both appear.
      const auto& path = list == &sotu ? (*list)[(i * 7) % list->size()] : (*list)[i];
      out.push_back(slurp(path));
      total += out.back().size();
    }
  }
  return out;
}

// Hand-made strings for what real prose rarely has: whitespace runs, contractions, digits, emoji, scripts.
inline std::vector<std::string> edge_texts() {
  return {
      "Hello world",
      "  leading and trailing spaces   ",
      "tabs\tand\t\ttabs \t \n\n\nnewlines\r\n\r\nCRLF   \n  \n",
      "I'm sure they'll say it's what we've done, isn't it? You'd, we're, I'VE, SHE'LL, HE'D",
      "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 2021-11-22 0x1F 1e-9 ٣٤٥ ⅫⅪ",
      "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸 🤗 ❤️ ✨🚀",
      "Ünïcödé: café naïve résumé Ångström, Straße, ĳ, ﬁ ligature, e\u0301 combining",
      "中文文本，日本語のテキスト、한국어 텍스트. Русский текст. Ελληνικά. עברית. العربية.",
      "Code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment\n    return x;",
      "URLs https://example.com/path?q=1&r=2#frag and emails someone@example.org",
      "Punctuation!!! ??? ... --- *** ((())) [[]] {{}} <<>> \"quotes\" 'single' `back`",
      "                                                                                 x",
      "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
      "a\u00a0b\u2003c\u3000d\u200be",
      "MixedCASE camelCase snake_case kebab-case SCREAMING_CASE",
      "'s 't 're 've 'm 'll 'd ''' '",
  };
}

// The message of the DataError f throws, or "no DataError".
template <typename F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "no DataError";
}

inline fs::path tmp_path(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("shardtrain-data-tests-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// Real prose in sentences and lines of every length, repeated ones (so dictionaries form), the hand-made edge cases,
// nulls, empty strings, and one text longer than a page.
inline std::vector<std::optional<std::string>> texts_with_nulls() {
  std::vector<std::optional<std::string>> out;
  size_t k = 0;
  for (const auto& doc : real_texts(400'000)) {
    for (size_t begin = 0, end; begin < doc.size(); begin = end) {  // sentences and lines, with their ends
      end = std::min(doc.find('\n', begin), doc.find(". ", begin));
      end = end == std::string::npos ? doc.size() : end + 1;
      out.emplace_back(doc.substr(begin, end - begin));
      if (++k % 37 == 0) out.emplace_back(std::nullopt);
      if (k % 41 == 0) out.emplace_back("");
      if (k % 29 == 0) out.emplace_back("Applause.");
    }
  }
  for (const auto& e : edge_texts()) out.emplace_back(e);
  std::string long_text;
  for (const auto& doc : real_texts(300'000)) long_text += doc;
  out.emplace_back(long_text);
  out.emplace_back(std::string("a NUL \x00 inside", 15));
  return out;
}

// Runs a file writer of tests/data (write_parquet.mjs, write_arrow.mjs) on `data` (the spec's "texts", and
// "ids" for write_arrow's token columns) for each file spec, a JSON object whose "path" is filled in as
// tmp_path(name + extension); the paths written, in order, or none after a failure the test reports.
inline std::vector<std::string> write_with_node(const std::string& script_name, const std::string& extension,
                                                nlohmann::json data, std::vector<nlohmann::json> files) {
  std::vector<std::string> paths;
  for (auto& f : files) {
    f["path"] = tmp_path(f["name"].get<std::string>() + extension).string();
    paths.push_back(f["path"]);
  }
  data["files"] = files;
  const auto spec_path = tmp_path(script_name + "-spec.json");
  std::ofstream(spec_path, std::ios::binary) << data.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  const auto script = fs::path(SHARDTRAIN_SOURCE_DIR) / "tests" / "data" / script_name;
  const std::string cmd = "node '" + script.string() + "' '" + fetched_dir().string() + "' '" + spec_path.string() + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << script_name << " failed (rc " << rc << "): " << cmd;
    return {};
  }
  return paths;
}

// The same with texts (nullopt: a null).
inline std::vector<std::string> write_with_node(const std::string& script_name, const std::string& extension,
                                                const std::vector<std::optional<std::string>>& texts,
                                                std::vector<nlohmann::json> files) {
  nlohmann::json data;
  data["texts"] = nlohmann::json::array();
  for (const auto& t : texts) data["texts"].push_back(t ? nlohmann::json(*t) : nlohmann::json(nullptr));
  return write_with_node(script_name, extension, std::move(data), std::move(files));
}

// Writes tokens in documents of the given offsets as tmp_path(name), with a synthetic tokenizer record
// (BOT 2, EOT 1, PAD 3) of the given hash and vocabulary, and opens it.
inline std::shared_ptr<TokenDataset> open_synthetic(const std::string& name, const std::vector<TokenId>& tokens,
                                                    const std::vector<int64_t>& offsets, int64_t vocab_size,
                                                    const std::string& tokenizer_hash = "none") {
  DatasetInfo info;
  info.tokenizer_name = "synthetic";
  info.tokenizer_hash = tokenizer_hash;
  info.vocab_size = vocab_size;
  info.eot_id = 1;
  info.bot_id = 2;
  info.pad_id = 3;
  const auto path = tmp_path(name).string();
  write_dataset(path, tokens, offsets, info);
  return std::make_shared<TokenDataset>(TokenDataset::open(path));
}

// Reference ids for each text from the JavaScript implementation `impl` (see reference_ids.mjs).
inline std::vector<std::vector<TokenId>> reference_ids(const std::string& impl, const std::vector<std::string>& texts,
                                                       const std::string& tokenizer_json = "") {
  const auto in = tmp_path(impl + "-in.json"), out = tmp_path(impl + "-out.json");
  {
    std::ofstream f(in, std::ios::binary);
    f << nlohmann::json(texts).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  }
  const std::string script = (fs::path(SHARDTRAIN_SOURCE_DIR) / "tests" / "data" / "reference_ids.mjs").string();
  const std::string cmd = "node '" + script + "' " + impl + " '" + fetched_dir().string() + "' '" + in.string() + "' '" +
                          out.string() + "'" + (tokenizer_json.empty() ? "" : " '" + tokenizer_json + "'");
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "reference tokenizer failed (rc " << rc << "): " << cmd;
    return {};
  }
  return nlohmann::json::parse(slurp(out)).get<std::vector<std::vector<TokenId>>>();
}

}  // namespace shardtrain::data::testing
