// prepare-data: token counts equal the tokenizer's, offsets are consistent, split sizes are right, and bad
// inputs (non-HDF5 or truncated files, a missing "text" field, empty inputs) give errors that name them.
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "data_test_util.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/documents.hpp"
#include "shardtrain/data/output_file.hpp"
#include "shardtrain/data/prepare.hpp"
#include "shardtrain/runtime/temporaries.hpp"

namespace shardtrain::data {
namespace {

std::string gpt2_path() { return (testing::fetched_dir() / "tokenizers" / "r50k_base.tiktoken").string(); }

// The UsageError preparing with `o` raises ("no UsageError", or "other: " and another error's words, when it does not).
std::string usage_error_of(const PrepareOptions& o) {
  try {
    prepare_dataset(o);
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no UsageError";
}

TEST(PrepareData, CountsOffsetsAndSplitFromRealCorpus) {
  if (!testing::require_fetched()) return;
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  for (size_t i = 0; i < 40; ++i) o.inputs.push_back(sotu[i].string());
  o.output = testing::tmp_path("sotu40.h5").string();
  o.validation_fraction = 0.1;
  o.seed = 7;
  o.progress = ProgressStyle::Off;
  const auto summary = prepare_dataset(o);
  EXPECT_EQ(summary.documents, 40u);
  EXPECT_EQ(summary.validation_documents, 4u);
  EXPECT_EQ(summary.train_documents, 36u);

  const auto ds = TokenDataset::open(o.output);
  const Tokenizer tok = Tokenizer::load(gpt2_path());
  ds.check_tokenizer(tok);
  ASSERT_EQ(ds.num_documents(), 40u);
  EXPECT_EQ(ds.num_tokens(), summary.tokens);
  size_t total = 0;
  for (size_t d = 0; d < 40; ++d) {
    const auto expected = tok.encode(testing::slurp(sotu[d]));
    const auto got = ds.document(d);
    ASSERT_EQ(got.size(), expected.size()) << "document " << d;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expected.begin())) << "document " << d;
    total += expected.size();
  }
  EXPECT_EQ(total, ds.num_tokens());
  EXPECT_EQ(ds.split_documents(DatasetSplit::Validation).size(), 4u);
  EXPECT_EQ(ds.split_documents(DatasetSplit::Train).size(), 36u);
  EXPECT_EQ(ds.info().eot_id, 50256u);
  EXPECT_EQ(ds.info().vocab_size, 50257);
  EXPECT_EQ(ds.info().tokenizer_name, "r50k_base");
  EXPECT_EQ(ds.info().sources.size(), 40u);
  EXPECT_EQ(ds.info().sources[0], sotu[0].string());
}

TEST(PrepareData, JsonlAndBlankLineDocuments) {
  if (!testing::require_fetched()) return;
  const auto dir = testing::tmp_path("inputs");
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "a.jsonl") << R"({"text": "first doc", "id": 1})"
                                      "\n\n"
                                      R"({"text": "second doc"})"
                                      "\n"
                                      R"({"text": ""})"
                                      "\n";
  }
  { std::ofstream(dir / "b.txt") << "block one\nstill one\n\n\nblock two\n  \nblock three"; }
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {(dir / "a.jsonl").string(), (dir / "b.txt").string()};
  o.documents.split = DocumentSplit::BlankLines;
  o.output = testing::tmp_path("small.h5").string();
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  const auto s = prepare_dataset(o);
  EXPECT_EQ(s.documents, 5u);
  EXPECT_EQ(s.empty_documents_skipped, 1u);
  const auto ds = TokenDataset::open(o.output);
  const Tokenizer tok = Tokenizer::load(gpt2_path());
  EXPECT_EQ(tok.decode(ds.document(1)), "second doc");
  EXPECT_EQ(tok.decode(ds.document(2)), "block one\nstill one");
  EXPECT_EQ(tok.decode(ds.document(4)), "block three");
  EXPECT_TRUE(ds.split_documents(DatasetSplit::Validation).empty());
}

