// Text and JSONL inputs compressed with gzip or zstd (by their own command-line tools, as corpora ship them):
// the same documents and the same dataset as the plain files, several members or frames in one file, lines
// longer than the read window; cut-short and corrupt files are DataErrors naming the file.
#include <filesystem>

#include "data_test_util.hpp"
#include "shardtrain/data/prepare.hpp"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;

void run(const std::string& cmd) { ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd; }

std::string q(const fs::path& p) {  // quoted for the shell
  std::string s = "'";
  s += p.string();
  s += '\'';
  return s;
}

// The default corpus as two JSONL files (one document per address, a 3 MB record among them: longer than the
// 1 MiB window a line is read through), their gzip and zstd forms, and the two concatenated, which makes a
// gzip file of two members and a zstd file of two frames.
struct Corpus {
  fs::path dir;
  std::vector<std::string> documents;
};

Corpus make_corpus() {
  Corpus c;
  c.dir = testing::tmp_path("compressed");
  fs::remove_all(c.dir);
  fs::create_directories(c.dir);
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  for (int part = 0; part < 2; ++part) {
    std::ofstream out(c.dir / ("part" + std::to_string(part) + ".jsonl"), std::ios::binary);
    for (size_t i = static_cast<size_t>(part); i < sotu.size(); i += 2) {
      c.documents.push_back(testing::slurp(sotu[i]));
      if (i == 100) {
        std::string big;
        while (big.size() < 3'000'000) big += c.documents.back();
        c.documents.back() = big;
      }
      out << nlohmann::json{{"text", c.documents.back()}, {"id", i}}.dump() << "\n";
    }
  }
  for (const char* p : {"part0", "part1"}) {
    run("gzip -k -6 " + q(c.dir / (std::string(p) + ".jsonl")));
    run("zstd -q -k -3 " + q(c.dir / (std::string(p) + ".jsonl")) + " -o " + q(c.dir / (std::string(p) + ".jsonl.zst")));
  }
  run("cat " + q(c.dir / "part0.jsonl.gz") + " " + q(c.dir / "part1.jsonl.gz") + " > " + q(c.dir / "both.json.gz"));
  run("cat " + q(c.dir / "part0.jsonl.zst") + " " + q(c.dir / "part1.jsonl.zst") + " > " + q(c.dir / "both.jsonl.zstd"));
  return c;
}

std::vector<std::string> read_all(const std::vector<std::string>& files) {
  std::vector<std::string> out;
  for (const auto& f : files)
    for (auto& d : read_documents(f, {})) out.push_back(std::move(d));
  return out;
}

TEST(CompressedInputs, GzipAndZstdGiveThePlainFilesDocuments) {
  if (!testing::require_fetched()) return;
  const Corpus c = make_corpus();
  const auto d = [&](const char* name) { return (c.dir / name).string(); };
  // In file order: part0's documents are the even addresses, part1's the odd ones.
  const auto plain = read_all({d("part0.jsonl"), d("part1.jsonl")});
  ASSERT_EQ(plain.size(), c.documents.size());
  EXPECT_EQ(read_all({d("part0.jsonl.gz"), d("part1.jsonl.gz")}), plain);
  EXPECT_EQ(read_all({d("part0.jsonl.zst"), d("part1.jsonl.zst")}), plain);
  EXPECT_EQ(read_all({d("both.json.gz")}), plain);     // two gzip members; .json.gz is JSONL, as C4 names it
  EXPECT_EQ(read_all({d("both.jsonl.zstd")}), plain);  // two zstd frames
  // The estimates a progress bar starts from: exact for one member or frame whose size is recorded.
  EXPECT_EQ(document_bytes_estimate(d("part0.jsonl.gz"), {}), fs::file_size(d("part0.jsonl")));
  EXPECT_EQ(document_bytes_estimate(d("part0.jsonl.zst"), {}), fs::file_size(d("part0.jsonl")));
  EXPECT_EQ(document_bytes_estimate(d("part0.jsonl"), {}), fs::file_size(d("part0.jsonl")));

  // A one-document text file, and blank-line documents, compressed.
  const auto text = c.dir / "address.txt";
  std::ofstream(text, std::ios::binary) << c.documents[3] << "\n\n" << c.documents[5];
  run("gzip -k " + q(text));
  run("zstd -q -k " + q(text) + " -o " + q(c.dir / "address.txt.zst"));
  EXPECT_EQ(read_documents(d("address.txt.gz"), {}), read_documents(text.string(), {}));
  DocumentOptions blocks;
  blocks.split = DocumentSplit::BlankLines;
  const auto plain_blocks = read_documents(text.string(), blocks);
  EXPECT_GE(plain_blocks.size(), 2u);
  EXPECT_EQ(read_documents(d("address.txt.zst"), blocks), plain_blocks);
}

