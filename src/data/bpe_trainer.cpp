// Byte-level BPE training: count pre-tokenized words on all cores, then merge the most frequent adjacent
// pair repeatedly, updating pair counts incrementally (only the words that contain the merged pair are
// touched; a lazy max-heap finds the next pair). Ties go to the smaller (left, right) id pair, so the
// result is deterministic.
#include "shardtrain/data/bpe_trainer.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "thread_pool.hpp"
#include "tokenizer_model.hpp"

namespace shardtrain::data {
namespace {

using WordCounts = std::unordered_map<std::string, uint64_t>;

void count_words(const detail::Regex& re, std::string_view text, WordCounts& counts, pcre2_match_data* md) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap = 0, pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(re.code(), subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {
      pos = ov[0] + 1;
      continue;
    }
    if (ov[0] > gap) ++counts[std::string(text.substr(gap, ov[0] - gap))];
    ++counts[std::string(text.substr(ov[0], ov[1] - ov[0]))];
    gap = pos = ov[1];
  }
  if (gap < text.size()) ++counts[std::string(text.substr(gap))];
}

struct Trainer {
  std::vector<std::vector<TokenId>> words;
  std::vector<uint64_t> freq;
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  struct Entry {
    int64_t count;
    uint64_t key;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : key > o.key; }
  };
  std::priority_queue<Entry> heap;

  void add_pairs(uint32_t w, int64_t sign, std::vector<uint64_t>* touched) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = detail::pair_key(s[i], s[i + 1]);
      pair_counts[k] += sign * static_cast<int64_t>(freq[w]);
      if (sign > 0) where[k].push_back(w);
      if (touched) touched->push_back(k);
    }
  }
};

}  // namespace