TEST(PrepareData, ClearErrors) {
  if (!testing::require_fetched()) return;
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.output = testing::tmp_path("bad.h5").string();
  o.progress = ProgressStyle::Off;

  const auto no_text = testing::tmp_path("no_text.jsonl");
  {
    std::ofstream(no_text) << R"({"text": "ok"})"
                              "\n"
                              R"({"content": "wrong field"})"
                              "\n";
  }
  o.inputs = {no_text.string()};
  auto msg = testing::data_error_of([&] { prepare_dataset(o); });
  EXPECT_NE(msg.find(no_text.string() + ":2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;

  // An empty text file is an empty document (skipped, counted); inputs that hold nothing else are an error.
  const auto empty = testing::tmp_path("empty.txt");
  { std::ofstream(empty) << ""; }
  o.inputs = {empty.string()};
  msg = testing::data_error_of([&] { prepare_dataset(o); });
  EXPECT_NE(msg.find(empty.string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("no non-empty document (1 empty skipped"), std::string::npos) << msg;

  const auto not_h5 = testing::tmp_path("not.h5");
  { std::ofstream(not_h5) << "just some text, not HDF5"; }
  msg = testing::data_error_of([&] { TokenDataset::open(not_h5.string()); });
  EXPECT_NE(msg.find("not an HDF5 file"), std::string::npos) << msg;
  EXPECT_NE(msg.find(not_h5.string()), std::string::npos) << msg;

  // A real dataset cut in half.
  const auto good = testing::tmp_path("good.h5");
  o.inputs = {(testing::fetched_dir() / "corpus" / "sotu" / "1790_george_washington_n.txt").string()};
  o.output = good.string();
  prepare_dataset(o);
  const auto size = std::filesystem::file_size(good);
  const auto cut = testing::tmp_path("truncated.h5");
  std::filesystem::copy_file(good, cut, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(cut, size / 2);
  msg = testing::data_error_of([&] { TokenDataset::open(cut.string()); });
  EXPECT_NE(msg.find(cut.string()), std::string::npos) << msg;

  EXPECT_NE(testing::data_error_of([&] { TokenDataset::open("/nonexistent/x.h5"); }).find("no such file"),
            std::string::npos);
}

// The issue's case: prepare-data from a 2-byte input over a prepared dataset replaced it, exit 0. An existing output
// is now refused before anything is read, unless asked; and a preparation that fails leaves it as it was.
TEST(PrepareData, ExistingOutputIsReplacedOnlyWhenAsked) {
  if (!testing::require_fetched()) return;
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {(testing::fetched_dir() / "corpus" / "sotu" / "1790_george_washington_n.txt").string()};
  o.output = testing::tmp_path("existing.h5").string();
  o.progress = ProgressStyle::Off;
  const auto first = prepare_dataset(o);
  const auto size = std::filesystem::file_size(o.output);

  const auto tiny = testing::tmp_path("tiny.txt");
  { std::ofstream(tiny) << "hi"; }
  o.inputs = {tiny.string()};
  try {
    prepare_dataset(o);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(o.output + ": already exists"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(o.output), size);

  // Replace, but the inputs fail half-way: the old file stays whole, nothing is left beside it.
  const auto bad = testing::tmp_path("bad-field.jsonl");
  {
    std::ofstream(bad) << R"({"text": "ok"})"
                          "\n"
                          R"({"content": "wrong field"})"
                          "\n";
  }
  o.inputs = {bad.string()};
  o.existing = ExistingOutput::Replace;
  EXPECT_NE(testing::data_error_of([&] { prepare_dataset(o); }), "no DataError");
  EXPECT_EQ(TokenDataset::open(o.output).num_tokens(), first.tokens);
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(o.output).parent_path()))
    EXPECT_EQ(e.path().filename().string().rfind("existing.h5.", 0), std::string::npos) << "left behind: " << e.path();

  o.inputs = {tiny.string()};
  const auto replaced = prepare_dataset(o);
  EXPECT_EQ(TokenDataset::open(o.output).num_tokens(), replaced.tokens);
  EXPECT_LT(replaced.tokens, first.tokens);
}

// With threads = 0 the tokenizing threads are the cores the process may use: one under a one-core affinity
// (a Slurm task with --cpus-per-task=1, taskset -c 0), whatever the machine has.
TEST(PrepareData, ThreadsFollowTheAffinityMask) {
  if (!testing::require_fetched()) return;
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &before)) {
      CPU_SET(c, &one);
      break;
    }
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {(testing::fetched_dir() / "corpus" / "sotu" / "1790_george_washington_n.txt").string()};
  o.output = testing::tmp_path("one-core.h5").string();
  o.progress = ProgressStyle::Off;
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const auto summary = prepare_dataset(o);
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(summary.threads, 1);
  o.existing = ExistingOutput::Replace;  // the same output again
  EXPECT_EQ(prepare_dataset(o).threads, CPU_COUNT(&before));
}

// JSONL lines are parsed on the tokenizing threads; of several bad lines the first is the one reported, on
// any thread count, as one thread reading in order would.
TEST(PrepareData, TheFirstBadJsonlLineIsTheOneReported) {
  if (!testing::require_fetched()) return;
  const auto path = testing::tmp_path("bad-lines.jsonl");
  {
    std::ofstream out(path);
    for (int i = 1; i <= 3000; ++i) {
      if (i == 1217)
        out << R"({"content": "the wrong field"})"
            << "\n";
      else if (i > 1217)
        out << R"({"text": "cut short)"
            << "\n";  // every thread meets errors from here on
      else out << nlohmann::json{{"text", "document number " + std::to_string(i)}}.dump() << "\n";
    }
  }
  for (int threads : {1, 2, 4, 7, 7, 7, 7, 7, 16, 16}) {  // repeated: which thread meets which error varies
    PrepareOptions o;
    o.tokenizer = gpt2_path();
    o.inputs = {path.string()};
    o.output = testing::tmp_path("bad-lines.h5").string();
    o.threads = threads;
    o.progress = ProgressStyle::Off;
    const auto msg = testing::data_error_of([&] { prepare_dataset(o); });
    EXPECT_EQ(msg.rfind(path.string() + ":1217: field \"text\" is missing", 0), 0u) << threads << " threads: " << msg;
    EXPECT_FALSE(std::filesystem::exists(o.output));
  }
}

