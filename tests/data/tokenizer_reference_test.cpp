// Tokenizer ids against independent reference implementations on ~300 KB of real text per tokenizer,
// plus hand-made edge cases, invalid UTF-8 and random bytes (round trip).
#include <fstream>
#include <functional>
#include <random>

#include <fmt/format.h>

#include "data_test_util.hpp"
#include "shardtrain/data/bpe_trainer.hpp"
#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {
namespace {

using testing::fetched_dir;

constexpr size_t kRealBytes = 300 * 1024;

struct Case {
  const char* impl;     // reference_ids.mjs implementation
  const char* relpath;  // under data/fetched/tokenizers
};

class ReferenceIds : public ::testing::TestWithParam<Case> {};

void expect_same_ids(const Tokenizer& tok, const std::vector<std::string>& texts,
                     const std::vector<std::vector<TokenId>>& ref, const std::string& what) {
  ASSERT_EQ(ref.size(), texts.size());
  Encoder enc(tok);
  size_t tokens = 0, mismatched = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = enc.encode(texts[i]);
    tokens += ids.size();
    if (ids != ref[i]) {
      ++mismatched;
      size_t k = 0;
      while (k < ids.size() && k < ref[i].size() && ids[k] == ref[i][k]) ++k;
      ADD_FAILURE() << what << " text " << i << ": first difference at token " << k << " of " << ref[i].size() << " (ours "
                    << (k < ids.size() ? std::to_string(ids[k]) : "end") << ", reference "
                    << (k < ref[i].size() ? std::to_string(ref[i][k]) : "end") << ") near '"
                    << tok.decode(std::span(ref[i]).subspan(k > 3 ? k - 3 : 0,
                                                            std::min<size_t>(8, ref[i].size() - (k > 3 ? k - 3 : 0))))
                    << "'";
      if (mismatched > 3) return;
    }
    EXPECT_EQ(tok.decode(ids), texts[i]) << what << " text " << i << " does not round-trip";
  }
  EXPECT_GT(tokens, 0u);
}

TEST_P(ReferenceIds, RealTextAndEdgeCases) {
  if (!testing::require_fetched()) return;
  const Case c = GetParam();
  const Tokenizer tok = Tokenizer::load((fetched_dir() / "tokenizers" / c.relpath).string());
  auto texts = testing::real_texts(kRealBytes);
  size_t bytes = 0;
  for (const auto& t : texts) bytes += t.size();
  ASSERT_GE(bytes, kRealBytes);
  for (auto& t : testing::edge_texts()) texts.push_back(t);
  const auto ref = testing::reference_ids(c.impl, texts);
  expect_same_ids(tok, texts, ref, c.impl);
}

// Invalid bytes never join a regex piece (multi-byte invalid runs are covered by the round trip below): valid segments encode as the reference encodes them alone,
// each invalid byte becomes its byte token, and decoding gives the original bytes back.
TEST_P(ReferenceIds, InvalidUtf8BetweenValidSegments) {
  if (!testing::require_fetched()) return;
  const Case c = GetParam();
  const Tokenizer tok = Tokenizer::load((fetched_dir() / "tokenizers" / c.relpath).string());
  const std::vector<std::string> segments = {"The quick brown fox", " jumps over", "the lazy dog's 1234 tails!", " 😀 emoji",
                                             "naïve café",          "end."};
  // Single invalid bytes: a stray lead byte, a lone continuation byte, bytes that never occur in UTF-8.
  const std::vector<std::string> invalid = {"\xff", "\x80", "\xc3", "\xf8", "\xc0"};
  const auto ref = testing::reference_ids(c.impl, segments);
  ASSERT_EQ(ref.size(), segments.size());
  if (tok.byte_fallback()) {
    // SentencePiece style: the text is one piece, so segments do not encode alone; what holds is that each
    // invalid byte is its own <0xNN> token, in place, between the ids of the valid text around it, and that
    // the first segment encodes as the reference encodes it alone (up to its last token, which may merge on).
    std::string text;
    std::vector<TokenId> bytes_in_order;
    for (size_t i = 0; i < segments.size(); ++i) {
      text += segments[i];
      if (i + 1 < segments.size()) text += invalid[i % invalid.size()];
    }
    const auto ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    std::string seen;
    for (TokenId id : ids)
      if (tok.token_bytes(id).size() == 1 && static_cast<unsigned char>(tok.token_bytes(id)[0]) >= 0x80)
        seen += tok.token_bytes(id);
    EXPECT_NE(seen.find("\xff"), std::string::npos);
    EXPECT_NE(seen.find("\x80"), std::string::npos);
    ASSERT_GE(ids.size(), ref[0].size());
    EXPECT_TRUE(std::equal(ref[0].begin(), ref[0].end() - 1, ids.begin()));
    return;
  }
  std::string text;
  std::vector<TokenId> expected;
  for (size_t i = 0; i < segments.size(); ++i) {
    text += segments[i];
    expected.insert(expected.end(), ref[i].begin(), ref[i].end());
    if (i + 1 < segments.size()) {
      const std::string& bad = invalid[i % invalid.size()];
      text += bad;
      for (unsigned char b : bad) expected.push_back(*tok.token_id(std::string(1, static_cast<char>(b))));
    }
  }
  const auto ids = tok.encode(text);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(tok.decode(ids), text);
}

