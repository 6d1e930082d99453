// tokenizer.json's added_tokens as the Hugging Face library matches them (non-special ones in every mode, lstrip,
// rstrip, normalized), and the fields shardtrain refuses (single_word, normalized under a normalizer, BPE dropout).
// The expected ids are Hugging Face tokenizers 0.23.1's for the same files (encode_special_tokens true for AsText,
// false for Recognize; add_special_tokens false), computed once and written here.
#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "data_test_util.hpp"
#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {
namespace {

using testing::fetched_dir;
using Ids = std::vector<TokenId>;

nlohmann::json added_token(const std::string& content, TokenId id, bool special, bool lstrip = false, bool rstrip = false,
                           bool normalized = false) {
  return {{"id", id},         {"content", content},       {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

nlohmann::json fetched_json(const char* relpath) {
  return nlohmann::json::parse(testing::slurp(fetched_dir() / "tokenizers" / relpath));
}

std::string write_json(const nlohmann::json& j, const std::string& name) {
  const auto path = testing::tmp_path(name);
  std::ofstream(path) << j.dump();
  return path.string();
}

// The DataError of loading `j`, after the file's path (which it must start with).
std::string error_of(const nlohmann::json& j) {
  static int n = 0;
  const auto path = write_json(j, fmt::format("refused-{}.json", n++));
  const std::string msg = testing::data_error_of([&] { Tokenizer::load(path); });
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;  // the file first
  return msg.substr(std::min(msg.size(), path.size() + 2));
}

struct Expected {
  std::string text;
  Ids as_text, recognize;
};

void expect_ids(const Tokenizer& tok, const std::vector<Expected>& cases) {
  for (const auto& c : cases) {
    EXPECT_EQ(tok.encode(c.text, SpecialTokenMode::AsText), c.as_text) << "AsText: '" << c.text << "'";
    EXPECT_EQ(tok.encode(c.text, SpecialTokenMode::Recognize), c.recognize) << "Recognize: '" << c.text << "'";
  }
}

// GPT-2 with tokenizer.add_tokens(["<custom>"]) and tokens of each kind: <sp> special with lstrip and rstrip, <L> and
// <R> not special with lstrip or rstrip, and the special <|x|> holding the text of the non-special x|>.
TEST(AddedTokens, NotSpecialOnesAreMatchedInEveryModeAndStripsTakeTheWhitespace) {
  if (!testing::require_fetched()) return;
  auto j = fetched_json("gpt2-hf/tokenizer.json");
  for (auto t : {added_token("<custom>", 50257, false), added_token("<sp>", 50258, true, true, true),
                 added_token("<L>", 50259, false, true), added_token("<R>", 50260, false, false, true),
                 added_token("<|x|>", 50261, true), added_token("x|>", 50262, false)})
    j["added_tokens"].push_back(t);
  const Tokenizer tok = Tokenizer::load(write_json(j, "gpt2-added.json"));
  expect_ids(tok,
             {
                 {"hello <custom> world", {31373, 220, 50257, 995}, {31373, 220, 50257, 995}},
                 {"hello <sp> world", {31373, 1279, 2777, 29, 995}, {31373, 50258, 6894}},
                 {"hello  <sp>  world", {31373, 220, 1279, 2777, 29, 220, 995}, {31373, 50258, 6894}},
                 {"a<sp>b", {64, 27, 2777, 29, 65}, {64, 50258, 65}},
                 {"x <L> y", {87, 50259, 331}, {87, 50259, 331}},
                 {"x  \n <L>y", {87, 50259, 88}, {87, 50259, 88}},
                 {"x <R>  y", {87, 220, 50260, 88}, {87, 220, 50260, 88}},
                 {"x <R>\n\ny", {87, 220, 50260, 88}, {87, 220, 50260, 88}},
                 {"\u00e9 <L>", {2634, 50259}, {2634, 50259}},
                 {"<custom>  <L>", {50257, 50259}, {50257, 50259}},
                 {"  <L> ", {50259, 220}, {50259, 220}},
                 // The special <|x|> is found first and passed over as text: the x|> inside it is not matched.
                 {"a<|x|>b", {64, 27, 91, 87, 91, 29, 65}, {64, 50261, 65}},
                 {"<custom><custom>", {50257, 50257}, {50257, 50257}},
                 {"<sp> <R> <L> <custom>", {27, 2777, 29, 220, 50260, 50259, 220, 50257}, {50258, 50260, 50259, 220, 50257}},
                 {"\u3000<L>\u00a0x", {50259, 1849, 87}, {50259, 1849, 87}},
                 {"<R> <L>", {50260, 50259}, {50260, 50259}},
             });
  // Non-special tokens decode to their text and are not among the special tokens; the ids cover them all.
  EXPECT_EQ(tok.decode(tok.encode("hello <custom> world")), "hello <custom> world");
  EXPECT_EQ(tok.vocab_size(), 50263u);
  std::vector<std::string> specials;
  for (const auto& s : tok.special_tokens()) specials.push_back(s.content);
  std::sort(specials.begin(), specials.end());
  EXPECT_EQ(specials, (std::vector<std::string>{"<sp>", "<|endoftext|>", "<|x|>"}));
  // A token matched before the split may span any place: no cut is exact.
  const Tokenizer plain = Tokenizer::load((fetched_dir() / "tokenizers" / "gpt2-hf" / "tokenizer.json").string());
  EXPECT_GT(plain.last_safe_cut("one two three"), 0u);
  EXPECT_EQ(tok.last_safe_cut("one two three"), 0u);
}

// normalized true (no normalizer): matched after the others, in the text between their matches, so the x|> inside
// the special <|x|> is found where specials are text.
TEST(AddedTokens, NormalizedOnesAreMatchedBetweenTheOthers) {
  if (!testing::require_fetched()) return;
  auto j = fetched_json("gpt2-hf/tokenizer.json");
  j["added_tokens"].push_back(added_token("<|x|>", 50257, true));
  j["added_tokens"].push_back(added_token("x|>", 50258, false, false, false, true));
  const Tokenizer tok = Tokenizer::load(write_json(j, "gpt2-normalized.json"));
  expect_ids(tok, {
                      {"a<|x|>b", {64, 27, 91, 50258, 65}, {64, 50257, 65}},
                      {"ax|> b", {64, 50258, 275}, {64, 50258, 275}},
                  });
}

// Llama 2's file with a non-special <custom>, in its own layout (the normalizer's space before every segment) and in
// the Metaspace one (prepend_scheme first: before the segment at the start of the text only).
TEST(AddedTokens, ByteFallbackLayouts) {
  if (!testing::require_fetched()) return;
  auto j = fetched_json("llama2/tokenizer.json");
  j["added_tokens"].push_back(added_token("<custom>", 32000, false));
  const Tokenizer legacy = Tokenizer::load(write_json(j, "llama2-added.json"));
  expect_ids(
      legacy,
      {
          {"hello <custom> world", {6312, 28709, 28705, 32000, 28705, 1526}, {6312, 28709, 28705, 32000, 28705, 1526}},
          {"<custom>x", {32000, 1318}, {32000, 1318}},
          {"a <custom>", {264, 28705, 32000}, {264, 28705, 32000}},
          {"a</s> <custom>b", {264, 700, 28713, 28767, 28705, 32000, 287}, {264, 2, 259, 32000, 287}},
      });
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  const Tokenizer metaspace = Tokenizer::load(write_json(j, "llama2-metaspace-added.json"));
  expect_ids(metaspace,
             {
                 {"hello <custom> world", {6312, 28709, 28705, 32000, 1526}, {6312, 28709, 28705, 32000, 1526}},
                 {"<custom>x", {32000, 28744}, {32000, 28744}},
                 {"a <custom>", {264, 28705, 32000}, {264, 28705, 32000}},
                 {"a</s> <custom>b", {264, 700, 28713, 28767, 28705, 32000, 28726}, {264, 2, 28705, 32000, 28726}},
                 {"<custom> hi", {32000, 12014}, {32000, 12014}},
             });
}

// What shardtrain does not do is a DataError naming the file and the entry.
TEST(AddedTokens, UnsupportedFieldsAreRefusedNamingTheEntry) {
  if (!testing::require_fetched()) return;
  const auto gpt2 = fetched_json("gpt2-hf/tokenizer.json");
  auto j = gpt2;
  j["added_tokens"].push_back(added_token("<w>", 50257, false));
  j["added_tokens"][1]["single_word"] = true;
  EXPECT_EQ(error_of(j),
            "added_tokens[1] ('<w>') has single_word true, which is not supported (expected false; special, "
            "lstrip, rstrip and normalized are)");
  j = gpt2;
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"].push_back(added_token("<n>", 50257, false, false, false, true));
  EXPECT_EQ(error_of(j),
            "added_tokens[1] ('<n>') has normalized true with the normalizer 'NFC', which is not supported "
            "(expected normalized false, or no normalizer)");
  auto llama2 = fetched_json("llama2/tokenizer.json");
  llama2["added_tokens"][0]["normalized"] = true;
  EXPECT_EQ(error_of(llama2),
            "added_tokens[0] ('<unk>') has normalized true with the normalizer 'Prepend + Replace', "
            "which is not supported (expected normalized false, or no normalizer)");
  j = gpt2;
  j["added_tokens"][0]["lstrip"] = "yes";
  EXPECT_EQ(error_of(j), "field 'added_tokens[0].lstrip' should be true or false, not a string");
}

// BPE dropout: Hugging Face skips random merges on every encode ("hello world" came out as h, el, l, o, ...). A
// DataError naming the field; null and 0 load as before.
TEST(BpeDropout, RefusedNamingTheField) {
  if (!testing::require_fetched()) return;
  const auto gpt2 = fetched_json("gpt2-hf/tokenizer.json");
  auto j = gpt2;
  j["model"]["dropout"] = 0.5;
  EXPECT_EQ(error_of(j),
            "field 'model.dropout' is 0.5: BPE dropout (random merges skipped on every encode) is a "
            "training-time augmentation that shardtrain does not apply; set it to null");
  auto llama2 = fetched_json("llama2/tokenizer.json");
  llama2["model"]["dropout"] = 1;
  EXPECT_EQ(error_of(llama2),
            "field 'model.dropout' is 1: BPE dropout (random merges skipped on every encode) is a "
            "training-time augmentation that shardtrain does not apply; set it to null");
  j = gpt2;
  j["model"]["dropout"] = "0.1";
  EXPECT_EQ(error_of(j), "field 'model.dropout' should be a number or null, not a string");
  const Ids hello = {31373, 995, 428, 318, 257, 1332};  // Hugging Face's, dropout null or 0
  int n = 0;
  for (const nlohmann::json& dropout : {nlohmann::json(nullptr), nlohmann::json(0), nlohmann::json(0.0)}) {
    j = gpt2;
    j["model"]["dropout"] = dropout;
    EXPECT_EQ(Tokenizer::load(write_json(j, fmt::format("dropout-{}.json", n++))).encode("hello world this is a test"),
              hello)
        << dropout.dump();
  }
}

}  // namespace
}  // namespace shardtrain::data