// The reading runs ahead of the tokenizing, on a thread of its own: an error it meets in a later file is
// reported only when no document before it failed, so the error is the first in input order, as when reading
// and tokenizing took turns. And a tokenizing failure stops the reading.
TEST(PrepareData, ReadingAheadReportsErrorsInInputOrder) {
  if (!testing::require_fetched()) return;
  const auto bad_line = testing::tmp_path("ahead-bad-line.jsonl"), good = testing::tmp_path("ahead-good.jsonl");
  const auto corrupt = testing::tmp_path("ahead-corrupt.jsonl.gz");
  {
    std::ofstream a(bad_line), b(good);
    for (int i = 1; i <= 400; ++i) {
      a << (i == 400 ? std::string(R"({"text": 12})") : nlohmann::json{{"text", "line " + std::to_string(i)}}.dump())
        << "\n";
      b << nlohmann::json{{"text", "good line " + std::to_string(i)}}.dump() << "\n";
    }
    std::ofstream(corrupt, std::ios::binary)
        << std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage that inflates to nothing", 42);
  }
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.output = testing::tmp_path("ahead.h5").string();
  o.progress = ProgressStyle::Off;
  // Batches of a few lines (the reading runs ahead of the tokenizing) and one batch for all (the bad line is in
  // the batch the reading is still filling when it meets the corrupt file).
  for (size_t batch_bytes : {size_t{64}, size_t{1} << 20}) {
    o.batch_bytes = batch_bytes;
    for (int threads : {1, 2, 2}) {
      o.threads = threads;
      o.inputs = {bad_line.string(), corrupt.string()};
      const auto msg = testing::data_error_of([&] { prepare_dataset(o); });
      EXPECT_EQ(msg.rfind(bad_line.string() + ":400: field \"text\" is not a string", 0), 0u)
          << threads << " threads, batches of " << batch_bytes << ": " << msg;
      EXPECT_FALSE(std::filesystem::exists(o.output));
      // With the bad line gone, the corrupt file's error is the one.
      o.inputs = {good.string(), corrupt.string()};
      const auto second = testing::data_error_of([&] { prepare_dataset(o); });
      EXPECT_EQ(second.rfind(corrupt.string() + ": ", 0), 0u) << second;
      EXPECT_FALSE(std::filesystem::exists(o.output));
    }
  }
  // A failure while the reading has a long way to go: the reading is told to stop and the run ends (no hang).
  // Copies, not the one file 200 times, which is refused as given twice.
  o.batch_bytes = 64;
  const auto many = testing::tmp_path("ahead-many");
  std::filesystem::create_directories(many);
  o.inputs = {bad_line.string()};
  for (int i = 0; i < 200; ++i) {
    const auto copy = many / ("good-" + std::to_string(i) + ".jsonl");
    std::filesystem::copy_file(good, copy, std::filesystem::copy_options::overwrite_existing);
    o.inputs.push_back(copy.string());
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(testing::data_error_of([&] { prepare_dataset(o); }).find(":400:"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

// Batches of any size give the same file: here one document (an address) per batch against one batch for all.
TEST(PrepareData, BatchesGiveTheSameDataset) {
  if (!testing::require_fetched()) return;
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  for (size_t i = 0; i < 60; ++i) o.inputs.push_back(sotu[i].string());
  o.validation_fraction = 0.05;
  o.progress = ProgressStyle::Off;
  o.output = testing::tmp_path("whole.h5").string();
  o.batch_bytes = size_t{1} << 40;
  const auto a = prepare_dataset(o);
  o.output = testing::tmp_path("batched.h5").string();
  o.batch_bytes = 1;
  o.threads = 2;
  const auto b = prepare_dataset(o);
  EXPECT_EQ(a.documents, b.documents);
  EXPECT_EQ(a.documents, 60u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.bytes, b.bytes);
  const auto da = TokenDataset::open(testing::tmp_path("whole.h5").string());
  const auto db = TokenDataset::open(testing::tmp_path("batched.h5").string());
  EXPECT_TRUE(
      std::equal(da.doc_offsets().begin(), da.doc_offsets().end(), db.doc_offsets().begin(), db.doc_offsets().end()));
  const auto ta = da.tokens(), tb = db.tokens();
  EXPECT_TRUE(std::equal(ta.begin(), ta.end(), tb.begin(), tb.end()));
  const auto va = da.split_documents(DatasetSplit::Validation), vb = db.split_documents(DatasetSplit::Validation);
  EXPECT_TRUE(std::equal(va.begin(), va.end(), vb.begin(), vb.end()));
  // And the tokens are the tokenizer's, document by document.
  const Tokenizer tok = Tokenizer::load(gpt2_path());
  const auto first = read_documents(sotu[0].string(), o.documents);
  for (size_t d = 0; d < first.size(); ++d) {
    const auto ids = tok.encode(first[d]);
    ASSERT_TRUE(std::equal(ids.begin(), ids.end(), db.document(d).begin(), db.document(d).end())) << "document " << d;
  }
}

// A bad line in the last input: the error names it, and neither the output nor a temporary file is left.
TEST(PrepareData, AFailureLeavesNoFiles) {
  if (!testing::require_fetched()) return;
  const auto dir = testing::tmp_path("fail");
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "a.jsonl") << R"({"text": "one"})"
                                      "\n"
                                      R"({"text": "two"})"
                                      "\n";
  }
  {
    std::ofstream(dir / "b.jsonl") << R"({"text": "three"})"
                                      "\n"
                                      "not json\n";
  }
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {dir.string()};
  std::filesystem::create_directories(dir / "out");  // prepare-data makes no folders
  o.output = (dir / "out" / "x.h5").string();
  o.batch_bytes = 4;  // the first file's documents are already in the temporary file when b.jsonl fails
  o.progress = ProgressStyle::Off;
  const std::string msg = testing::data_error_of([&] { prepare_dataset(o); });
  EXPECT_NE(msg.find((dir / "b.jsonl").string() + ":2"), std::string::npos) << msg;
  size_t left = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "out")) {
    ADD_FAILURE() << "left behind: " << e.path();
    ++left;
  }
  EXPECT_EQ(left, 0u);
}

