// Arrow IPC inputs: streams and files written by two independent writers (the Arrow JavaScript library, and
// arrow-rs through parquet-wasm; tests/data/write_arrow.mjs) in every string layout (Utf8, LargeUtf8, Utf8View,
// Binary, dictionary-encoded, inside a struct) read back exactly, nulls and empty strings included; a
// `save_to_disk` folder is read as its state.json lists it and prepares the dataset JSONL gives; and bad files
// and folders are DataErrors that name them, never crashes. Compressed bodies (LZ4 frames, zstd), which these
// writers do not make, are read in tests/torch/arrow_pyarrow_test.py from pyarrow's files.
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "data_test_util.hpp"
#include "shardtrain/data/arrow_ipc.hpp"
#include "shardtrain/data/documents.hpp"
#include "shardtrain/data/prepare.hpp"
#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {
namespace {

namespace fs = std::filesystem;
using Texts = std::vector<std::optional<std::string>>;

std::vector<std::string> write_arrow(const Texts& texts, std::vector<nlohmann::json> files) {
  return testing::write_with_node("write_arrow.mjs", ".arrow", texts, std::move(files));
}

Texts read_column(const std::string& path, const std::string& column, ArrowReadStats* stats = nullptr) {
  return testing::read_text_column<ArrowIpcFile>(path, column, stats);
}

size_t count(const ArrowReadStats& s, const std::string& kind) {
  const auto it = s.counts.find(kind);
  return it == s.counts.end() ? 0 : it->second;
}

TEST(Arrow, EveryLayoutAndWriterReadsBackExactly) {
  if (!testing::require_fetched()) return;
  const Texts texts = testing::texts_with_nulls();
  ASSERT_GT(texts.size(), 2000u);
  const size_t n = texts.size();
  struct Case {
    nlohmann::json spec;
    std::string type;  // as the reader names the column's type
    bool file_format = false;
    size_t batch_rows = 0;  // 0: one batch
    bool dictionary = false;
  };
  const std::vector<Case> cases = {
      {{{"name", "js-stream-utf8"}, {"batch_rows", 500}}, "Utf8", false, 500},
      {{{"name", "js-file-utf8"}, {"format", "file"}, {"batch_rows", 700}}, "Utf8", true, 700},
      {{{"name", "js-large"}, {"type", "LargeUtf8"}, {"batch_rows", 900}}, "LargeUtf8", false, 900},
      {{{"name", "js-view"}, {"type", "Utf8View"}, {"batch_rows", 800}}, "Utf8View", false, 800},
      {{{"name", "js-binary"}, {"type", "Binary"}}, "Binary", false, 0},
      {{{"name", "js-dict-stream"}, {"type", "Dictionary"}, {"batch_rows", 600}},
       "Dictionary<Int32, Utf8>",
       false,
       600,
       true},
      {{{"name", "js-dict-file"}, {"type", "Dictionary"}, {"format", "file"}}, "Dictionary<Int32, Utf8>", true, 0, true},
      {{{"name", "js-nested"}, {"columns", "nested"}, {"batch_rows", 1000}}, "Utf8", false, 1000},
      {{{"name", "js-fineweb-file"}, {"columns", "fineweb"}, {"format", "file"}, {"batch_rows", 1000}}, "Utf8", true, 1000},
      {{{"name", "rs-utf8"}, {"writer", "arrow-rs"}, {"batch_rows", 1000}}, "Utf8", false, 1000},
      {{{"name", "rs-view"}, {"writer", "arrow-rs"}, {"type", "Utf8View"}, {"batch_rows", 1000}}, "Utf8View", false, 1000},
      {{{"name", "rs-dict"}, {"writer", "arrow-rs"}, {"type", "Dictionary"}, {"batch_rows", 1000}},
       "Dictionary<Int32, Utf8>",
       false,
       1000,
       true},
      {{{"name", "rs-fineweb"}, {"writer", "arrow-rs"}, {"columns", "fineweb"}, {"batch_rows", 1000}}, "Utf8", false, 1000},
  };
  std::vector<nlohmann::json> specs;
  for (const auto& c : cases) specs.push_back(c.spec);
  const auto paths = write_arrow(texts, specs);
  ASSERT_EQ(paths.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(paths[i]);
    const bool nested = c.spec.value("columns", "") == "nested";
    const std::string column = nested ? "meta.text" : "text";
    const auto file = ArrowIpcFile::open(paths[i]);
    EXPECT_EQ(file.file_format(), c.file_format);
    EXPECT_EQ(file.num_rows(), static_cast<int64_t>(n));
    const size_t batches = c.batch_rows == 0 ? 1 : (n + c.batch_rows - 1) / c.batch_rows;
    EXPECT_EQ(file.num_record_batches(), batches);
    EXPECT_EQ(file.string_column(column).type, c.type);
    ArrowReadStats stats;
    const Texts back = read_column(paths[i], column, &stats);
    ASSERT_EQ(back.size(), n);
    for (size_t r = 0; r < n; ++r) ASSERT_EQ(back[r], texts[r]) << "row " << r;
    EXPECT_EQ(count(stats, "record batches"), batches);
    // A dictionary per batch in a stream (each replacing the last), or one for the whole file.
    if (c.dictionary) EXPECT_EQ(count(stats, "dictionary batches") + count(stats, "delta dictionary batches"), batches);
    else EXPECT_EQ(count(stats, "dictionary batches"), 0u);
    if (!c.dictionary) {  // the estimate: the strings' bytes, a little over the text itself (views: 16 per row more)
      uint64_t bytes = 0;
      for (const auto& t : texts) bytes += t ? t->size() : 0;
      const uint64_t estimate = file.string_bytes_estimate(file.string_column(column));
      EXPECT_GE(estimate, bytes);
      EXPECT_LT(static_cast<double>(estimate), 1.05 * static_cast<double>(bytes) + 17.0 * static_cast<double>(n));
    }
  }
  // The fineweb layout's other columns, as the reader names them.
  const auto fineweb = ArrowIpcFile::open(paths.back());
  std::vector<std::string> names;
  for (const auto& col : fineweb.columns()) names.push_back(col.path + " " + col.type);
  EXPECT_EQ(names, (std::vector<std::string>{"id Utf8", "kept Bool", "tags List<Utf8>", "tags.item Utf8", "text Utf8",
                                             "url Utf8", "language_score FloatingPoint", "token_count Int64"}));
  // The columns after the boolean and the list read (text above, url here): their buffers were stepped over
  // exactly.
  const auto urls = read_column(paths.back(), "url");
  ASSERT_EQ(urls.size(), n);
  EXPECT_EQ(urls[1234], "https://example.org/page/1234");
}

// Token ids of real text: the default corpus's first addresses tokenized by GPT-2's tokenizer, a document per
// address, with an empty one.
std::vector<std::vector<TokenId>> corpus_ids(size_t documents) {
  const auto tokenizer = Tokenizer::load((testing::fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string());
  std::vector<std::vector<TokenId>> out;
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  for (size_t i = 0; i < documents && i < sotu.size(); ++i) out.push_back(tokenizer.encode(testing::slurp(sotu[i])));
  out.insert(out.begin() + 3, std::vector<TokenId>{});
  return out;
}

std::vector<std::string> write_ids(const std::vector<std::optional<std::vector<TokenId>>>& ids,
                                   std::vector<nlohmann::json> files) {
  nlohmann::json data = {{"texts", nlohmann::json::array()}, {"ids", nlohmann::json::array()}};
  for (const auto& r : ids) data["ids"].push_back(r ? nlohmann::json(*r) : nlohmann::json(nullptr));
  for (auto& f : files) f["columns"] = "tokens";
  return testing::write_with_node("write_arrow.mjs", ".arrow", std::move(data), std::move(files));
}

TEST(Arrow, PreTokenizedDatasetsImportTheirIds) {
  if (!testing::require_fetched()) return;
  const auto docs = corpus_ids(40);
  std::vector<std::optional<std::vector<TokenId>>> rows(docs.begin(), docs.end());
  // Blocks of 256 ids, as group_texts makes them for a FixedSizeList (every row the same length).
  std::vector<std::optional<std::vector<TokenId>>> blocks;
  for (size_t k = 0; k + 256 <= docs[0].size(); k += 256)
    blocks.emplace_back(std::vector<TokenId>(docs[0].begin() + k, docs[0].begin() + k + 256));
  const auto paths =
      write_ids(rows, {{{"name", "ids-list32"}, {"type", "List<Int32>"}, {"batch_rows", 7}},
                       {{"name", "ids-list16"}, {"type", "List<UInt16>"}, {"batch_rows", 9}},
                       {{"name", "ids-large64-file"}, {"type", "LargeList<Int64>"}, {"format", "file"}},
                       {{"name", "ids-rs"}, {"type", "List<Int32>"}, {"writer", "arrow-rs"}, {"batch_rows", 10}}});
  const auto fixed = write_ids(blocks, {{{"name", "ids-fixed"}, {"type", "FixedSizeList<Int32>"}, {"batch_rows", 5}}});
  ASSERT_EQ(paths.size() + fixed.size(), 5u);
  const auto jsonl = testing::tmp_path("ids.jsonl");
  {
    std::ofstream out(jsonl);
    for (const auto& d : docs)
      out << nlohmann::json{{"input_ids", d}, {"attention_mask", std::vector<int>(d.size(), 1)}}.dump() << "\n";
  }
  // Read back: every row's ids, in every list layout.
  for (const auto& p : paths) {
    SCOPED_TRACE(p);
    const auto file = ArrowIpcFile::open(p);
    const auto& column = file.id_list_column("input_ids");
    size_t r = 0, values = 0;
    file.for_each_id_list(column, [&](std::optional<std::span<const int64_t>> ids) {
      ASSERT_TRUE(ids);
      ASSERT_LT(r, docs.size());
      EXPECT_TRUE(std::equal(ids->begin(), ids->end(), docs[r].begin(), docs[r].end())) << "row " << r;
      values += ids->size();
      ++r;
    });
    EXPECT_EQ(r, docs.size());
    EXPECT_EQ(file.id_count_estimate(column), values);
  }
  EXPECT_EQ(ArrowIpcFile::open(paths[1]).id_list_column("input_ids").type, "List<UInt16>");
  EXPECT_EQ(ArrowIpcFile::open(paths[2]).id_list_column("input_ids").type, "LargeList<Int64>");
  EXPECT_EQ(ArrowIpcFile::open(fixed[0]).id_list_column("input_ids").type, "FixedSizeList<Int32>");

  // prepare-data imports them: the dataset of the text itself, tokenized by prepare-data, id for id.
  auto prepare = [&](const std::vector<std::string>& inputs, const std::string& name, const std::string& token_field) {
    return testing::prepare_r50k(inputs, name, 64 << 10, 0.05, token_field);  // several batches
  };
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  std::vector<std::string> texts;
  for (size_t i = 0; i < 40; ++i) texts.push_back(sotu[i].string());
  const auto [from_text, reference] = prepare(texts, "ids-text.h5", "");
  for (const auto& input : {paths[0], paths[1], paths[2], paths[3], jsonl.string()}) {
    SCOPED_TRACE(input);
    const auto [summary, ds] = prepare({input}, "ids-imported.h5", "input_ids");
    EXPECT_EQ(summary.documents, 40u);
    EXPECT_EQ(summary.empty_documents_skipped, 1u);
    EXPECT_EQ(summary.tokens, from_text.tokens);
    testing::expect_same_documents(ds, reference);
  }
  const auto [blocks_summary, blocks_ds] = prepare({fixed[0]}, "ids-blocks.h5", "input_ids");
  EXPECT_EQ(blocks_summary.documents, blocks.size());
  EXPECT_EQ(blocks_summary.tokens, 256 * blocks.size());
}

TEST(Arrow, PreTokenizedInputsRefuseWhatTheyCannotImport) {
  if (!testing::require_fetched()) return;
  std::vector<std::optional<std::vector<TokenId>>> rows = {std::vector<TokenId>{1, 2, 3},
                                                           std::vector<TokenId>{50256, 50257}};
  const auto over = write_ids(rows, {{{"name", "ids-over"}, {"type", "List<Int32>"}}});
  rows[1] = std::nullopt;
  const auto null_row = write_ids(rows, {{{"name", "ids-null"}, {"type", "List<Int32>"}}});
  ASSERT_EQ(over.size() + null_row.size(), 2u);
  DocumentOptions o;
  o.token_field = "input_ids";
  o.vocab_size = 50257;  // r50k_base
  const auto ids_of = [&](const std::string& path) {
    std::vector<std::vector<TokenId>> out;
    for_each_raw_document(path, o, [&](RawDocument&& raw) { out.push_back(document_ids(std::move(raw), path, o)); });
    return out;
  };
  EXPECT_EQ(
      testing::data_error_of([&] { ids_of(over[0]); }),
      over[0] +
          ": row 1: id 50257 at position 1 of column \"input_ids\" is outside the tokenizer's vocabulary (0 to 50256)");
  EXPECT_EQ(testing::data_error_of([&] { ids_of(null_row[0]); }),
            null_row[0] + ": row 1: column \"input_ids\" is null (every row needs its ids)");
  DocumentOptions mask = o;
  mask.token_field = "labels";
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(over[0], mask, [](RawDocument&&) {}); }),
            over[0] +
                ": no column \"labels\" (its columns: input_ids, input_ids.item, attention_mask, attention_mask.item; "
                "--token-field picks another)");
  EXPECT_EQ(testing::data_error_of([&] { read_documents(over[0], {}); }),
            over[0] +
                ": no column \"text\" (its columns: input_ids, input_ids.item, attention_mask, attention_mask.item; "
                "--text-field picks another; it holds token ids: --token-field input_ids imports them)");
  const auto text = write_arrow({"some text"}, {{{"name", "ids-text-column"}}});
  ASSERT_EQ(text.size(), 1u);
  DocumentOptions on_text = o;
  on_text.token_field = "text";
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(text[0], on_text, [](RawDocument&&) {}); }),
            text[0] + ": column \"text\" holds Utf8, not lists of integers (token ids)");

  // JSONL: each line's field checked on the tokenizing side, named by line.
  const auto jsonl = testing::tmp_path("ids-bad.jsonl");
  std::ofstream(jsonl) << R"({"input_ids": [1, 2]})"
                       << "\n"
                       << R"({"input_ids": [3, -4]})"
                       << "\n"
                       << R"({"input_ids": "5 6"})"
                       << "\n"
                       << R"({"ids": [1]})"
                       << "\n"
                       << R"({"input_ids": [1.5]})"
                       << "\n";
  std::vector<std::string> errors;
  uint64_t lines = 0;
  for_each_raw_document(jsonl.string(), o, [&](RawDocument&& raw) {
    ++lines;
    errors.push_back(testing::data_error_of([&] { document_ids(std::move(raw), jsonl.string(), o); }));
  });
  ASSERT_EQ(lines, 5u);
  EXPECT_EQ(errors[0], "no DataError");
  EXPECT_EQ(errors[1],
            jsonl.string() +
                ":2: value -4 at position 1 of \"input_ids\" is not a token id of the tokenizer's vocabulary (0 to 50256)");
  EXPECT_EQ(errors[2], jsonl.string() + ":3: field \"input_ids\" is not an array of token ids");
  EXPECT_EQ(errors[3].rfind(jsonl.string() + ":4: field \"input_ids\" is missing", 0), 0u) << errors[3];
  EXPECT_EQ(errors[4].rfind(jsonl.string() + ":5: value 1.5 at position 0", 0), 0u) << errors[4];

  // Text inputs have no token column; a Parquet input is read as Parquet (a cut-short one is refused as such).
  const auto txt = testing::tmp_path("ids.txt");
  std::ofstream(txt) << "1 2 3";
  EXPECT_EQ(testing::data_error_of([&] { for_each_raw_document(txt.string(), o, [](RawDocument&&) {}); }),
            txt.string() + ": --token-field reads JSONL, Arrow and Parquet inputs, and this is text");
  const auto pq = testing::tmp_path("ids.parquet");
  std::ofstream(pq) << "PAR1";
  EXPECT_NE(testing::data_error_of([&] {
              for_each_raw_document(pq.string(), o, [](RawDocument&&) {});
            }).find("not a Parquet file (4 bytes"),
            std::string::npos);
  // The same from prepare-data, which estimates every input's size first.
  EXPECT_NE(testing::data_error_of([&] {
              testing::prepare_r50k({pq.string()}, "ids-parquet.h5", 1 << 20, 0.05, "input_ids");
            }).find("not a Parquet file (4 bytes"),
            std::string::npos);
}

