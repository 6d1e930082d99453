// Parquet inputs: files written by two independent writers (arrow-rs through parquet-wasm, and
// hyparquet-writer; tests/data/write_parquet.mjs) in every codec, data page version and string encoding
// read back exactly, nulls and empty strings included; prepare-data from Parquet gives the dataset JSONL
// gives; and bad files (truncated, not Parquet, mutated bytes, null texts, missing or non-string columns)
// are DataErrors that name the file, never crashes.
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "data_test_util.hpp"
#include "shardtrain/data/bpe_trainer.hpp"
#include "shardtrain/data/parquet.hpp"
#include "shardtrain/data/prepare.hpp"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;
using Texts = std::vector<std::optional<std::string>>;

std::vector<std::string> write_parquet(const Texts& texts, std::vector<nlohmann::json> files) {
  return testing::write_with_node("write_parquet.mjs", ".parquet", texts, std::move(files));
}

Texts read_column(const std::string& path, const std::string& column, ParquetReadStats* stats = nullptr) {
  return testing::read_text_column<ParquetFile>(path, column, stats);
}

size_t pages_matching(const ParquetReadStats& s, const std::string& part) {
  size_t n = 0;
  for (const auto& [kind, count] : s.pages)
    if (kind.find(part) != std::string::npos) n += count;
  return n;
}

std::string describe(const ParquetReadStats& s) {
  std::string out;
  for (const auto& [kind, count] : s.pages) out += fmt::format("{} x{}; ", kind, count);
  return out;
}

TEST(Parquet, EveryCodecPageVersionAndEncodingReadsBackExactly) {
  if (!testing::require_fetched()) return;
  const Texts texts = testing::texts_with_nulls();
  ASSERT_GT(texts.size(), 2000u);
  struct Case {
    nlohmann::json spec;
    std::string column = "text";
    std::vector<std::string> pages;  // kinds of page the file must have made the reader go through
  };
  std::vector<Case> cases;
  // arrow-rs: each codec, data pages v1 and v2, small pages and row groups so that every file has many of
  // both and its dictionaries overflow into the fallback encoding.
  for (const char* codec : {"UNCOMPRESSED", "SNAPPY", "GZIP", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"}) {
    for (int version : {1, 2}) {
      cases.push_back({{{"name", fmt::format("arrow-{}-v{}", codec, version)},
                        {"writer", "arrow-rs"},
                        {"compression", codec},
                        {"version", version},
                        {"row_group_size", 700},
                        {"page_bytes", 16384}},
                       "text",
                       {fmt::format("DICTIONARY_PAGE PLAIN {}", codec),
                        fmt::format("{} RLE_DICTIONARY {}", version == 1 ? "DATA_PAGE" : "DATA_PAGE_V2", codec)}});
    }
  }
  // Without dictionaries: each string encoding, both page versions.
  for (const char* encoding : {"PLAIN", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"}) {
    for (int version : {1, 2}) {
      cases.push_back({{{"name", fmt::format("arrow-{}-v{}", encoding, version)},
                        {"writer", "arrow-rs"},
                        {"compression", "ZSTD"},
                        {"version", version},
                        {"dictionary", false},
                        {"encoding", encoding},
                        {"page_bytes", 32768}},
                       "text",
                       {fmt::format("{} {} ZSTD", version == 1 ? "DATA_PAGE" : "DATA_PAGE_V2", encoding)}});
    }
  }
  // fineweb's layout (the text among other columns) and a text inside a struct.
  cases.push_back({{{"name", "arrow-fineweb"}, {"writer", "arrow-rs"}, {"columns", "fineweb"}, {"row_group_size", 1000}},
                   "text",
                   {"DATA_PAGE RLE_DICTIONARY SNAPPY"}});
  cases.push_back({{{"name", "arrow-nested"}, {"writer", "arrow-rs"}, {"columns", "nested"}, {"version", 2}},
                   "meta.text",
                   {"DATA_PAGE_V2"}});
  // hyparquet-writer: its defaults (snappy, v2 pages), the fineweb layout, uncompressed and delta-encoded.
  cases.push_back({{{"name", "hyparquet"}, {"writer", "hyparquet"}, {"row_group_size", 900}}, "text", {"DATA_PAGE_V2"}});
  cases.push_back({{{"name", "hyparquet-fineweb"}, {"writer", "hyparquet"}, {"columns", "fineweb"}}, "text", {"SNAPPY"}});
  cases.push_back(
      {{{"name", "hyparquet-plain"}, {"writer", "hyparquet"}, {"compression", "UNCOMPRESSED"}, {"encoding", "PLAIN"}},
       "text",
       {"DATA_PAGE_V2 PLAIN UNCOMPRESSED"}});
  cases.push_back({{{"name", "hyparquet-delta"}, {"writer", "hyparquet"}, {"encoding", "DELTA_BYTE_ARRAY"}},
                   "text",
                   {"DATA_PAGE_V2 DELTA_BYTE_ARRAY SNAPPY"}});

  std::vector<nlohmann::json> specs;
  for (const auto& c : cases) specs.push_back(c.spec);
  const auto paths = write_parquet(texts, specs);
  ASSERT_EQ(paths.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].spec.dump());
    ParquetReadStats stats;
    const Texts got = read_column(paths[i], cases[i].column, &stats);
    ASSERT_EQ(got.size(), texts.size());
    size_t wrong = 0;
    for (size_t r = 0; r < texts.size(); ++r) {
      if (got[r] != texts[r] && wrong++ < 3) {
        ADD_FAILURE() << "row " << r << " differs";
      }
    }
    EXPECT_EQ(wrong, 0u);
    for (const auto& kind : cases[i].pages)
      EXPECT_GT(pages_matching(stats, kind), 0u) << kind << " not among " << describe(stats);
    std::printf("%-28s %zu row groups: %s\n", cases[i].spec["name"].get<std::string>().c_str(),
                ParquetFile::open(paths[i]).num_row_groups(), describe(stats).c_str());
    EXPECT_EQ(ParquetFile::open(paths[i]).num_rows(), static_cast<int64_t>(texts.size()));
    if (cases[i].spec.contains("row_group_size")) {
      EXPECT_GT(ParquetFile::open(paths[i]).num_row_groups(), 1u);
    }
  }
}