TEST_P(ReferenceIds, RandomBytesRoundTrip) {
  if (!testing::require_fetched()) return;
  const Tokenizer tok = Tokenizer::load((fetched_dir() / "tokenizers" / GetParam().relpath).string());
  std::mt19937_64 rng(1234);
  Encoder enc(tok);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(rng() % 400, '\0');
    const bool ascii_heavy = trial % 3 == 0;
    for (auto& ch : s) ch = static_cast<char>(ascii_heavy ? (rng() % 4 ? ' ' + rng() % 95 : rng() % 256) : rng() % 256);
    const auto ids = enc.encode(s);
    ASSERT_EQ(tok.decode(ids), s) << "trial " << trial;
    for (TokenId id : ids) ASSERT_LT(id, tok.vocab_size());
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceIds,
                         ::testing::Values(Case{"r50k", "r50k_base.tiktoken"}, Case{"cl100k", "cl100k_base.tiktoken"},
                                           Case{"gpt2-encoder", "gpt2"}, Case{"llama3", "llama3/tokenizer.json"},
                                           Case{"gpt2-hf", "gpt2-hf/tokenizer.json"},
                                           Case{"llama2", "llama2/tokenizer.json"}),
                         [](const auto& info) {
                           std::string n = info.param.impl;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(TokenizerFiles, SpecialTokensAndMetadata) {
  if (!testing::require_fetched()) return;
  const Tokenizer gpt2 = Tokenizer::load((fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string());
  EXPECT_EQ(gpt2.vocab_size(), 50257u);
  EXPECT_EQ(gpt2.eot_id(), 50256u);
  EXPECT_EQ(gpt2.name(), "r50k_base");
  EXPECT_EQ(gpt2.hash().rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(gpt2.encode("a<|endoftext|>b", SpecialTokenMode::Recognize), (std::vector<TokenId>{64, 50256, 65}));
  EXPECT_NE(gpt2.encode("a<|endoftext|>b", SpecialTokenMode::AsText).size(), 3u);
  const Tokenizer cl = Tokenizer::load((fetched_dir() / "tokenizers" / "cl100k_base.tiktoken").string());
  EXPECT_EQ(cl.vocab_size(), 100277u);
  EXPECT_EQ(cl.eot_id(), 100257u);
  const Tokenizer llama = Tokenizer::load((fetched_dir() / "tokenizers" / "llama3" / "tokenizer.json").string());
  EXPECT_EQ(llama.vocab_size(), 128256u);
  EXPECT_EQ(llama.bot_id(), 128000u);
  EXPECT_EQ(llama.eot_id(), 128001u);
  EXPECT_EQ(llama.name(), "llama3/tokenizer.json");
  EXPECT_FALSE(llama.byte_fallback());
  // SentencePiece style (Llama 2 / Mistral layout): <s> and </s> by name, one leading space added and removed.
  const Tokenizer sp = Tokenizer::load((fetched_dir() / "tokenizers" / "llama2" / "tokenizer.json").string());
  EXPECT_TRUE(sp.byte_fallback());
  EXPECT_EQ(sp.vocab_size(), 32000u);
  EXPECT_EQ(sp.bot_id(), 1u);
  EXPECT_EQ(sp.eot_id(), 2u);
  const auto hello = sp.encode("Hello");
  ASSERT_EQ(hello.size(), 1u);
  EXPECT_EQ(sp.token_bytes(hello[0]), " Hello");  // the vocabulary's "\u2581Hello"
  EXPECT_EQ(sp.decode(hello), "Hello");
  EXPECT_EQ(sp.decode(sp.encode(" two  spaces ")), " two  spaces ");
  const auto ring = sp.encode("\xe2\x80\xa0");  // a character the vocabulary may lack: its bytes, or its token
  EXPECT_EQ(sp.decode(ring), "\xe2\x80\xa0");
}

// A SentencePiece-style vocabulary with a token across a space ("a\u2581b") must not be cut into words: the
// whole text merges, so "a b" becomes [\u2581, a\u2581b]; cut at the space it would be [\u2581a, \u2581b].
TEST(TokenizerFiles, ByteFallbackWordsOnlyWhereNoTokenSpansThem) {
  auto tokenizer_json = [](bool spanning) {
    nlohmann::json vocab = nlohmann::json::object();
    uint32_t id = 0;
    vocab["<unk>"] = id++;
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
    for (const char* t : {"\u2581", "a", "b", "\u2581a", "\u2581b"}) vocab[t] = id++;
    nlohmann::json merges = nlohmann::json::array({"\u2581 a", "\u2581 b"});
    if (spanning) {
      vocab["a\u2581"] = id++;
      vocab["a\u2581b"] = id++;
      merges = nlohmann::json::array({"a \u2581", "a\u2581 b", "\u2581 a", "\u2581 b"});
    }
    nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", merges}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           nlohmann::json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
        {"pre_tokenizer", nullptr},
        {"added_tokens", nlohmann::json::array({{{"id", 0}, {"content", "<unk>"}}})}};
    return j.dump();
  };
  const Tokenizer words = Tokenizer::from_json_text(tokenizer_json(false), "words.json");
  EXPECT_EQ(words.encode("a b"), (std::vector<TokenId>{*words.token_id(" a"), *words.token_id(" b")}));
  const Tokenizer spanning = Tokenizer::from_json_text(tokenizer_json(true), "spanning.json");
  EXPECT_EQ(spanning.encode("a b"), (std::vector<TokenId>{*spanning.token_id(" "), *spanning.token_id("a b")}));
  EXPECT_EQ(spanning.decode(spanning.encode("a b")), "a b");
  EXPECT_EQ(words.encode("\xc3\xa9"), (std::vector<TokenId>{*words.token_id(" "), 1 + 0xc3, 1 + 0xa9}));  // byte fallback
}

// The newer layout of Llama 2's tokenizer.json (tokenizers 0.14 and later, legacy = false): no normalizer, and a
// Metaspace pre_tokenizer with prepend_scheme "first". Its ids against the JavaScript reference given the same file,
// on the real texts and edge cases; the space goes in front of the text before any special token only, and not
// in front of text that starts with a space (which therefore does not round-trip: the decoder strips one).
TEST(TokenizerFiles, MetaspacePreTokenizerMatchesTheReference) {
  if (!testing::require_fetched()) return;
  std::ifstream in(fetched_dir() / "tokenizers" / "llama2" / "tokenizer.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["normalizer"] = nullptr;
  // add_prefix_space for the reference, which reads it (the Rust library reads prepend_scheme alone).
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"add_prefix_space", true},
                        {"prepend_scheme", "first"},
                        {"split", false}};
  const auto path = testing::tmp_path("llama2-metaspace.json");
  { std::ofstream(path) << j.dump(); }
  const Tokenizer tok = Tokenizer::load(path.string());
  const Tokenizer legacy = Tokenizer::load((fetched_dir() / "tokenizers" / "llama2" / "tokenizer.json").string());
  auto texts = testing::real_texts(kRealBytes / 3);
  for (auto& t : testing::edge_texts()) texts.push_back(t);
  texts.push_back(" one leading space");
  const auto ref = testing::reference_ids("hf-json", texts, path.string());
  ASSERT_EQ(ref.size(), texts.size());
  size_t mismatched = 0, differs_from_legacy = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tok.encode(texts[i]);
    if (ids != ref[i] && ++mismatched <= 3)
      ADD_FAILURE() << "text " << i << " ('" << texts[i].substr(0, 40) << "') differs from the reference";
    const bool spaced = !texts[i].empty() && texts[i].front() == ' ';
    if (!spaced) {
      EXPECT_EQ(tok.decode(ids), texts[i]) << "text " << i;
      EXPECT_EQ(ids, legacy.encode(texts[i])) << "text " << i << ": the two layouts agree on text that starts with no space";
    } else {
      ++differs_from_legacy;
      EXPECT_NE(ids, legacy.encode(texts[i])) << "text " << i << ": Metaspace adds no second space";
      EXPECT_EQ(tok.decode(ids), texts[i].substr(1)) << "text " << i;
    }
  }
  EXPECT_EQ(mismatched, 0u);
  EXPECT_GE(differs_from_legacy, 2u);  // the edge case with leading spaces and the one added here
  // Special tokens recognized: the space goes before the first segment only (the legacy layout adds it to each).
  const std::vector<std::string> with_specials = {"Hello</s>world", "</s>world", "a</s> b</s>c"};
  const auto ref_specials = testing::reference_ids("hf-json", with_specials, path.string());
  ASSERT_EQ(ref_specials.size(), with_specials.size());
  for (size_t i = 0; i < with_specials.size(); ++i)
    EXPECT_EQ(tok.encode(with_specials[i], SpecialTokenMode::Recognize), ref_specials[i]) << with_specials[i];
  const auto hw = tok.encode("Hello</s>world", SpecialTokenMode::Recognize);
  const auto legacy_hw = legacy.encode("Hello</s>world", SpecialTokenMode::Recognize);
  EXPECT_NE(hw, legacy_hw);
  EXPECT_EQ(tok.decode(hw), "Hello</s>world");
}

// Metaspace's split (the default, and always so in older files): every space starts a piece, so merges never join
// two spaces; without it the text is one piece. "a  b" is \u2581a\u2581\u2581b: with a merge of two spaces ranked
// first, one piece merges to [\u2581\u2581, ...] while the split pieces \u2581a, \u2581, \u2581b cannot.
TEST(TokenizerFiles, MetaspaceSplitStartsAPieceAtEverySpace) {
  auto tokenizer_json = [](const nlohmann::json& pre) {
    nlohmann::json vocab = nlohmann::json::object();
    uint32_t id = 0;
    vocab["<unk>"] = id++;
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
    for (const char* t : {"\u2581", "a", "b", "\u2581a", "\u2581b", "\u2581\u2581"}) vocab[t] = id++;
    nlohmann::json j = {{"model",
                         {{"type", "BPE"},
                          {"byte_fallback", true},
                          {"vocab", vocab},
                          {"merges", nlohmann::json::array({"\u2581 \u2581", "\u2581 a", "\u2581 b"})}}},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", pre},
                        {"added_tokens", nlohmann::json::array({{{"id", 0}, {"content", "<unk>"}}})}};
    return j.dump();
  };
  const nlohmann::json base = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}};
  nlohmann::json no_split = base, old_style = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", true}};
  no_split["split"] = false;
  const Tokenizer split = Tokenizer::from_json_text(tokenizer_json(base), "split.json");
  const Tokenizer whole = Tokenizer::from_json_text(tokenizer_json(no_split), "whole.json");
  const Tokenizer old = Tokenizer::from_json_text(tokenizer_json(old_style), "old.json");
  auto id = [&](const char* t) { return *split.token_id(t); };
  EXPECT_EQ(split.encode("a  b"), (std::vector<TokenId>{id(" a"), id(" "), id(" b")}));
  EXPECT_EQ(old.encode("a  b"), split.encode("a  b"));  // add_prefix_space alone: always, split
  EXPECT_EQ(whole.encode("a  b"), (std::vector<TokenId>{id(" a"), id("  "), id("b")}));
  EXPECT_EQ(split.decode(split.encode("a  b")), "a  b");
  EXPECT_EQ(whole.decode(whole.encode("a  b")), "a  b");
  nlohmann::json never = base;
  never["prepend_scheme"] = "never";
  EXPECT_EQ(Tokenizer::from_json_text(tokenizer_json(never), "never.json").encode("a b"),
            (std::vector<TokenId>{id("a"), id(" b")}));
  nlohmann::json bad = base;
  bad["prepend_scheme"] = "sometimes";
  try {
    Tokenizer::from_json_text(tokenizer_json(bad), "bad.json");
    ADD_FAILURE() << "an unknown prepend_scheme should be refused";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("prepend_scheme 'sometimes'"), std::string::npos) << e.what();
  }
}