// A folder as datasets' save_to_disk writes it: the Arrow files, state.json listing them, dataset_info.json.
fs::path save_to_disk_folder(const std::string& name, const std::vector<std::string>& files,
                             const std::vector<std::string>& listed) {
  const auto dir = testing::tmp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (size_t i = 0; i < files.size(); ++i)
    fs::copy_file(files[i], dir / fmt::format("data-{:05d}-of-{:05d}.arrow", i, files.size()));
  nlohmann::json state = {{"_fingerprint", "0123456789abcdef"},
                          {"_format_columns", nullptr},
                          {"_format_kwargs", nlohmann::json::object()},
                          {"_format_type", nullptr},
                          {"_output_all_columns", false},
                          {"_split", "train"}};
  state["_data_files"] = nlohmann::json::array();
  for (const auto& l : listed) state["_data_files"].push_back({{"filename", l}});
  std::ofstream(dir / "state.json") << state.dump(2);
  std::ofstream(dir / "dataset_info.json")
      << R"({"citation": "", "description": "", "features": {"text": {"dtype": "string", "_type": "Value"}}})";
  return dir;
}

TEST(Arrow, PrepareDataFromASaveToDiskFolderEqualsJsonl) {
  if (!testing::require_fetched()) return;
  // The default corpus as JSONL, and as a save_to_disk folder of two Arrow streams of fineweb's layout.
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  Texts first, second;
  const auto jsonl = testing::tmp_path("sotu.jsonl");
  {
    std::ofstream out(jsonl, std::ios::binary);
    for (size_t i = 0; i < sotu.size(); ++i) {
      (i < 150 ? first : second).emplace_back(testing::slurp(sotu[i]));
      out << nlohmann::json{{"text", testing::slurp(sotu[i])}}.dump() << "\n";
    }
  }
  const auto a =
      write_arrow(first, {{{"name", "sotu-0"}, {"writer", "arrow-rs"}, {"columns", "fineweb"}, {"batch_rows", 40}}});
  const auto b =
      write_arrow(second, {{{"name", "sotu-1"}, {"writer", "arrow-js"}, {"columns", "fineweb"}, {"batch_rows", 40}}});
  ASSERT_EQ(a.size() + b.size(), 2u);
  const auto dir =
      save_to_disk_folder("sotu-saved", {a[0], b[0]}, {"data-00000-of-00002.arrow", "data-00001-of-00002.arrow"});
  const auto [from_jsonl, x] = testing::prepare_r50k({jsonl.string()}, "sotu-jsonl.h5", size_t{1} << 20);  // several batches
  const auto [from_arrow, y] = testing::prepare_r50k({dir.string()}, "sotu-arrow.h5", size_t{1} << 20);
  EXPECT_EQ(from_arrow.documents, sotu.size());
  EXPECT_EQ(from_arrow.tokens, from_jsonl.tokens);
  EXPECT_GT(from_arrow.tokens, 2'000'000u);
  testing::expect_same_documents(x, y);
  EXPECT_EQ(y.info().sources, (std::vector<std::string>{(dir / "data-00000-of-00002.arrow").string(),
                                                        (dir / "data-00001-of-00002.arrow").string()}));
}