TEST(Parquet, PrepareDataFromParquetEqualsJsonl) {
  if (!testing::require_fetched()) return;
  // The default corpus, as JSONL and as a fineweb-layout Parquet file of several row groups.
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  Texts texts;
  const auto jsonl = testing::tmp_path("sotu.jsonl");
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (const auto& f : sotu) {
      texts.emplace_back(testing::slurp(f));
      out << nlohmann::json{{"text", *texts.back()}}.dump() << "\n";
    }
  }
  const auto paths =
      write_parquet(texts, {{{"name", "sotu"}, {"writer", "arrow-rs"}, {"columns", "fineweb"}, {"row_group_size", 50}}});
  ASSERT_EQ(paths.size(), 1u);
  const auto [from_jsonl, a] = testing::prepare_r50k({jsonl.string()}, "sotu-jsonl.h5", size_t{1} << 20);  // several batches
  const auto [from_parquet, b] = testing::prepare_r50k({paths[0]}, "sotu-parquet.h5", size_t{1} << 20);
  EXPECT_EQ(from_parquet.documents, sotu.size());
  EXPECT_EQ(from_parquet.tokens, from_jsonl.tokens);
  EXPECT_EQ(from_parquet.bytes, from_jsonl.bytes);
  EXPECT_GT(from_parquet.tokens, 2'000'000u);
  testing::expect_same_documents(a, b);
  EXPECT_EQ(b.info().sources, std::vector<std::string>{paths[0]});
  // The progress estimate: what the text column decompresses to, a little over the text itself.
  const uint64_t estimate = document_bytes_estimate(paths[0], {});
  EXPECT_GE(estimate, from_parquet.bytes);
  EXPECT_LT(static_cast<double>(estimate), 1.05 * static_cast<double>(from_parquet.bytes));
}