// The names in a folder, sorted.
std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Outputs that cannot be written, and values outside their range, are UsageErrors before any work: the tokenizer
// here does not exist, so a check made after loading it would be a DataError instead. The audit's -o DIR
// --overwrite and -o "" tokenized everything and then failed with an I/O error (exit 8); NaN passed the range check.
TEST(PrepareData, BadOutputsAndValuesAreUsageErrorsBeforeAnyWork) {
  const auto dir = testing::tmp_path("before-work");
  std::filesystem::create_directories(dir / "outdir");
  std::ofstream(dir / "in.txt") << "some text";
  PrepareOptions o;
  o.tokenizer = (dir / "no-such-tokenizer.json").string();
  o.inputs = {(dir / "in.txt").string()};
  o.existing = ExistingOutput::Replace;
  o.progress = ProgressStyle::Off;
  o.output = (dir / "outdir").string();
  EXPECT_EQ(usage_error_of(o),
            o.output + ": is a folder; prepare-data writes one file (give its name, e.g. " + o.output + "/NAME)");
  o.output = (dir / "outdir").string() + "/";
  EXPECT_EQ(usage_error_of(o), o.output + ": is a folder; prepare-data writes one file (give its name, e.g. " +
                                   (dir / "outdir").string() + "/NAME)");
  o.output = "";
  EXPECT_EQ(usage_error_of(o), "prepare-data: the output is an empty name (--output)");
  o.output = (dir / "out.h5").string();
  o.validation_fraction = std::nan("");
  EXPECT_EQ(usage_error_of(o), "--validation-fraction nan is outside [0, 1)");
  o.validation_fraction = 0.01;
  o.threads = -1;
  EXPECT_EQ(usage_error_of(o), "--threads -1: expected 0 (every core this process may use) or more");
  o.threads = 0;
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"in.txt", "outdir"}));  // nothing written, nothing left
}