BpeTrainResult train_bpe(const std::vector<std::string>& files, const BpeTrainOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n_special = options.special_tokens.size();
  if (options.vocab_size < 256 + n_special)
    throw UsageError(fmt::format("--vocab-size {} is too small: it must hold the 256 bytes and {} special tokens",
                                 options.vocab_size, n_special));
  if (files.empty()) throw UsageError("tokenizer train: no input files");
  // Refused here as the loader refuses them: an empty special token matches everywhere without advancing (encode
  // --special never ended), and a second one of the same text gets an id that no text produces.
  for (size_t i = 0; i < n_special; ++i) {
    if (options.special_tokens[i].empty())
      throw UsageError(fmt::format("--special: special token {} is empty (a special token needs text)", i));
    for (size_t k = 0; k < i; ++k)
      if (options.special_tokens[k] == options.special_tokens[i])
        throw UsageError(
            fmt::format("--special: '{}' is given twice (special tokens {} and {})", options.special_tokens[i], k, i));
  }
  // tokenizer.json's vocab keys a byte's token by its byte-level spelling and a special token by its text: a special
  // token spelled as a byte ("!") would be one key for two ids, and the file contradict itself.
  const std::set<std::string> special_texts(options.special_tokens.begin(), options.special_tokens.end());
  for (int b = 0; b < 256; ++b)
    if (const std::string spelled = detail::map_byte_level(std::string(1, static_cast<char>(b)));
        special_texts.contains(spelled))
      throw UsageError(fmt::format(
          "--special '{}': is also the vocabulary's spelling of byte {} (tokenizer.json's vocab would hold it twice, "
          "with two ids); give a special token text that no single byte spells, e.g. <|{}|>",
          spelled, b, spelled));
  const int threads = resolve_thread_count(options.threads);
  const std::string pattern = options.split_pattern.empty() ? std::string(llama3_split_pattern()) : options.split_pattern;
  // A pattern that does not compile is a bad command-line value (exit 2), not bad data.
  const detail::Regex regex = [&] {
    try {
      return detail::Regex(pattern, "--pattern");
    } catch (const DataError& e) {
      throw UsageError(e.what());
    }
  }();
  // A pattern that can match nothing splits where Hugging Face's Split does not (it cuts at every empty match):
  // its tokenizer.json would give other ids there than here.
  if (uint32_t min_length = 1; pcre2_pattern_info(regex.code(), PCRE2_INFO_MINLENGTH, &min_length) == 0 && min_length == 0)
    throw UsageError(
        fmt::format("--pattern '{}': can match the empty string; a split pattern's matches must each take "
                    "at least one character (e.g. 'x+' for 'x*')",
                    pattern));

  // 1. Word counts, one map per thread over a shared file cursor.
  std::vector<WordCounts> partial(static_cast<size_t>(threads));
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  {
    ProgressBar bar({.label = "count words", .total = files.size(), .unit = "files", .style = options.progress});
    run_on_threads(static_cast<size_t>(threads), [&](size_t t) {
      try {
        // Freed however the thread ends (a bad input file throws out of the loop).
        const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
            pcre2_match_data_create_from_pattern(regex.code(), nullptr), pcre2_match_data_free);
        for (size_t i; (i = next.fetch_add(1)) < files.size();) {
          for_each_document(files[i], options.documents, [&](std::string&& doc) {  // streamed: files of any size
            count_words(regex, doc, partial[t], md.get());
            bytes += doc.size();
          });
          bar.advance(1);
        }
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  WordCounts counts = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t)
    for (auto& [w, c] : partial[t]) counts[w] += c;

  // 2. Vocabulary: specials, then bytes (ids n_special + b).
  std::vector<std::string> vocab;
  for (const auto& s : options.special_tokens) vocab.push_back(s);
  std::unordered_map<std::string, TokenId> ids;
  for (int b = 0; b < 256; ++b) {
    ids[std::string(1, static_cast<char>(b))] = static_cast<TokenId>(vocab.size());
    vocab.emplace_back(1, static_cast<char>(b));
  }
  Trainer tr;
  std::vector<std::pair<std::string, uint64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());  // deterministic word order regardless of hashing and threads
  for (const auto& [w, c] : sorted) {
    std::vector<TokenId> syms;
    for (unsigned char ch : w) syms.push_back(static_cast<TokenId>(n_special + ch));
    tr.words.push_back(std::move(syms));
    tr.freq.push_back(c);
  }
  for (uint32_t w = 0; w < tr.words.size(); ++w) tr.add_pairs(w, +1, nullptr);
  for (const auto& [k, c] : tr.pair_counts) tr.heap.push({c, k});

  // 3. Merges.
  nlohmann::json merges = nlohmann::json::array();
  std::vector<uint32_t> stamp(tr.words.size(), 0);
  uint32_t merge_no = 0;
  // Pairs whose merge would spell a special token's text ("[EOT]" in the corpus, split on whitespace): a second token
  // of that text would overwrite the special one's vocab key, and text would encode to a control token's id.
  std::unordered_set<uint64_t> refused;
  size_t refused_merges = 0;
  ProgressBar bar(
      {.label = "merge", .total = options.vocab_size - vocab.size(), .unit = "merges", .style = options.progress});
  while (vocab.size() < options.vocab_size && !tr.heap.empty()) {
    const auto top = tr.heap.top();
    tr.heap.pop();
    auto pc = tr.pair_counts.find(top.key);
    if (pc == tr.pair_counts.end() || pc->second != top.count) continue;  // stale
    if (top.count < static_cast<int64_t>(std::max<uint64_t>(options.min_frequency, 1))) break;
    const auto a = static_cast<TokenId>(top.key >> 32), b = static_cast<TokenId>(top.key & 0xffffffffu);
    if (refused.contains(top.key)) continue;
    const std::string merged = vocab[a] + vocab[b];
    if (special_texts.contains(detail::map_byte_level(merged))) {
      refused.insert(top.key);
      ++refused_merges;
      continue;
    }
    TokenId c;
    if (auto it = ids.find(merged); it != ids.end()) {
      c = it->second;
    } else {
      c = static_cast<TokenId>(vocab.size());
      ids[merged] = c;
      vocab.push_back(merged);
      bar.advance(1);
    }
    merges.push_back({detail::map_byte_level(vocab[a]), detail::map_byte_level(vocab[b])});
    ++merge_no;
    std::vector<uint64_t> touched;
    auto occurrences = std::move(tr.where[top.key]);
    tr.where.erase(top.key);
    for (uint32_t w : occurrences) {
      if (stamp[w] == merge_no) continue;
      stamp[w] = merge_no;
      auto& s = tr.words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < s.size() && !has; ++i) has = s[i] == a && s[i + 1] == b;
      if (!has) continue;
      tr.add_pairs(w, -1, nullptr);
      std::vector<TokenId> out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(c);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
      tr.add_pairs(w, +1, &touched);
    }
    tr.pair_counts.erase(top.key);
    std::sort(touched.begin(), touched.end());
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    for (uint64_t k : touched) {
      const auto it = tr.pair_counts.find(k);
      if (it != tr.pair_counts.end() && it->second > 0) tr.heap.push({it->second, k});
    }
  }
  bar.finish();

  // 4. tokenizer.json
  nlohmann::json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = nlohmann::json::array();
  for (size_t i = 0; i < n_special; ++i)
    j["added_tokens"].push_back({{"id", i},
                                 {"content", options.special_tokens[i]},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  nlohmann::json v = nlohmann::json::object();
  for (size_t i = 0; i < vocab.size(); ++i) v[i < n_special ? vocab[i] : detail::map_byte_level(vocab[i])] = i;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", v},
                {"merges", merges}};
  BpeTrainResult r;
  r.tokenizer_json = json_text(j, 1);
  r.vocab_size = vocab.size();
  r.merges = merges.size();
  r.unique_words = tr.words.size();
  r.input_bytes = bytes;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (refused_merges > 0)
    log::info("tokenizer train: {} merge(s) left out: each would have made a token spelled as a special token",
              refused_merges);
  if (r.vocab_size < options.vocab_size)
    log::warn("tokenizer train: stopped at vocab size {} (< {}): no pair occurs {} or more times", r.vocab_size,
              options.vocab_size, options.min_frequency);
  return r;
}

}  // namespace shardtrain::data