// What prepare-data does with a large document (DocumentOptions::piece_bytes): windows that end anywhere (inside a
// word, a UTF-8 sequence, a run of spaces or newlines), each cut at its last safe place (or, with none, widened),
// the pieces encoded one after the other as continuations. `pieces` counts them.
std::vector<TokenId> encode_in_pieces(const Tokenizer& tok, std::string_view text, size_t window, std::mt19937& rng,
                                      size_t& pieces) {
  Encoder enc(tok);
  std::vector<TokenId> out;
  pieces = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.size(), pos + 1 + rng() % window), at = 0;
    while (end < text.size() && (at = tok.last_safe_cut(text.substr(pos, end - pos))) == 0)
      end = std::min(text.size(), end + window);
    if (at == 0) at = text.size() - pos;  // the rest, whole
    enc.encode_append(text.substr(pos, at), out, SpecialTokenMode::AsText,
                      pos == 0 ? TextStart::Document : TextStart::Continuation);
    pos += at;
    ++pieces;
  }
  return out;
}

// A BPE tokenizer.json trained here on the fetched corpus, once per run. A clean clone has no
// data/fetched/tokenizers/sotu-bpe4k.json (quickstart.sh trains that one), so no test may read it.
const std::string& bpe_trained_here() {
  static const std::string json = [] {
    BpeTrainOptions options;
    options.vocab_size = 1024;
    options.progress = ProgressStyle::Off;
    std::vector<std::string> files;
    for (const auto& p : testing::sorted_files(fetched_dir() / "corpus" / "sotu", ".txt"))
      if (files.size() < 20) files.push_back(p.string());
    return train_bpe(files, options).tokenizer_json;
  }();
  return json;
}