TEST(Arrow, FoldersOfTheDatasetsLibrary) {
  if (!testing::require_fetched()) return;
  const auto one = write_arrow({"one", "two"}, {{{"name", "part-a"}}});
  const auto two = write_arrow({"three"}, {{{"name", "part-b"}}});
  ASSERT_EQ(one.size() + two.size(), 2u);
  // state.json's order is the dataset's, whatever the names' order.
  const auto dir =
      save_to_disk_folder("saved", {one[0], two[0]}, {"data-00001-of-00002.arrow", "data-00000-of-00002.arrow"});
  const auto files = expand_inputs({dir.string()});
  ASSERT_EQ(files, (std::vector<std::string>{(dir / "data-00001-of-00002.arrow").string(),
                                             (dir / "data-00000-of-00002.arrow").string()}));
  std::vector<std::string> docs;
  for (const auto& f : files)
    for (auto& d : read_documents(f, {})) docs.push_back(std::move(d));
  EXPECT_EQ(docs, (std::vector<std::string>{"three", "one", "two"}));

  // Inside a folder given whole: its files where its name sorts, not its JSON files, and the rest as before.
  const auto parent = testing::tmp_path("corpora");
  fs::remove_all(parent);
  fs::create_directories(parent);
  fs::rename(dir, parent / "b-saved");
  std::ofstream(parent / "a.txt") << "first";
  std::ofstream(parent / "c.txt") << "last";
  EXPECT_EQ(
      expand_inputs({parent.string()}),
      (std::vector<std::string>{(parent / "a.txt").string(), (parent / "b-saved" / "data-00001-of-00002.arrow").string(),
                                (parent / "b-saved" / "data-00000-of-00002.arrow").string(), (parent / "c.txt").string()}));

  // A DatasetDict: name a split.
  const auto dict = testing::tmp_path("saved-dict");
  fs::remove_all(dict);
  fs::create_directories(dict);
  fs::rename(parent / "b-saved", dict / "train");
  std::ofstream(dict / "dataset_dict.json") << R"({"splits": ["train", "test"]})";
  EXPECT_EQ(testing::data_error_of([&] { expand_inputs({dict.string()}); }),
            dict.string() + ": a DatasetDict saved by datasets' save_to_disk; give one split's folder (" +
                (dict / "train").string() + ", " + (dict / "test").string() + ")");
  EXPECT_EQ(expand_inputs({(dict / "train").string()}).size(), 2u);

  // A folder of the datasets cache: its files may hold the same rows twice.
  const auto cache = testing::tmp_path("hf-cache") / "fineweb" / "sample-10BT" / "0.0.0" / "abc123";
  fs::remove_all(cache);
  fs::create_directories(cache);
  fs::copy_file(one[0], cache / "fineweb-train-00000-of-00001.arrow");
  fs::copy_file(one[0], cache / "cache-4f2a.arrow");
  std::ofstream(cache / "dataset_info.json") << "{}";
  EXPECT_NE(testing::data_error_of([&] { expand_inputs({cache.string()}); }).find("a folder of the datasets cache"),
            std::string::npos);
  EXPECT_EQ(read_documents((cache / "fineweb-train-00000-of-00001.arrow").string(), {}),
            (std::vector<std::string>{"one", "two"}));

  // dataset_info.json beside files that are not Arrow (a Hub repository's metadata): an ordinary folder.
  const auto repo = testing::tmp_path("hub-repo");
  fs::remove_all(repo);
  fs::create_directories(repo);
  std::ofstream(repo / "dataset_info.json") << "{}";
  std::ofstream(repo / "train.txt") << "text";
  EXPECT_EQ(expand_inputs({repo.string()}),
            (std::vector<std::string>{(repo / "dataset_info.json").string(), (repo / "train.txt").string()}));

  // state.json naming a file that is not there, or without its list.
  const auto broken =
      save_to_disk_folder("saved-broken", {one[0]}, {"data-00000-of-00001.arrow", "data-00001-of-00001.arrow"});
  EXPECT_EQ(testing::data_error_of([&] { expand_inputs({broken.string()}); }),
            (broken / "state.json").string() + ": lists " + (broken / "data-00001-of-00001.arrow").string() +
                ", which is not there");
  std::ofstream(broken / "state.json", std::ios::trunc) << R"({"_split": "train"})";
  EXPECT_NE(testing::data_error_of([&] { expand_inputs({broken.string()}); }).find("\"_data_files\" is missing"),
            std::string::npos);

  // state.json names only the Arrow files beside it, each once: a downloaded folder's state.json pulled in
  // /etc/passwd (through ../ or an absolute path) as a text document, and a file listed twice was read twice.
  const auto listing = [&](const std::vector<std::string>& listed) {
    const auto dir = save_to_disk_folder("saved-listing", {one[0]}, listed);
    return testing::data_error_of([&] { expand_inputs({dir.string()}); });
  };
  const auto listed_state = (testing::tmp_path("saved-listing") / "state.json").string();
  EXPECT_EQ(listing({"../../../../etc/passwd"}),
            listed_state +
                ": \"_data_files\" lists '../../../../etc/passwd', which is not a file name in the folder "
                "(expected the name of an Arrow file beside state.json, as save_to_disk writes)");
  EXPECT_EQ(listing({"/etc/hostname"}), listed_state +
                                            ": \"_data_files\" lists '/etc/hostname', which is not a file name "
                                            "in the folder (expected the name of an Arrow file beside "
                                            "state.json, as save_to_disk writes)");
  EXPECT_EQ(listing({".."}), listed_state +
                                 ": \"_data_files\" lists '..', which is not a file name in the folder "
                                 "(expected the name of an Arrow file beside state.json, as save_to_disk "
                                 "writes)");
  EXPECT_EQ(listing({"data-00000-of-00001.arrow", "data-00000-of-00001.arrow"}),
            listed_state + ": \"_data_files\" lists 'data-00000-of-00001.arrow' twice");
  EXPECT_EQ(listing({"dataset_info.json"}),
            listed_state +
                ": \"_data_files\" lists 'dataset_info.json', which is not an Arrow file (*.arrow, as "
                "save_to_disk writes)");
  EXPECT_EQ(listing({"data-00000-of-00001.arrow"}), "no DataError");
}