// An output inside its input folder (the audit: each run read the previous dataset in as a text document, 7824
// tokens, then 54808, then 242757) is left out of the listing, with any temporaries of it; an output that is a
// named input is refused, the input kept.
TEST(PrepareData, TheOutputIsNeverItsOwnInput) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  const auto dir = testing::tmp_path("corp");
  fs::create_directories(dir);
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  for (size_t i = 0; i < 3; ++i) fs::copy_file(sotu[i], dir / sotu[i].filename(), fs::copy_options::overwrite_existing);
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {dir.string()};
  o.output = (dir / "ds.h5").string();
  o.existing = ExistingOutput::Replace;
  o.progress = ProgressStyle::Off;
  const auto first = prepare_dataset(o);
  EXPECT_EQ(first.files, 3u);
  // A killed run's temporaries, of another process; and a name that only looks like one, which is read.
  std::ofstream(dir / "ds.h5.tmp-999") << "half a dataset";
  std::ofstream(dir / "ds.h5.tokens-tmp-12") << "ids";
  for (int run = 0; run < 2; ++run) {
    const auto again = prepare_dataset(o);
    EXPECT_EQ(again.files, 3u) << "run " << run;
    EXPECT_EQ(again.tokens, first.tokens) << "run " << run;
    EXPECT_EQ(TokenDataset::open(o.output).num_tokens(), first.tokens);
  }
  const OwnOutput dataset{is_hdf5_file, "a dataset"};  // as prepare-data names its own output
  EXPECT_EQ(expand_inputs({dir.string()}, o.output, dataset).size(), 3u);
  // The same output spelled otherwise, and through a link to the folder.
  fs::create_directory_symlink(dir, testing::tmp_path("corp-link"));
  EXPECT_EQ(expand_inputs({dir.string()}, (testing::tmp_path("corp-link") / "." / "ds.h5").string(), dataset).size(), 3u);
  // Without it, or where the file at the output's name is not the tool's own, the output would replace an input.
  EXPECT_THROW(expand_inputs({dir.string()}, o.output), UsageError);
  EXPECT_EQ(expand_inputs({dir.string()}).size(), 6u);  // without an output, every file

  const auto victim = dir / sotu[0].filename();
  const std::string text = testing::slurp(victim);
  o.inputs = {victim.string()};
  for (const auto& output : {victim.string(), (testing::tmp_path("corp-link") / sotu[0].filename()).string()}) {
    o.output = output;
    try {
      prepare_dataset(o);
      ADD_FAILURE() << "no UsageError for " << output;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                victim.string() + ": is both an input and the output; writing it would replace the input");
    }
    EXPECT_EQ(testing::slurp(victim), text);
  }
}

// An output whose legal name (250 bytes) left no room within a file system's 255 for its temporary's suffix failed at
// the end of the work ("cannot create the temporary token file: File name too long"): the temporaries' names cut it
// (temporary_stem, whole UTF-8 characters), and such a temporary left in an input folder is known as the output's.
TEST(PrepareData, AnOutputWithALongNameHasTemporariesThatFit) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  const auto dir = testing::fresh_tmp_dir("long-output-name");
  const auto sotu = testing::sorted_files(testing::fetched_dir() / "corpus" / "sotu", ".txt");
  for (size_t i = 0; i < 2; ++i) fs::copy_file(sotu[i], dir / sotu[i].filename());
  const std::string name = std::string(247, 'd') + ".h5";
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {dir.string()};
  o.output = (dir / name).string();
  o.progress = ProgressStyle::Off;
  const auto done = prepare_dataset(o);
  EXPECT_EQ(done.files, 2u);
  EXPECT_EQ(TokenDataset::open(o.output).num_tokens(), done.tokens);
  for (const std::string_view kind : {"tmp", "tokens-tmp"}) {
    const std::string stem = temporary_stem(name, kind), beside = temporary_beside(o.output, kind);
    EXPECT_EQ(stem, name.substr(0, stem.size() - kind.size() - 2) + "." + std::string(kind) + "-");
    EXPECT_TRUE(beside.starts_with((dir / stem).string())) << beside;
    EXPECT_LE(fs::path(beside).filename().string().size() + 8, size_t{NAME_MAX}) << beside;  // with room for "-N"
  }
  EXPECT_EQ(temporary_stem("ds.h5", "tmp"), "ds.h5.tmp-");  // a name of usual length is not cut
  // Cut between characters: 120 two-byte characters, never half of one.
  std::string accents;
  for (int i = 0; i < 120; ++i) accents += "\xc3\xa9";
  const std::string cut = temporary_stem(accents, "tmp");
  EXPECT_LT(cut.size(), accents.size());
  EXPECT_EQ((cut.size() - std::strlen(".tmp-")) % 2, 0u) << cut;
  // A killed process's temporary of the long output (another host's, which no sweep here removes) is not an input.
  std::ofstream(dir / (temporary_stem(name, "tokens-tmp") + "otherhost-12")) << "ids";
  EXPECT_EQ(expand_inputs({dir.string()}, o.output, OwnOutput{is_hdf5_file, "a dataset"}).size(), 2u);
}