TEST(CompressedInputs, PrepareDataGivesTheSameDataset) {
  if (!testing::require_fetched()) return;
  const Corpus c = make_corpus();
  auto prepare = [&](std::vector<std::string> inputs, const std::string& name) {
    PrepareOptions o;
    o.tokenizer = (testing::fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string();
    for (auto& i : inputs) i = (c.dir / i).string();
    o.inputs = inputs;
    o.output = (c.dir / name).string();
    o.batch_bytes = size_t{2} << 20;
    o.progress = ProgressStyle::Off;
    return std::pair{prepare_dataset(o), TokenDataset::open(o.output)};
  };
  const auto [plain_summary, plain] = prepare({"part0.jsonl", "part1.jsonl"}, "plain.h5");
  const auto [gz_summary, gz] = prepare({"part0.jsonl.gz", "part1.jsonl.gz"}, "gz.h5");
  const auto [zst_summary, zst] = prepare({"both.jsonl.zstd"}, "zst.h5");
  EXPECT_GT(plain_summary.tokens, 2'500'000u);
  for (const auto* ds : {&gz, &zst}) {
    ASSERT_EQ(ds->num_documents(), plain.num_documents());
    EXPECT_EQ(ds->num_tokens(), plain.num_tokens());
    for (size_t i = 0; i < plain.num_documents(); ++i) {
      const auto a = plain.document(i), b = ds->document(i);
      ASSERT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << "document " << i;
    }
  }
  EXPECT_EQ(gz_summary.bytes, plain_summary.bytes);
  EXPECT_EQ(zst_summary.bytes, plain_summary.bytes);
}

TEST(CompressedInputs, CutShortCorruptAndEmptyFilesNameTheFile) {
  if (!testing::require_fetched()) return;
  const Corpus c = make_corpus();
  for (const char* name : {"part0.jsonl.gz", "part0.jsonl.zst"}) {
    SCOPED_TRACE(name);
    const std::string good = testing::slurp(c.dir / name);
    const auto bad = c.dir / (std::string("bad") + fs::path(name).extension().string());
    const std::string kind = fs::path(name).extension() == ".gz" ? "gzip" : "zstd";
    // Cut short: the reading ends in the middle of the stream.
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
    EXPECT_EQ(testing::data_error_of([&] { read_documents(bad.string(), {}); }),
              bad.string() + ": the " + kind + " data ends in the middle of a stream (the file is cut short)");
    // A byte changed in the middle: the compressed data, or the checksum over it, no longer holds.
    std::string flipped = good;
    flipped[good.size() / 2] = static_cast<char>(flipped[good.size() / 2] ^ 0x10);
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << flipped;
    const auto err = testing::data_error_of([&] { read_documents(bad.string(), {}); });
    EXPECT_EQ(err.rfind(bad.string() + ": the " + kind + " data is corrupt near compressed byte ", 0), 0u) << err;
  }
  // Compressed nothing is an empty input; a file that is not gzip at all is corrupt data.
  std::ofstream(c.dir / "nothing.jsonl").flush();
  run("gzip -k " + q(c.dir / "nothing.jsonl"));
  EXPECT_EQ(testing::data_error_of([&] { read_documents((c.dir / "nothing.jsonl.gz").string(), {}); }),
            (c.dir / "nothing.jsonl.gz").string() + ": input file is empty");
  std::ofstream(c.dir / "plain-named.jsonl.gz") << R"({"text": "not compressed"})"
                                                << "\n";
  const auto err = testing::data_error_of([&] { read_documents((c.dir / "plain-named.jsonl.gz").string(), {}); });
  EXPECT_EQ(err, (c.dir / "plain-named.jsonl.gz").string() +
                     ": the gzip data is corrupt near compressed byte 2 (incorrect header check)");
}

// Zero bytes after the last gzip member (padding to a block size, a preallocated file): gzip -t and zcat take the
// file, and so does the reader now (it was "corrupt near compressed byte N (incorrect header check)"). Data after the
// zeros is still refused, and zeros in place of the first member are no gzip file.
TEST(CompressedInputs, ZeroPaddingAfterTheLastGzipMemberIsTheEnd) {
  const auto dir = testing::tmp_path("gzip-padding");
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "d.jsonl") << R"({"text": "first"})"
                                 << "\n"
                                 << R"({"text": "second"})"
                                 << "\n";
  run("gzip -k " + q(dir / "d.jsonl"));
  const std::string gz = testing::slurp(dir / "d.jsonl.gz");
  for (const size_t zeros : {size_t{1}, size_t{5000}, size_t{3} << 20}) {  // within the 1 MiB window, and past it
    const auto padded = dir / ("padded" + std::to_string(zeros) + ".jsonl.gz");
    std::ofstream(padded, std::ios::binary) << gz << std::string(zeros, '\0');
    run("gzip -t " + q(padded) + " 2>/dev/null");
    EXPECT_EQ(read_documents(padded.string(), {}), (std::vector<std::string>{"first", "second"})) << zeros;
  }
  const auto garbage = dir / "garbage.jsonl.gz";
  std::ofstream(garbage, std::ios::binary) << gz << std::string(100, '\0') << "more";
  const auto err = testing::data_error_of([&] { read_documents(garbage.string(), {}); });
  EXPECT_EQ(err.rfind(garbage.string() + ": the gzip data is corrupt near compressed byte ", 0), 0u) << err;
  const auto zeros_only = dir / "zeros.jsonl.gz";
  std::ofstream(zeros_only, std::ios::binary) << std::string(100, '\0');
  EXPECT_NE(testing::data_error_of([&] { read_documents(zeros_only.string(), {}); }).find("the gzip data is corrupt"),
            std::string::npos);
}

}  // namespace
}  // namespace shardtrain::data