TEST(Arrow, NullsMissingColumnsAndWrongTypesNameTheFile) {
  if (!testing::require_fetched()) return;
  const auto paths = write_arrow({"one", "two", std::nullopt, "four"}, {{{"name", "with-null"}, {"columns", "fineweb"}}});
  ASSERT_EQ(paths.size(), 1u);
  const auto& p = paths[0];
  const DocumentOptions options;  // auto: *.arrow is Arrow, column "text"
  std::vector<std::string> seen;
  EXPECT_EQ(testing::data_error_of([&] { for_each_document(p, options, [&](std::string&& d) { seen.push_back(d); }); }),
            p + ": row 2: column \"text\" is null (every row needs a text)");
  EXPECT_EQ(seen, (std::vector<std::string>{"one", "two"}));
  DocumentOptions missing;
  missing.text_field = "content";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(p, missing); }),
            p + ": no column \"content\" (its columns: id, kept, tags, tags.item, text, url, language_score, token_count; "
                "--text-field picks another)");
  DocumentOptions numbers;
  numbers.text_field = "token_count";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(p, numbers); }),
            p + ": column \"token_count\" holds Int64, not strings (Utf8, LargeUtf8, Utf8View or their Binary forms)");
  DocumentOptions listed;
  listed.text_field = "tags.item";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(p, listed); }),
            p + ": column \"tags.item\" lies inside a list, map or union, not one value per row");

  // --format arrow on a file of another name (datasets' cache names its files *.arrow; Feather v2 is *.feather).
  const auto renamed = testing::tmp_path("shard.bin");
  fs::copy_file(p, renamed, fs::copy_options::overwrite_existing);
  DocumentOptions forced;
  forced.format = parse_input_format("arrow");
  forced.text_field = "id";
  EXPECT_EQ(read_documents(renamed.string(), forced).size(), 4u);
  const auto text_file = testing::tmp_path("notes.arrow");
  std::ofstream(text_file) << "just some text";
  EXPECT_EQ(testing::data_error_of([&] { read_documents(text_file.string(), options); }),
            text_file.string() +
                ": not an Arrow IPC file or stream (14 bytes; it starts neither with \"ARROW1\" nor "
                "with a message)");
  const auto empty = testing::tmp_path("empty.feather");
  std::ofstream(empty).flush();
  EXPECT_EQ(testing::data_error_of([&] { read_documents(empty.string(), options); }),
            empty.string() + ": input file is empty");
}

