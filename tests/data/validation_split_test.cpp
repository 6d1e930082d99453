// The validation split prepare-data records: by a seeded shuffle of positions (exact in count), or by content
// (--split-by content: each document on the side its token hash gives it, whatever else the corpus holds).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "data_test_util.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/prepare.hpp"

namespace shardtrain::data {
namespace {

TEST(ValidationSplit, ShuffleChoice) {
  EXPECT_EQ(choose_validation_documents(1000, 0.01, 3).size(), 10u);
  EXPECT_EQ(choose_validation_documents(10, 0.01, 3).size(), 1u);
  EXPECT_EQ(choose_validation_documents(10, 0.0, 3).size(), 0u);
  EXPECT_EQ(choose_validation_documents(100, 0.25, 3), choose_validation_documents(100, 0.25, 3));
  EXPECT_NE(choose_validation_documents(100, 0.25, 3), choose_validation_documents(100, 0.25, 4));
}

TEST(ValidationSplit, ContentChoice) {
  // 100000 documents of distinct content at 1%: the count is binomial (mean 1000, sd 31.5); this seed's is fixed.
  std::vector<uint64_t> hashes;
  for (TokenId i = 0; i < 100000; ++i) hashes.push_back(document_content_hash(std::vector<TokenId>{i, i + 1}, 9));
  const auto v = choose_validation_by_content(hashes, 0.01);
  EXPECT_GT(v.size(), 850u);
  EXPECT_LT(v.size(), 1150u);
  EXPECT_TRUE(std::is_sorted(v.begin(), v.end()));
  for (const int64_t d : v) EXPECT_LT(static_cast<double>(hashes[static_cast<size_t>(d)]), 0.01 * 0x1p64);
  EXPECT_TRUE(choose_validation_by_content(hashes, 0.0).empty());
  // A small corpus keeps at least one document out, the smallest hash; never all of them, nor the only one.
  const std::vector<uint64_t> few{900ull << 50, 5ull << 50, 700ull << 50};  // none below 1e-9 x 2^64
  EXPECT_EQ(choose_validation_by_content(few, 1e-9), std::vector<int64_t>{1});
  const std::vector<uint64_t> all{1, 2, 3};
  EXPECT_EQ(choose_validation_by_content(all, 0.5), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(choose_validation_by_content(std::vector<uint64_t>{1}, 0.5).empty());
  // The hash is the content's and the seed's: the same ids hash alike, other ids or another seed otherwise.
  const std::vector<TokenId> doc{11, 22, 33};
  EXPECT_EQ(document_content_hash(doc, 1), document_content_hash(std::vector<TokenId>{11, 22, 33}, 1));
  EXPECT_NE(document_content_hash(doc, 1), document_content_hash(std::vector<TokenId>{11, 22, 33, 0}, 1));
  EXPECT_NE(document_content_hash(doc, 1), document_content_hash(doc, 2));
}

// Each document's side, keyed by its tokens.
std::map<std::vector<TokenId>, bool> sides(const TokenDataset& ds) {
  std::map<std::vector<TokenId>, bool> out;
  for (size_t d = 0; d < ds.num_documents(); ++d) {
    const auto ids = ds.document(d);
    out[std::vector<TokenId>(ids.begin(), ids.end())] = false;
  }
  for (const int64_t d : ds.split_documents(DatasetSplit::Validation)) {
    const auto ids = ds.document(static_cast<size_t>(d));
    out[std::vector<TokenId>(ids.begin(), ids.end())] = true;
  }
  return out;
}

PrepareSummary prepare(const std::vector<std::string>& inputs, const std::string& name, SplitBy by) {
  PrepareOptions o;
  o.tokenizer = (testing::fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string();
  o.inputs = inputs;
  o.output = testing::tmp_path(name).string();
  o.existing = ExistingOutput::Replace;
  o.validation_fraction = 0.1;
  o.seed = 5;
  o.split_by = by;
  o.progress = ProgressStyle::Off;
  return prepare_dataset(o);
}

// A corpus prepared again after it grew (and with its files in another order): by content, every document of the
// first preparation is on the same side in the second, and an exact copy of a document is on its side; by shuffle,
// documents a model trained on in the first are held out in the second (the leak --split-by content closes).
TEST(ValidationSplit, ByContentEachDocumentKeepsItsSideWhenTheCorpusGrows) {
  if (!testing::require_fetched()) return;
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  ASSERT_GE(sotu.size(), 160u);
  const auto copies = testing::fresh_tmp_dir("split-copies");
  std::filesystem::copy_file(sotu[3], copies / "copy-of-3.txt");
  std::vector<std::string> small, grown{(copies / "copy-of-3.txt").string()};
  for (size_t i = 0; i < 100; ++i) small.push_back(sotu[i].string());
  for (size_t i = 160; i-- > 0;) grown.push_back(sotu[i].string());

  for (const SplitBy by : {SplitBy::Content, SplitBy::Shuffle}) {
    const std::string tag = split_by_name(by);
    const auto s1 = prepare(small, "split-small-" + tag + ".h5", by);
    const auto s2 = prepare(grown, "split-grown-" + tag + ".h5", by);
    const auto a = TokenDataset::open(testing::tmp_path("split-small-" + tag + ".h5").string());
    const auto b = TokenDataset::open(testing::tmp_path("split-grown-" + tag + ".h5").string());
    EXPECT_EQ(a.info().split_by, by);
    EXPECT_EQ(s1.validation_documents, a.split_documents(DatasetSplit::Validation).size());
    EXPECT_EQ(s2.validation_documents, b.split_documents(DatasetSplit::Validation).size());
    const auto side_a = sides(a), side_b = sides(b);
    size_t moved_in = 0, moved_out = 0;
    for (const auto& [ids, held_out] : side_a) {
      ASSERT_TRUE(side_b.count(ids));
      moved_in += !held_out && side_b.at(ids);
      moved_out += held_out && !side_b.at(ids);
    }
    if (by == SplitBy::Content) {
      EXPECT_EQ(moved_in + moved_out, 0u) << "documents that changed sides";
      // Near the fraction (10 of 100, 16 of 161 on average), and the same rule as the hash of each document alone.
      EXPECT_GT(s1.validation_documents, 3u);
      EXPECT_LT(s1.validation_documents, 20u);
      for (size_t d = 0; d < b.num_documents(); ++d) {
        const bool below = static_cast<double>(document_content_hash(b.document(d), 5)) < 0.1 * 0x1p64;
        const auto v = b.split_documents(DatasetSplit::Validation);
        EXPECT_EQ(below, std::binary_search(v.begin(), v.end(), static_cast<int64_t>(d))) << "document " << d;
      }
    } else {
      EXPECT_EQ(s1.validation_documents, 10u);  // round(0.1 x 100)
      EXPECT_GT(moved_in, 0u) << "by position, training documents of the first are held out in the second";
    }
  }
}

}  // namespace
}  // namespace shardtrain::data