// A folder reached twice through symbolic links (the audit's loop/self -> ../loop read every file at 40 depths,
// then failed as an "internal error"), and a link to itself, are DataErrors naming the link.
TEST(PrepareData, SymbolicLinkLoopsInAnInputFolderAreDataErrors) {
  namespace fs = std::filesystem;
  const auto loop = testing::tmp_path("loop");
  fs::create_directories(loop);
  std::ofstream(loop / "a.txt") << "hi";
  fs::create_directory_symlink("../loop", loop / "self");
  EXPECT_EQ(testing::data_error_of([&] { expand_inputs({loop.string()}); }),
            (loop / "self").string() + ": leads to " + fs::canonical(loop).string() +
                ", a folder already read (a symbolic link loop, or a second link to one folder); its files would be read "
                "twice");
  const auto knot = testing::tmp_path("knot");
  fs::create_directories(knot);
  std::ofstream(knot / "a.txt") << "hi";
  fs::create_symlink("itself", knot / "itself");
  EXPECT_EQ(testing::data_error_of([&] { expand_inputs({knot.string()}); }),
            (knot / "itself").string() + ": cannot list it: Too many levels of symbolic links");
}

// More threads than the system starts: a UsageError, never std::terminate (the audit's --threads 65536 aborted,
// leaving OUT.tokens-tmp-PID; above 1024 the count is now cut to 1024). Here the user may run one thread, so the
// reading thread cannot start either.
TEST(PrepareData, ThreadsTheSystemRefusesAreAUsageError) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  const auto out = testing::tmp_path("no-threads");
  fs::create_directories(out);
  fs::permissions(out, fs::perms::all);  // writable by the user the child becomes
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {(testing::fetched_dir() / "corpus" / "sotu" / "1790_george_washington_n.txt").string()};
  o.output = (out / "x.h5").string();
  o.threads = 2;
  o.progress = ProgressStyle::Off;
  EXPECT_EQ(testing::usage_error_under_thread_limit(1, [&] { prepare_dataset(o); }),
            "the system cannot start the reading thread (Resource temporarily unavailable): its limit on threads "
            "(ulimit -u) is reached");
  EXPECT_EQ(names_in(out), std::vector<std::string>{});
}

// A JSONL line that is not an object says so (docs/data.md), instead of naming a missing field.
TEST(PrepareData, AJsonlLineThatIsNotAnObjectSaysSo) {
  const auto path = testing::tmp_path("array-line.jsonl");
  std::ofstream(path) << "{\"text\": \"fine\"}\n[1, 2]\n";
  EXPECT_EQ(
      testing::data_error_of([&] { read_documents(path.string(), {}); }),
      path.string() + ":2: not a JSON object (a JSON array; JSONL inputs need one object per line with a \"text\" string)");
  DocumentOptions ids;
  ids.token_field = "input_ids";
  ids.vocab_size = 10;
  EXPECT_EQ(testing::data_error_of([&] {
              document_ids({"7", 3}, path.string(), ids);
            }),
            path.string() +
                ":3: not a JSON object (a JSON number; pre-tokenized JSONL needs one object per line with a "
                "\"input_ids\" array of token ids)");
}

// A lone surrogate escape, which Python's json writes (a string cut inside a pair) and reads, is U+FFFD; the line was
// refused as "not a JSON object". A pair, an escaped backslash before "u" and other escapes are as they were. Raw
// invalid UTF-8 inside a string is named as such, with its byte and what to do.
TEST(PrepareData, JsonlSurrogatesAreReplacedAndInvalidUtf8IsNamed) {
  const auto path = testing::tmp_path("surrogates.jsonl");
  std::ofstream(path, std::ios::binary) << R"({"text": "bad \ud800 here"})"
                                           "\n"
                                        << R"({"text": "low \uDC00, high then other \ud83d\u0041"})"
                                           "\n"
                                        << R"({"text": "pair \ud83d\ude00 kept, \\ud800 literal, \"q\" \n"})"
                                           "\n"
                                        << "{\"text\": \"caf\xe9 latin1\"}\n";
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(document_text({R"({"text": "bad \ud800 here"})", 1}, path.string(), {}), "bad " + fffd + " here");
  EXPECT_EQ(document_text({R"({"text": "low \uDC00, high then other \ud83d\u0041"})", 2}, path.string(), {}),
            "low " + fffd + ", high then other " + fffd + "A");
  EXPECT_EQ(document_text({R"({"text": "pair \ud83d\ude00 kept, \\ud800 literal, \"q\" \n"})", 3}, path.string(), {}),
            "pair \xf0\x9f\x98\x80 kept, \\ud800 literal, \"q\" \n");
  EXPECT_EQ(testing::data_error_of([&] { read_documents(path.string(), {}); }),
            path.string() +
                ":4: invalid UTF-8 inside a JSON string (byte 14 of the line, 0xe9): JSON text must be UTF-8; convert the "
                "file (iconv -f LATIN1 -t UTF-8, if it is latin-1) or fix what wrote it (plain text inputs, --format "
                "text, keep such bytes as they are)");
}