TEST(Arrow, TruncatedAndMutatedFilesAreDataErrors) {
  if (!testing::require_fetched()) return;
  Texts texts;
  for (const auto& t : testing::real_texts(60'000)) texts.emplace_back(t.substr(0, 200));
  texts.emplace_back(std::nullopt);
  const auto paths =
      write_arrow(texts, {{{"name", "m-stream"}, {"batch_rows", 5}},
                          {{"name", "m-file"}, {"format", "file"}, {"batch_rows", 5}},
                          {{"name", "m-view"}, {"writer", "arrow-rs"}, {"type", "Utf8View"}, {"batch_rows", 5}},
                          {{"name", "m-dict"}, {"type", "Dictionary"}, {"batch_rows", 5}, {"columns", "nested"}}});
  ASSERT_EQ(paths.size(), 4u);
  for (const auto& p : paths) {
    SCOPED_TRACE(p);
    const std::string good = testing::slurp(p);
    const std::string column = p.find("m-dict") != std::string::npos ? "meta.text" : "text";
    const auto path = testing::tmp_path("mutated.arrow").string();
    const auto read = [&](const std::string& file) { read_column(file, column); };
    // Cut short inside a message: always an error naming the file. (A stream cut between two messages is a
    // shorter stream, as the format allows, so the cuts land inside the last message's body.)
    for (size_t keep : {good.size() - 1, good.size() - 9, good.size() / 2 + 3, size_t{100}, size_t{4}}) {
      const auto err = testing::read_error(path, good.substr(0, keep), read);
      EXPECT_EQ(err.rfind(path + ": ", 0), 0u) << "kept " << keep << ": " << err;
    }
    // Random bytes changed anywhere (a changed letter is still text), and in the schema and first batches'
    // metadata or a file's footer, where most changes land in lengths, offsets and types: a DataError or a
    // read to the end, never anything else.
    const size_t errors = testing::mutations_refused(p, path, 4242, read, [](std::mt19937_64& rng, size_t size, int trial) {
      const size_t near = std::min<size_t>(size, 1200);
      return trial % 3 == 0 ? rng() % size : trial % 3 == 1 ? rng() % near : size - 1 - rng() % near;
    });
    EXPECT_GT(errors, 300u);
  }
}

}  // namespace
}  // namespace shardtrain::data