TEST(Parquet, NullsMissingColumnsAndWrongTypesNameTheFile) {
  if (!testing::require_fetched()) return;
  const auto paths = write_parquet({"one", "two", std::nullopt, "four"},
                                   {{{"name", "with-null"}, {"writer", "arrow-rs"}, {"columns", "fineweb"}}});
  ASSERT_EQ(paths.size(), 1u);
  const auto& p = paths[0];
  const DocumentOptions options;  // auto: *.parquet is Parquet, column "text"
  std::vector<std::string> seen;
  const auto null_error =
      testing::data_error_of([&] { for_each_document(p, options, [&](std::string&& d) { seen.push_back(d); }); });
  EXPECT_EQ(null_error, p + ": row 2: column \"text\" is null (every row needs a text)");
  EXPECT_EQ(seen, (std::vector<std::string>{"one", "two"}));

  DocumentOptions missing;
  missing.text_field = "content";
  EXPECT_EQ(
      testing::data_error_of([&] { read_documents(p, missing); }),
      p + ": no column \"content\" (its columns: id, text, url, language_score, token_count; --text-field picks another)");
  DocumentOptions numbers;
  numbers.text_field = "token_count";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(p, numbers); }),
            p + ": column \"token_count\" holds INT64, not strings (BYTE_ARRAY)");
  const auto file = ParquetFile::open(p);
  ASSERT_EQ(file.columns().size(), 5u);
  EXPECT_EQ(file.columns()[1].max_definition_level, 1);
  EXPECT_NE(file.created_by().find("parquet-rs"), std::string::npos) << file.created_by();

  // --format parquet on a file of another name; and a file that is not Parquet.
  const auto renamed = testing::tmp_path("fineweb-shard.bin");
  fs::copy_file(p, renamed, fs::copy_options::overwrite_existing);
  DocumentOptions forced;
  forced.format = parse_input_format("parquet");
  forced.text_field = "id";
  EXPECT_EQ(read_documents(renamed.string(), forced).size(), 4u);
  const auto text_file = testing::tmp_path("notes.parquet");
  std::ofstream(text_file) << "just some text, long enough to have a footer";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(text_file.string(), options); }),
            text_file.string() + ": not a Parquet file (44 bytes; a Parquet file starts and ends with \"PAR1\")");
  const auto empty = testing::tmp_path("empty.parquet");
  std::ofstream(empty).flush();
  EXPECT_EQ(testing::data_error_of([&] { read_documents(empty.string(), options); }),
            empty.string() + ": input file is empty");
}