// --threads 65536 (inside the command's range) is cut to 1024, which run: the dataset is the one of 2 threads.
TEST(PrepareData, ThreadsAboveTheCapAreCutToIt) {
  if (!testing::require_fetched()) return;
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {(testing::fetched_dir() / "corpus" / "sotu" / "1790_george_washington_n.txt").string()};
  o.output = testing::tmp_path("capped.h5").string();
  o.threads = 65536;
  o.progress = ProgressStyle::Off;
  const auto capped = prepare_dataset(o);
  EXPECT_EQ(capped.threads, kMaxThreads);
  o.output = testing::tmp_path("two-threads.h5").string();
  o.threads = 2;
  EXPECT_EQ(prepare_dataset(o).tokens, capped.tokens);
}

// Inputs that are not regular files (a device or a FIFO: prepare-data read /dev/zero without end, and a killed run
// left its temporary behind), and one file given twice however spelled (its documents went in twice, and could land
// in both splits), are UsageErrors before any work: the tokenizer here does not exist.
TEST(PrepareData, InputsThatAreNotFilesOrGivenTwiceAreUsageErrors) {
  namespace fs = std::filesystem;
  const auto dir = testing::tmp_path("inputs-twice");
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "a.txt") << "some text";
  std::ofstream(dir / "sub" / "b.txt") << "more text";
  fs::create_symlink(dir / "a.txt", dir / "link.txt");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  PrepareOptions o;
  o.tokenizer = (dir / "no-such-tokenizer.json").string();
  o.output = (dir / "out.h5").string();
  o.progress = ProgressStyle::Off;
  const auto refusal_of = [&](std::vector<std::string> inputs) {
    o.inputs = std::move(inputs);
    return usage_error_of(o);
  };
  const std::string a = (dir / "a.txt").string(), b = (dir / "sub" / "b.txt").string();
  const std::string not_file = "; --input takes regular files or folders of them (a pipe or a device has no end to read to)";
  EXPECT_EQ(refusal_of({a, "/dev/zero"}), "/dev/zero: is a character device" + not_file);
  EXPECT_EQ(refusal_of({(dir / "fifo").string()}), (dir / "fifo").string() + ": is a FIFO (named pipe)" + not_file);
  const auto twice = [](const std::string& second, const std::string& first) {
    return second + ": is the same file as " + first +
           ", given before; its documents would be read twice (and a copy could land in the validation split); give "
           "each file once";
  };
  EXPECT_EQ(refusal_of({a, a}), twice(a, a));
  const std::string dotted = (dir / "sub" / ".." / "a.txt").string();
  EXPECT_EQ(refusal_of({a, dotted}), twice(dotted, a));
  EXPECT_EQ(refusal_of({(dir / "link.txt").string(), a}), twice(a, (dir / "link.txt").string()));
  EXPECT_EQ(refusal_of({(dir / "sub").string(), b}), twice(b, b));
  fs::create_hard_link(b, dir / "hard.txt");
  EXPECT_EQ(refusal_of({b, (dir / "hard.txt").string()}), twice((dir / "hard.txt").string(), b));
  EXPECT_FALSE(fs::exists(o.output));
}

