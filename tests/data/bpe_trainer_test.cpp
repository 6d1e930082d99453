// The BPE trainer: exact vocabulary size, deterministic output, and a tokenizer.json that both our loader
// and an independent implementation (@lenml/tokenizers, via node) read back to the same ids.
#include "data_test_util.hpp"
#include "shardtrain/data/bpe_trainer.hpp"

namespace shardtrain::data {
namespace {

BpeTrainOptions small_options() {
  BpeTrainOptions o;
  o.vocab_size = 1024;
  o.progress = ProgressStyle::Off;
  return o;
}

std::vector<std::string> moby_files(size_t n) {
  std::vector<std::string> out;
  for (const auto& p : testing::sorted_files(testing::fetched_dir() / "corpus" / "moby-dick", ".txt"))
    if (out.size() < n) out.push_back(p.string());
  return out;
}

TEST(BpeTrainer, ReloadsAndMatchesReference) {
  if (!testing::require_fetched()) return;
  const auto files = moby_files(40);
  const auto r = train_bpe(files, small_options());
  EXPECT_EQ(r.vocab_size, 1024u);
  EXPECT_EQ(r.merges, 1024u - 256 - 3);
  const auto path = testing::tmp_path("moby-bpe.json");
  { std::ofstream(path, std::ios::binary) << r.tokenizer_json; }
  const Tokenizer tok = Tokenizer::load(path.string());
  EXPECT_EQ(tok.vocab_size(), 1024u);
  EXPECT_EQ(tok.bot_id(), 0u);
  EXPECT_EQ(tok.eot_id(), 1u);
  EXPECT_EQ(tok.pad_id(), 2u);
  // Text it was trained on and text it was not (later chapters, edge cases).
  std::vector<std::string> texts;
  for (const auto& f : moby_files(45)) texts.push_back(testing::slurp(f));
  for (auto& t : testing::edge_texts()) texts.push_back(t);
  const auto ref = testing::reference_ids("hf-json", texts, path.string());
  ASSERT_EQ(ref.size(), texts.size());
  Encoder enc(tok);
  size_t bytes = 0, tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto ids = enc.encode(texts[i]);
    EXPECT_EQ(ids, ref[i]) << "text " << i;
    EXPECT_EQ(tok.decode(ids), texts[i]);
    bytes += texts[i].size();
    tokens += ids.size();
  }
  // A 1K vocabulary trained on this text compresses English well past one byte per token.
  EXPECT_GT(static_cast<double>(bytes) / static_cast<double>(tokens), 2.5);
}

TEST(BpeTrainer, DeterministicAcrossThreadCounts) {
  if (!testing::require_fetched()) return;
  const auto files = moby_files(10);
  auto o = small_options();
  o.vocab_size = 600;
  o.threads = 1;
  const auto a = train_bpe(files, o);
  o.threads = 2;
  const auto b = train_bpe(files, o);
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
}

// A bad document stops the counting with a DataError naming it; the counting threads free what they hold (under
// LeakSanitizer, the ASan build, a thread that threw used to leak its match data).
TEST(BpeTrainer, BadInputIsADataErrorNamingTheLine) {
  if (!testing::require_fetched()) return;
  const auto bad = testing::tmp_path("bpe-bad.jsonl");
  std::ofstream(bad) << R"({"text": "fine"})"
                     << "\n"
                     << R"({"text": 7})"
                     << "\n";
  auto o = small_options();
  for (int threads : {1, 2}) {
    o.threads = threads;
    EXPECT_EQ(testing::data_error_of([&] {
                train_bpe({bad.string(), bad.string()}, o);
              }),
              bad.string() + ":2: field \"text\" is not a string");
  }
}

// Special tokens are refused as the loader refuses them: an empty one (encode --special never ended on the
// tokenizer it made) and one given twice (its second id could never be produced); before any file is read.
TEST(BpeTrainer, RejectsEmptyAndRepeatedSpecialTokens) {
  auto o = small_options();
  const auto usage_error_of = [&] {
    try {
      train_bpe({"/nonexistent/input.txt"}, o);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no UsageError");
  };
  o.special_tokens = {"[BOT]", ""};
  EXPECT_EQ(usage_error_of(), "--special: special token 1 is empty (a special token needs text)");
  o.special_tokens = {"[A]", "[B]", "[A]"};
  EXPECT_EQ(usage_error_of(), "--special: '[A]' is given twice (special tokens 0 and 2)");
  o.special_tokens = {"[A]"};
  o.threads = -1;
  EXPECT_EQ(usage_error_of(), "--threads -1: expected 0 (every core this process may use) or more");
}

// Threads the system does not start are a UsageError naming the count, not std::terminate (the audit's
// --threads 65536 aborted): here the user may run no thread besides the one it has.
TEST(BpeTrainer, ThreadsTheSystemRefusesAreAUsageError) {
  if (!testing::require_fetched()) return;
  auto o = small_options();
  o.threads = 4;
  const auto files = moby_files(2);
  EXPECT_EQ(testing::usage_error_under_thread_limit(1, [&] { train_bpe(files, o); }),
            "4 threads: the system started only 0 (Resource temporarily unavailable); give fewer with --threads");
}

TEST(BpeTrainer, RejectsTooSmallVocabulary) {
  auto o = small_options();
  o.vocab_size = 100;
  EXPECT_THROW(train_bpe({"x"}, o), UsageError);
}

// "[EOT]" in the corpus, split on whitespace: the merges learned a token of the special token's text, and
// tokenizer.json's vocab object held the key twice (the learned id overwrote the special one's). Such merges are left
// out: the file's vocab has one entry per id, it loads, and the text "[EOT]" encodes to other ids than the special.
// A special token that a single byte spells ("!") is refused before any work.
TEST(BpeTrainer, NoLearnedTokenHasASpecialTokensText) {
  const auto corpus = testing::tmp_path("eot-stories.txt");
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 200; ++i) out << "the cat sat. [EOT] a dog ran! [EOT]\n";
  }
  auto o = small_options();
  o.vocab_size = 270;
  o.split_pattern = R"(\S+|\s+)";
  o.threads = 1;
  const auto r = train_bpe({corpus.string()}, o);
  EXPECT_EQ(r.vocab_size, 270u);
  const auto j = nlohmann::json::parse(r.tokenizer_json);
  const auto& vocab = j["model"]["vocab"];
  EXPECT_EQ(vocab.size(), r.vocab_size);
  std::vector<int> seen(r.vocab_size, 0);
  for (const auto& [key, id] : vocab.items()) ++seen.at(id.get<size_t>());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<ptrdiff_t>(r.vocab_size));
  EXPECT_EQ(vocab["[EOT]"], 1);
  const auto path = testing::tmp_path("eot-stories.json");
  std::ofstream(path, std::ios::binary) << r.tokenizer_json;
  const Tokenizer tok = Tokenizer::load(path.string());
  EXPECT_EQ(tok.vocab_size(), 270u);
  Encoder enc(tok);
  const auto ids = enc.encode("cat. [EOT]", SpecialTokenMode::AsText);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), TokenId{1}), 0);
  EXPECT_EQ(tok.decode(ids), "cat. [EOT]");
  EXPECT_EQ(enc.encode("[EOT]", SpecialTokenMode::Recognize), std::vector<TokenId>{1});

  o.special_tokens = {"!", "[EOT]"};
  try {
    train_bpe({corpus.string()}, o);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--special '!': is also the vocabulary's spelling of byte 33", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace shardtrain::data
