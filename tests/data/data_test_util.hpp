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
#include <random>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/prepare.hpp"
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

// Runs f in a child process whose user may run at most `max_threads` threads in all (RLIMIT_NPROC; root, whose
// limit the kernel does not apply, first becomes the user nobody), so that starting threads fails as it does past
// a system's limits. Returns the message of the UsageError f throws there, "no UsageError", another exception's
// "other: MESSAGE", or how the child ended otherwise ("signal 6": std::terminate's abort).
template <typename F>
std::string usage_error_under_thread_limit(rlim_t max_threads, F&& f) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    const rlimit limit{max_threads, max_threads};
    if (::setrlimit(RLIMIT_NPROC, &limit) != 0) ::_exit(4);
    std::string msg = "no UsageError";
    try {
      f();
    } catch (const UsageError& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("other: ") + e.what();
    }
    if (::write(fds[1], msg.data(), msg.size()) < 0) ::_exit(5);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) != 0) return "child exit " + std::to_string(WEXITSTATUS(status));
  return out;
}

// This test process's scratch folder, removed when it exits (by the process that made it, not a forked child).
struct TmpFolder {
  pid_t owner = ::getpid();
  fs::path dir = fs::temp_directory_path() / ("shardtrain-data-tests-" + std::to_string(owner));
  ~TmpFolder() {
    std::error_code ec;
    if (::getpid() == owner) fs::remove_all(dir, ec);
  }
};
inline TmpFolder g_tmp_folder;

inline fs::path tmp_path(const std::string& name) {
  fs::create_directories(g_tmp_folder.dir);
  return g_tmp_folder.dir / name;
}

// tmp_path(name) as an empty folder, made anew.
inline fs::path fresh_tmp_dir(const std::string& name) {
  const fs::path dir = tmp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
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

// A text column of a Parquet or Arrow file (File: ParquetFile or ArrowIpcFile), row by row (nullopt: a null).
template <typename File, typename Stats>
std::vector<std::optional<std::string>> read_text_column(const std::string& path, const std::string& column, Stats* stats) {
  const auto file = File::open(path);
  std::vector<std::optional<std::string>> out;
  file.for_each_string(
      file.string_column(column),
      [&](std::optional<std::string_view> v) { out.push_back(v ? std::optional<std::string>(*v) : std::nullopt); }, stats);
  return out;
}

// prepare-data with GPT-2's r50k_base of `inputs` into tmp_path(name), quietly: the summary and the dataset.
inline std::pair<PrepareSummary, TokenDataset> prepare_r50k(const std::vector<std::string>& inputs, const std::string& name,
                                                            size_t batch_bytes, double validation_fraction = 0.05,
                                                            const std::string& token_field = "") {
  PrepareOptions o;
  o.tokenizer = (fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string();
  o.inputs = inputs;
  o.output = tmp_path(name).string();
  o.existing = ExistingOutput::Replace;  // tests prepare one name again with other inputs
  o.validation_fraction = validation_fraction;
  o.documents.token_field = token_field;
  o.batch_bytes = batch_bytes;
  o.progress = ProgressStyle::Off;
  auto summary = prepare_dataset(o);
  return {summary, TokenDataset::open(o.output)};
}

// The two datasets hold the same documents, token for token, and the same validation split.
inline void expect_same_documents(const TokenDataset& a, const TokenDataset& b) {
  ASSERT_EQ(a.num_documents(), b.num_documents());
  for (size_t d = 0; d < a.num_documents(); ++d) {
    const auto x = a.document(d), y = b.document(d);
    ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end())) << "document " << d;
  }
  const auto va = a.split_documents(DatasetSplit::Validation), vb = b.split_documents(DatasetSplit::Validation);
  EXPECT_TRUE(std::equal(va.begin(), va.end(), vb.begin(), vb.end()));
}

// Reading damaged copies of a good file: `read(path)` on `bytes` written as `path` gives "" when it reads to the
// end, or the DataError's message (anything else escapes and fails the test).
template <typename Read>
std::string read_error(const std::string& path, const std::string& bytes, Read&& read) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    read(path);
    return "";
  } catch (const DataError& e) {
    return e.what();
  }
}

// 1500 copies of the file `source` with 1 to 4 bytes changed, each at where(rng, size, trial), read as `path`:
// every error names the file. Prints and returns how many ended in a DataError.
template <typename Read, typename Where>
size_t mutations_refused(const std::string& source, const std::string& path, uint64_t seed, Read&& read, Where&& where) {
  const std::string good = slurp(source);
  std::mt19937_64 rng(seed);
  size_t errors = 0, reads = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = where(rng, bad.size(), trial);
      bad[at] = static_cast<char>(rng() % 256);
    }
    const auto err = read_error(path, bad, read);
    if (err.empty()) {
      ++reads;
    } else {
      ++errors;
      EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << err;
    }
  }
  std::printf("%s: 1500 mutations: %zu DataErrors, %zu reads to the end\n", source.c_str(), errors, reads);
  return errors;
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