// A tokenizer.json spelled otherwise (what transformers' save_pretrained writes: indentation, key order, merges as
// pairs) is the tokenizer a dataset was prepared with: its file hash differs, its encoding hash does not. Two ids
// swapped change the encoding hash; a dataset that records no encoding hash (prepared before 2026-11-29) compares the
// file's bytes, as it did.
TEST(PrepareData, ATokenizerSpelledOtherwiseIsTheSameTokenizer) {
  if (!testing::require_fetched()) return;
  const auto original_path = testing::fetched_dir() / "tokenizers" / "gpt2-hf" / "tokenizer.json";
  auto j = nlohmann::json::parse(testing::slurp(original_path));
  for (auto& m : j["model"]["merges"]) {
    ASSERT_TRUE(m.is_string());
    const std::string text = m.get<std::string>();
    const size_t sp = text.find(' ', 1);
    m = nlohmann::json::array({text.substr(0, sp), text.substr(sp + 1)});
  }
  const auto write = [](const nlohmann::json& doc, const std::string& name) {
    const auto path = testing::tmp_path(name);
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << doc.dump(2);
    return path.string();
  };
  const std::string resaved_path = write(j, "resaved/tokenizer.json");
  auto& vocab = j["model"]["vocab"];
  const TokenId the = vocab["the"], and_ = vocab["and"];
  vocab["the"] = and_;
  vocab["and"] = the;
  const std::string swapped_path = write(j, "swapped/tokenizer.json");

  const Tokenizer original = Tokenizer::load(original_path.string()), resaved = Tokenizer::load(resaved_path),
                  swapped = Tokenizer::load(swapped_path);
  EXPECT_NE(original.hash(), resaved.hash());
  EXPECT_EQ(original.encoding_hash(), resaved.encoding_hash());
  EXPECT_EQ(original.encoding_hash().rfind("fnv1a64:", 0), 0u) << original.encoding_hash();
  EXPECT_NE(original.encoding_hash(), swapped.encoding_hash());
  const std::string text = testing::slurp(testing::fetched_dir() / "corpus" / "moby-dick" / "chapter_1.txt").substr(0, 4000);
  EXPECT_EQ(original.encode(text), resaved.encode(text));  // the premise: the same ids

  PrepareOptions o;
  o.tokenizer = original_path.string();
  o.inputs = {(testing::fetched_dir() / "corpus" / "moby-dick" / "chapter_1.txt").string()};
  o.output = testing::tmp_path("identity.h5").string();
  o.progress = ProgressStyle::Off;
  prepare_dataset(o);
  const auto ds = TokenDataset::open(o.output);
  EXPECT_EQ(ds.info().tokenizer_encoding_hash, original.encoding_hash());
  ds.check_tokenizer(original);
  ds.check_tokenizer(resaved);
  const std::string msg = testing::data_error_of([&] { ds.check_tokenizer(swapped); });
  EXPECT_NE(msg.find(o.output + ": made with tokenizer"), std::string::npos) << msg;

  // A dataset of before the encoding hash: the file's bytes, as before.
  DatasetInfo old = dataset_info_for(original);
  old.tokenizer_encoding_hash.clear();
  const std::string old_path = testing::tmp_path("identity-old.h5").string();
  write_dataset(old_path, ds.tokens(), std::vector<int64_t>{0, static_cast<int64_t>(ds.num_tokens())}, old);
  const auto old_ds = TokenDataset::open(old_path);
  EXPECT_EQ(old_ds.info().tokenizer_encoding_hash, "");
  old_ds.check_tokenizer(original);
  const std::string old_msg = testing::data_error_of([&] { old_ds.check_tokenizer(resaved); });
  EXPECT_NE(old_msg.find("made with tokenizer"), std::string::npos) << old_msg;
}

// An empty text file among others is an empty document, skipped and counted as docs/data.md says (it stopped the
// whole preparation, exit 4); a UTF-16 text file is named as such, with the conversion to do (it was "holds a NUL
// byte").
TEST(PrepareData, EmptyTextFilesAreSkippedAndUtf16IsNamed) {
  if (!testing::require_fetched()) return;
  namespace fs = std::filesystem;
  const auto dir = testing::fresh_tmp_dir("with-empty");
  std::ofstream(dir / "a.txt") << "first text";
  std::ofstream(dir / "b_empty.txt").flush();
  std::ofstream(dir / "c.txt") << "second text";
  PrepareOptions o;
  o.tokenizer = gpt2_path();
  o.inputs = {dir.string()};
  o.output = testing::tmp_path("with-empty.h5").string();
  o.validation_fraction = 0;
  o.progress = ProgressStyle::Off;
  o.existing = ExistingOutput::Replace;
  for (const auto split : {DocumentSplit::PerFile, DocumentSplit::BlankLines}) {
    o.documents.split = split;
    const auto s = prepare_dataset(o);
    EXPECT_EQ(s.files, 3u);
    EXPECT_EQ(s.documents, 2u);
    EXPECT_EQ(s.empty_documents_skipped, 1u);
    const auto ds = TokenDataset::open(o.output);
    EXPECT_EQ(Tokenizer::load(gpt2_path()).decode(ds.document(1)), "second text");
  }
  const auto utf16 = testing::tmp_path("notes-utf16.txt");
  std::ofstream(utf16, std::ios::binary) << std::string("\xff\xfeh\0i\0", 6);
  o.inputs = {utf16.string()};
  const auto msg = testing::data_error_of([&] { prepare_dataset(o); });
  EXPECT_NE(msg.find(utf16.string() + ": is UTF-16 text (its byte order mark says little-endian, FF FE)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("iconv -f UTF-16 -t UTF-8"), std::string::npos) << msg;
}

}  // namespace
}  // namespace shardtrain::data