// A document tokenized in pieces cut at last_safe_cut's places gives its tokens whole, with every kind of tokenizer
// (tiktoken, GPT-2's files, byte-level and byte-fallback tokenizer.json, one trained here), on real text and the
// edge cases run together, at windows from 3 bytes up.
TEST(TokenizerFiles, PiecesCutAtSafePlacesGiveTheWholeDocumentsTokens) {
  if (!testing::require_fetched()) return;
  std::string text;
  for (const auto& t : testing::real_texts(kRealBytes / 2)) text += t;
  for (const auto& t : testing::edge_texts()) text += "word " + t + "\nAnd a.\n\nB x\n \nC \tD 's";
  for (const char* relpath : {"r50k_base.tiktoken", "cl100k_base.tiktoken", "o200k_base.tiktoken", "gpt2",
                              "gpt2-hf/tokenizer.json", "llama3/tokenizer.json", "llama2/tokenizer.json", "trained here"}) {
    const Tokenizer tok = relpath == std::string_view("trained here")
                              ? Tokenizer::from_json_text(bpe_trained_here(), relpath)
                              : Tokenizer::load((fetched_dir() / "tokenizers" / relpath).string());
    const auto whole = tok.encode(text);
    std::mt19937 rng(11);
    for (const size_t window : {3, 40, 1000, 20000}) {
      size_t pieces = 0;
      const auto got = encode_in_pieces(tok, text, window, rng, pieces);
      EXPECT_GT(pieces, text.size() / (2 * window + 200)) << relpath << ", windows of " << window;
      if (got == whole) continue;
      size_t k = 0;
      while (k < got.size() && k < whole.size() && got[k] == whole[k]) ++k;
      ADD_FAILURE() << relpath << ", windows of " << window << ": " << got.size() << " tokens against " << whole.size()
                    << ", first difference at token " << k << " near '"
                    << tok.decode(std::span(whole).subspan(k > 3 ? k - 3 : 0, std::min<size_t>(8, whole.size() - k))) << "'";
    }
  }
  // The places, exactly: before " L" and after "\nL" (L an ASCII letter) with printable ASCII before; none in a
  // run of spaces, after "\r\n", inside a word or a UTF-8 sequence.
  const Tokenizer gpt2 = Tokenizer::load((fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string());
  EXPECT_EQ(gpt2.last_safe_cut("one two"), 3u);
  EXPECT_EQ(gpt2.last_safe_cut("one.\nTwo"), 5u);
  EXPECT_EQ(gpt2.last_safe_cut("one  two\r\nthree, 4\n5 \xc3\xa9 \xc3\xa9t\xc3\xa9"), 0u);
  EXPECT_EQ(gpt2.last_safe_cut("one two three"), 7u);
}

// A split pattern whose pieces join across such a place (` ?\p{L}+ ?` keeps a space after a word: "one two" is
// "one ", "two", where " two" apart is one token) fails the probes and has no safe place. The probes ask for the
// tokens only: `\s?\p{L}+` passes with this vocabulary, which has no token of a newline and a letter.
TEST(TokenizerFiles, PatternsThatJoinAcrossTheCutHaveNoSafePlace) {
  if (!testing::require_fetched()) return;
  nlohmann::json j = nlohmann::json::parse(bpe_trained_here());
  const Tokenizer plain = Tokenizer::from_json_text(j.dump(), "trained-here.json");
  EXPECT_EQ(plain.last_safe_cut("a sentence\nOf words"), 13u);
  EXPECT_EQ(plain.last_safe_cut("a sentence\nOf"), 11u);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = " ?\\p{L}+ ?|\\p{N}+|[^\\s\\p{L}\\p{N}]+|\\s+";
  const Tokenizer joined = Tokenizer::from_json_text(j.dump(), "joined.json");
  auto parts = joined.encode("one");
  for (const TokenId id : joined.encode(" two")) parts.push_back(id);
  EXPECT_NE(joined.encode("one two"), parts);
  EXPECT_EQ(joined.last_safe_cut("a sentence\nOf words"), 0u);
  const Tokenizer llama2 = Tokenizer::load((fetched_dir() / "tokenizers" / "llama2" / "tokenizer.json").string());
  EXPECT_EQ(llama2.last_safe_cut("a sentence\nOf words"), 13u);
  EXPECT_EQ(llama2.last_safe_cut("a sentence\nOf"), 1u);  // words begin at spaces alone
}

TEST(TokenizerFiles, ClearErrors) {
  const auto bad = testing::tmp_path("nonsense.tiktoken");
  { std::ofstream(bad) << "not base64!! x\n"; }
  EXPECT_THROW(Tokenizer::load(bad.string()), DataError);
  const auto unknown = testing::tmp_path("mystery.json");
  { std::ofstream(unknown) << R"({"model": {"type": "Unigram", "vocab": []}})"; }
  try {
    Tokenizer::load(unknown.string());
    ADD_FAILURE() << "a Unigram tokenizer.json should be rejected";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("Unigram"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(unknown.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), DataError);
}

// The audit's tokenizer.json files: each one a DataError naming the file and the field, where they used to be an
// "internal error" (std::bad_alloc, the JSON library's type_error without the field), a wrapped id ("id 0 is
// assigned twice" for 4294967296), or accepted (an empty special token, on which encode --special never ended).
TEST(TokenizerFiles, WrongFieldsAreDataErrorsNamingTheField) {
  if (!testing::require_fetched()) return;
  const auto base = nlohmann::json::parse(bpe_trained_here());
  ASSERT_EQ(base["added_tokens"][2]["content"], "[PAD]");
  int n = 0;
  const auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = base;
    edit(j);
    const auto path = testing::tmp_path(fmt::format("bad-field-{}.json", n++));
    std::ofstream(path) << j.dump();
    const std::string msg = testing::data_error_of([&] { Tokenizer::load(path.string()); });
    EXPECT_EQ(msg.rfind(path.string() + ": ", 0), 0u) << msg;  // the file first
    return msg.substr(std::min(msg.size(), path.string().size() + 2));
  };
  EXPECT_EQ(error_of([](auto& j) { j["added_tokens"][2]["content"] = ""; }),
            "field 'added_tokens[2].content' is empty (a special token needs text)");
  EXPECT_EQ(error_of([](auto& j) { j["added_tokens"][2]["content"] = "[BOT]"; }),
            "added_tokens[2] has the content '[BOT]' of added_tokens[0] (each special token once)");
  EXPECT_EQ(error_of([](auto& j) {
              j["added_tokens"] = {{"id", 0}};
            }),
            "field 'added_tokens' should be an array, not an object");
  EXPECT_EQ(error_of([](auto& j) { j["added_tokens"][1]["special"] = "yes"; }),
            "field 'added_tokens[1].special' should be true or false, not a string");
  EXPECT_EQ(error_of([](auto& j) { j["added_tokens"][1]["id"] = -1; }), "added_tokens[1] has no integer id");
  EXPECT_EQ(error_of([](auto& j) { j["model"]["vocab"]["a"] = 2000000000; }),
            "vocab entry 'a' has id 2000000000, out of range (ids must be below 16777216)");
  EXPECT_EQ(error_of([](auto& j) { j["model"]["vocab"]["a"] = uint64_t{1} << 32; }),
            "vocab entry 'a' has id 4294967296, out of range (ids must be below 16777216)");
  EXPECT_EQ(error_of([](auto& j) { j["model"]["type"] = 5; }), "field 'model.type' should be a string, not a number");
  EXPECT_EQ(error_of([](auto& j) { j["model"]["byte_fallback"] = "yes"; }),
            "field 'model.byte_fallback' should be true or false, not a string");
  EXPECT_EQ(error_of([](auto& j) { j["model"]["ignore_merges"] = 1; }),
            "field 'model.ignore_merges' should be true or false, not a number");
  EXPECT_EQ(error_of([](auto& j) { j["model"] = "BPE"; }), "field 'model' should be an object, not a string");
  EXPECT_EQ(error_of([](auto& j) { j["decoder"] = 5; }), "field 'decoder' should be an object or null, not a number");
  EXPECT_EQ(error_of([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = "no"; }),
            "field 'pre_tokenizer.pretokenizers[1].use_regex' should be true or false, not a string");
  EXPECT_EQ(error_of([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = 7; }),
            "field 'pre_tokenizer.pretokenizers[0].type' should be a string, not a number");

  // A Llama 2 (byte_fallback) tokenizer.json goes through the same checks.
  const auto llama2 = nlohmann::json::parse(testing::slurp(fetched_dir() / "tokenizers" / "llama2" / "tokenizer.json"));
  ASSERT_TRUE(llama2["model"]["byte_fallback"].get<bool>());
  auto j = llama2;
  j["added_tokens"][0]["content"] = "";
  const auto path = testing::tmp_path("llama2-empty-special.json");
  std::ofstream(path) << j.dump();
  EXPECT_EQ(testing::data_error_of([&] { Tokenizer::load(path.string()); }),
            path.string() + ": field 'added_tokens[0].content' is empty (a special token needs text)");
}

// A tiktoken rank past the id limit is refused too (it sized the id table: std::bad_alloc).
TEST(TokenizerFiles, TiktokenRankOutOfRange) {
  const auto path = testing::tmp_path("r50k_base.tiktoken");
  {
    std::ofstream out(path);
    for (int b = 0; b < 256; ++b) {
      static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
      const unsigned v = static_cast<unsigned>(b);
      out << kB64[v >> 2] << kB64[(v & 3) << 4] << "== " << (b == 200 ? std::string("3000000000") : std::to_string(b))
          << "\n";
    }
  }
  EXPECT_EQ(testing::data_error_of([&] { Tokenizer::load(path.string()); }),
            path.string() + ":201: rank 3000000000 is out of range (ids must be below 16777216)");
}

}  // namespace
}  // namespace shardtrain::data