TEST(Parquet, TruncatedAndMutatedFilesAreDataErrors) {
  if (!testing::require_fetched()) return;
  Texts texts;
  for (const auto& t : testing::real_texts(60'000)) texts.emplace_back(t.substr(0, 3000));
  texts.emplace_back(std::nullopt);
  const auto paths = write_parquet(texts, {{{"name", "m-snappy-v1"}, {"writer", "arrow-rs"}, {"page_bytes", 4096}},
                                           {{"name", "m-zstd-v2"},
                                            {"writer", "arrow-rs"},
                                            {"compression", "ZSTD"},
                                            {"version", 2},
                                            {"dictionary", false},
                                            {"encoding", "DELTA_BYTE_ARRAY"},
                                            {"page_bytes", 4096}},
                                           {{"name", "m-hyparquet"}, {"writer", "hyparquet"}, {"page_bytes", 4096}}});
  ASSERT_EQ(paths.size(), 3u);
  for (const auto& p : paths) {
    SCOPED_TRACE(p);
    const std::string good = testing::slurp(p);
    const auto path = testing::tmp_path("mutated.parquet").string();
    const auto read = [](const std::string& file) { read_column(file, "text"); };
    // Cut short anywhere: always an error naming the file.
    for (size_t keep : {good.size() - 1, good.size() - 9, good.size() / 2, size_t{100}, size_t{4}}) {
      const auto err = testing::read_error(path, good.substr(0, keep), read);
      EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << "kept " << keep << ": " << err;
    }
    // A footer length past the start of the file.
    std::string long_footer = good;
    const uint32_t huge = static_cast<uint32_t>(good.size());
    std::memcpy(long_footer.data() + good.size() - 8, &huge, 4);
    EXPECT_NE(testing::read_error(path, long_footer, read).find("its footer claims"), std::string::npos);
    // Random bytes changed anywhere: a DataError or a read that ends (a changed letter is still text), and
    // the footer and page headers, where most changes land in lengths and offsets, mostly errors.
    const size_t errors = testing::mutations_refused(p, path, 12345, read, [](std::mt19937_64& rng, size_t size, int trial) {
      return trial % 2 == 0 ? rng() % size : size - 1 - rng() % std::min<size_t>(size, 600);
    });
    EXPECT_GT(errors, 300u);
  }
}

TEST(Parquet, FoldersLeaveOutHiddenFilesAndFollowTheHubCachesLinks) {
  if (!testing::require_fetched()) return;
  // The layout a Hub download leaves: the data, and .cache/ beside it with the download's metadata.
  const auto dir = testing::tmp_path("hub-download");
  fs::remove_all(dir);
  fs::create_directories(dir / "sample" / "10BT");
  fs::create_directories(dir / ".cache" / "huggingface" / "download" / "sample" / "10BT");
  std::ofstream(dir / ".cache" / "huggingface" / "download" / "sample" / "10BT" / "000_00000.parquet.metadata")
      << "abc\n123\n";
  std::ofstream(dir / ".gitattributes") << "*.parquet filter=lfs\n";
  const Texts texts = {"first document", "second document"};
  const auto paths = write_parquet(texts, {{{"name", "shard0"}, {"writer", "arrow-rs"}}});
  ASSERT_EQ(paths.size(), 1u);
  fs::copy_file(paths[0], dir / "sample" / "10BT" / "000_00000.parquet");
  const auto files = expand_inputs({dir.string()});
  EXPECT_EQ(files, std::vector<std::string>{(dir / "sample" / "10BT" / "000_00000.parquet").string()});
  // A hidden file named on its own is read.
  EXPECT_EQ(expand_inputs({(dir / ".gitattributes").string()}).size(), 1u);
  EXPECT_EQ(read_documents(files[0], {}), (std::vector<std::string>{"first document", "second document"}));

  // The Hub's cache (~/.cache/huggingface/hub) keeps a snapshot's files as links to content-named blobs: the
  // links are read, by their names, and the blobs beside them are not (they sit in another folder).
  const auto hub = testing::tmp_path("hub-cache") / "datasets--HuggingFaceFW--fineweb";
  fs::remove_all(hub);
  fs::create_directories(hub / "blobs");
  fs::create_directories(hub / "snapshots" / "0123abcd" / "sample" / "10BT");
  fs::copy_file(paths[0], hub / "blobs" / "9f2c4e");
  fs::create_symlink("../../../../blobs/9f2c4e", hub / "snapshots" / "0123abcd" / "sample" / "10BT" / "000_00000.parquet");
  const auto linked = expand_inputs({(hub / "snapshots" / "0123abcd").string()});
  ASSERT_EQ(linked,
            std::vector<std::string>{(hub / "snapshots" / "0123abcd" / "sample" / "10BT" / "000_00000.parquet").string()});
  EXPECT_EQ(read_documents(linked[0], {}), (std::vector<std::string>{"first document", "second document"}));
}

TEST(Parquet, TokenizerTrainsOnParquetAsOnJsonl) {
  if (!testing::require_fetched()) return;
  Texts texts;
  const auto jsonl = testing::tmp_path("moby.jsonl");
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (const auto& f : testing::sorted_files(testing::fetched_dir() / "corpus" / "moby-dick", ".txt")) {
      texts.emplace_back(testing::slurp(f));
      out << nlohmann::json{{"text", *texts.back()}}.dump() << "\n";
    }
  }
  const auto paths = write_parquet(texts, {{{"name", "moby"}, {"writer", "hyparquet"}, {"row_group_size", 40}}});
  ASSERT_EQ(paths.size(), 1u);
  BpeTrainOptions o;
  o.vocab_size = 1024;
  o.progress = ProgressStyle::Off;
  const auto from_jsonl = train_bpe({jsonl.string()}, o);
  const auto from_parquet = train_bpe({paths[0]}, o);
  EXPECT_EQ(from_parquet.input_bytes, from_jsonl.input_bytes);
  EXPECT_GT(from_parquet.input_bytes, 1'000'000u);
  EXPECT_EQ(from_parquet.merges, 1024u - 259u);
  EXPECT_EQ(from_parquet.tokenizer_json, from_jsonl.tokenizer_json);
}

// A tokenized dataset's input_ids (List<Int32> and List<Int64>, arrow-rs): dictionary, PLAIN and DELTA_BINARY_PACKED
// (arrow-rs's v2 choice without a dictionary), data pages v1 and v2, pages of a few KiB (rows over several
// pages), several row groups, empty lists; read back row for row, and imported by prepare-data --token-field as
// the JSONL of the same ids is. A null row and a null inside a list are refused naming the file and the row.
TEST(Parquet, TokenIdListsReadBackRowForRow) {
  if (!testing::require_fetched()) return;
  std::mt19937 rng(7);
  std::vector<std::vector<int64_t>> rows;
  nlohmann::json data;
  data["texts"] = nlohmann::json::array();
  const auto jsonl = testing::tmp_path("ids.jsonl");
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (int i = 0; i < 700; ++i) {
      std::vector<int64_t> r(i % 50 == 3 ? 0 : rng() % 300);  // every 50th row empty, and a few others
      for (auto& v : r) v = static_cast<int64_t>(rng() % 50257);
      if (i == 5) r = {0, 50256, 0};
      rows.push_back(r);
      data["texts"].push_back(fmt::format("row {}", i));
      out << nlohmann::json{{"input_ids", r}}.dump() << "\n";
    }
  }
  data["ids"] = rows;
  const std::vector<nlohmann::json> specs = {
      {{"name", "ids-dictionary-v1"}, {"writer", "arrow-rs"}, {"columns", "ids"}},
      {{"name", "ids-plain-v2-zstd"},
       {"writer", "arrow-rs"},
       {"columns", "ids"},
       {"dictionary", false},
       {"version", 2},
       {"compression", "ZSTD"},
       {"page_bytes", 4096},
       {"row_group_size", 250}},
      {{"name", "ids-plain-v1"},
       {"writer", "arrow-rs"},
       {"columns", "ids"},
       {"dictionary", false},
       {"compression", "UNCOMPRESSED"},
       {"page_bytes", 2048}},
      {{"name", "ids64-v2"}, {"writer", "arrow-rs"}, {"columns", "ids64"}, {"version", 2}, {"page_bytes", 4096}},
  };
  const auto paths = testing::write_with_node("write_parquet.mjs", ".parquet", data, specs);
  ASSERT_EQ(paths.size(), specs.size());
  DocumentOptions ids;
  ids.token_field = "input_ids";
  ids.vocab_size = 50257;
  const auto [want, reference] = testing::prepare_r50k({jsonl.string()}, "ids-jsonl.h5", size_t{1} << 20, 0.05, "input_ids");
  const auto empty = static_cast<uint64_t>(std::count_if(rows.begin(), rows.end(), [](const auto& r) { return r.empty(); }));
  EXPECT_GE(empty, 14u);
  EXPECT_EQ(want.documents, rows.size() - empty);  // empty rows are skipped
  for (size_t k = 0; k < paths.size(); ++k) {
    SCOPED_TRACE(paths[k]);
    const auto file = ParquetFile::open(paths[k]);
    const auto& column = file.id_list_column("input_ids");
    EXPECT_EQ(column.path, "input_ids.list.item");
    EXPECT_EQ(column.max_repetition_level, 1);
    EXPECT_EQ(column.max_definition_level, 3);
    EXPECT_EQ(column.repeated_definition_level, 2);
    ParquetReadStats stats;
    std::vector<std::vector<int64_t>> got;
    file.for_each_id_list(
        column,
        [&](std::optional<std::span<const int64_t>> r) {
          ASSERT_TRUE(r.has_value());
          got.emplace_back(r->begin(), r->end());
        },
        &stats);
    EXPECT_EQ(got, rows);
    std::string kinds;
    for (const auto& [kind, count] : stats.pages) kinds += fmt::format("{} x{}; ", kind, count);
    const bool v2 = k == 1 || k == 3;
    EXPECT_NE(kinds.find(v2 ? "DATA_PAGE_V2" : "DATA_PAGE "), std::string::npos) << kinds;
    if (k == 0) {
      EXPECT_NE(kinds.find("RLE_DICTIONARY"), std::string::npos) << kinds;
    }
    if (k == 1) {
      EXPECT_NE(kinds.find("DATA_PAGE_V2 DELTA_BINARY_PACKED ZSTD"), std::string::npos) << kinds;
    }
    if (k == 2) {
      EXPECT_NE(kinds.find("DATA_PAGE PLAIN UNCOMPRESSED"), std::string::npos) << kinds;
    }
    if (k != 0) {  // small pages
      EXPECT_GT(stats.pages.begin()->second + std::prev(stats.pages.end())->second, 4u) << kinds;
    }
    EXPECT_EQ(document_bytes_estimate(paths[k], ids), 4 * (want.tokens + empty));  // ids, and the empty rows' one level
    const auto [summary, dataset] =
        testing::prepare_r50k({paths[k]}, fmt::format("ids-{}.h5", k), size_t{1} << 20, 0.05, "input_ids");
    EXPECT_EQ(summary.documents, want.documents);
    EXPECT_EQ(summary.tokens, want.tokens);
    testing::expect_same_documents(reference, dataset);
  }
  // The text column is not ids, the ids are not text: each says which option reads it.
  const auto& p = paths[0];
  DocumentOptions text_field;
  text_field.text_field = "input_ids";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(p, text_field); }),
            p + ": column \"input_ids\" is a list of integers (INT32), not strings; it holds token ids: --token-field "
                "input_ids imports them");
  DocumentOptions wrong = ids;
  wrong.token_field = "text";
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(p, wrong, [](RawDocument&&) {}); }),
            p + ": column \"text\" (text) is one BYTE_ARRAY per row, not a list of integers (token ids)");
  wrong.token_field = "ids";
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(p, wrong, [](RawDocument&&) {}); }),
            p + ": no column \"ids\" (its columns: text, input_ids.list.item; --token-field picks another)");

  // A null row, a null id inside a list.
  nlohmann::json bad;
  bad["texts"] = {"a", "b", "c"};
  bad["ids"] = nlohmann::json::parse("[[1, 2], null, [3]]");
  const auto null_row = testing::write_with_node("write_parquet.mjs", ".parquet", bad,
                                                 {{{"name", "ids-null-row"}, {"writer", "arrow-rs"}, {"columns", "ids"}}});
  bad["ids"] = nlohmann::json::parse("[[1, 2], [3, null, 4], [5]]");
  const auto null_id = testing::write_with_node("write_parquet.mjs", ".parquet", bad,
                                                {{{"name", "ids-null-id"}, {"writer", "arrow-rs"}, {"columns", "ids"}}});
  ASSERT_EQ(null_row.size() + null_id.size(), 2u);
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(null_row[0], ids, [](RawDocument&&) {}); }),
            null_row[0] + ": row 1: column \"input_ids\" is null (every row needs its ids)");
  const auto null_id_error = testing::data_error_of([&] { for_each_raw_document(null_id[0], ids, [](RawDocument&&) {}); });
  EXPECT_EQ(null_id_error.rfind(null_id[0] + ": row group 0, column \"input_ids.list.item\", page at byte ", 0), 0u)
      << null_id_error;
  EXPECT_TRUE(null_id_error.ends_with(": row 1 holds a null inside its list of ids")) << null_id_error;
}

}  // namespace
}  // namespace shardtrain::data
