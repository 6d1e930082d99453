// prepare-data on documents larger than a batch: read and tokenized in pieces cut where the tokenizer keeps its
// tokens (Tokenizer::last_safe_cut), so that the dataset holds the whole text's tokens; where there is no such place
// (a stretch without one, a tokenizer without any) what is cut and said.
#include <filesystem>
#include <fstream>
#include <string>

#include "data_test_util.hpp"
#include "shardtrain/data/bpe_trainer.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/prepare.hpp"

namespace shardtrain::data {
namespace {

std::string gpt2_path() { return (testing::fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string(); }

// A document larger than a batch goes through in pieces (memory held to the batch: a 433 MB file took 1.7 GB whole)
// and keeps its tokens: one file of ~1.2 MB, per file and as one blank-line block, in batches of 64 KiB (pieces of
// 4 KiB) gives one document whose tokens are the tokenizer's of the whole text.
TEST(PrepareData, ALargeDocumentInPiecesKeepsItsTokens) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  std::string text;
  for (const auto& t : testing::real_texts(1200 * 1000)) text += t + (text.size() % 2 ? "\n" : " ");
  std::string block;  // the same lines less the blank ones: one blank-line block
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) block += (block.empty() ? "" : "\n") + line;
  const auto dir = testing::tmp_path("large-document");
  fs::create_directories(dir);
  std::ofstream(dir / "doc.txt", std::ios::binary) << text;
  std::ofstream(dir / "block.txt", std::ios::binary) << "\n" << block << "\n\nsmall one\n";
  const Tokenizer tok = Tokenizer::load(gpt2_path());
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.batch_bytes = size_t{64} << 10;
  o.threads = 2;
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  o.existing = ExistingOutput::Replace;
  o.inputs = {(dir / "doc.txt").string()};
  o.output = (dir / "doc.h5").string();
  const auto s = prepare_dataset(o);
  EXPECT_EQ(s.documents, 1u);
  EXPECT_EQ(s.bytes, text.size());
  const auto whole = tok.encode(text);
  {
    const auto ds = TokenDataset::open(o.output);
    ASSERT_EQ(ds.num_documents(), 1u);
    const auto got = ds.document(0);
    EXPECT_EQ(got.size(), whole.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.begin(), whole.end()));
  }
  o.inputs = {(dir / "block.txt").string()};
  o.documents.split = DocumentSplit::BlankLines;
  o.output = (dir / "block.h5").string();
  EXPECT_EQ(prepare_dataset(o).documents, 2u);
  const auto ds = TokenDataset::open(o.output);
  ASSERT_EQ(ds.num_documents(), 2u);
  const auto block_ids = tok.encode(block);
  const auto got = ds.document(0);
  EXPECT_EQ(got.size(), block_ids.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), block_ids.begin(), block_ids.end()));
  const auto small = tok.encode("small one");
  const auto second = ds.document(1);
  EXPECT_TRUE(std::equal(second.begin(), second.end(), small.begin(), small.end()));
}

// A stretch with no place to cut exactly (300 KB of digits, more than the 64 KiB batch) is cut at a batch's size,
// at a character boundary: still one document, whose tokens decode to the text, each character whole.
TEST(PrepareData, AStretchWithNoSafePlaceIsCutAtTheBatchSize) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  std::string text = "Numbers follow ";
  for (int i = 0; text.size() < 300 * 1000; ++i) text += i % 3 ? std::to_string(i) : "\xc3\xa9";
  text += " and words again, with more words after them.";
  const auto dir = testing::tmp_path("digits");
  fs::create_directories(dir);
  std::ofstream(dir / "digits.txt", std::ios::binary) << text;
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.batch_bytes = size_t{64} << 10;
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  o.existing = ExistingOutput::Replace;
  o.inputs = {(dir / "digits.txt").string()};
  o.output = (dir / "digits.h5").string();
  EXPECT_EQ(prepare_dataset(o).documents, 1u);
  const auto ds = TokenDataset::open(o.output);
  const Tokenizer tok = Tokenizer::load(gpt2_path());
  const auto ids = ds.document(0);
  EXPECT_EQ(tok.decode(std::vector<TokenId>(ids.begin(), ids.end())), text);
}

// --blank-line-documents: a block whose first line is a stretch with no character boundary (continuation bytes) longer
// than a piece may grow, then a line of text. The stretch went out whole as a piece, and the newline after it was
// dropped: the block decoded as its bytes + "hello world".
TEST(PrepareData, ABlockCutWholeKeepsTheNewlineAfterIt) {
  if (!testing::require_fetched()) return;
  const std::string block = "\xe2" + std::string(100000, '\x80') + "\nhello world";
  const auto input = testing::tmp_path("junk-block.txt");
  std::ofstream(input, std::ios::binary) << block << "\n";
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {input.string()};
  o.output = testing::tmp_path("junk-block.h5").string();
  o.documents.split = DocumentSplit::BlankLines;
  o.batch_bytes = size_t{64} << 10;
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  o.existing = ExistingOutput::Replace;
  EXPECT_EQ(prepare_dataset(o).documents, 1u);
  const auto ds = TokenDataset::open(o.output);
  const auto ids = ds.document(0);
  EXPECT_EQ(Tokenizer::load(gpt2_path()).decode(std::vector<TokenId>(ids.begin(), ids.end())), block);
}

// A tokenizer whose split pattern has no safe cut places (`\S+\s*` takes the space after a word into it): each long
// document was warned about ("no place to cut the document exactly (an ASCII letter after a space or newline)"),
// blaming the text. Now one warning a run names the tokenizer and what the cuts cost.
TEST(PrepareData, ATokenizerWithoutSafeCutsIsSaidOnceARun) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  const auto dir = testing::fresh_tmp_dir("no-safe-cuts");
  const auto texts = testing::real_texts(600 << 10);
  std::string all;
  for (const auto& t : texts) all += t;
  for (int i = 0; i < 3; ++i) std::ofstream(dir / ("doc" + std::to_string(i) + ".txt")) << all.substr(i * 150000, 150000);
  BpeTrainOptions train;
  train.vocab_size = 300;
  train.split_pattern = R"(\S+\s*)";
  train.progress = ProgressStyle::Off;
  const auto tokenizer_path = dir.parent_path() / "no-safe-cuts.json";
  std::ofstream(tokenizer_path) << train_bpe({(dir / "doc0.txt").string()}, train).tokenizer_json;
  ASSERT_FALSE(Tokenizer::load(tokenizer_path.string()).has_safe_cuts());
  ASSERT_TRUE(Tokenizer::load(gpt2_path()).has_safe_cuts());
  PrepareOptions o;
  o.tokenizer = tokenizer_path.string();
  o.inputs = {dir.string()};
  o.output = testing::tmp_path("no-safe-cuts.h5").string();
  o.batch_bytes = size_t{64} << 10;
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  o.existing = ExistingOutput::Replace;
  ::testing::internal::CaptureStderr();
  const auto s = prepare_dataset(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.documents, 3u);
  const auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = err.find(needle); at != std::string::npos; at = err.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("no place to cut the document exactly"), 0u) << err;
  EXPECT_EQ(count("has no place where a long document can be cut with its tokens kept"), 1u) << err;
  EXPECT_NE(err.find("3 document(s) longer than a piece were cut 6 time(s) at character boundaries"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace shardtrain::data
