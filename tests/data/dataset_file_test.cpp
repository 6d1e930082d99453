// The dataset file (format 2): tokens mapped from the file, not read; each checksum block checked at its
// first use, so a damaged block or an id outside the vocabulary surfaces as a DataError naming the file and
// the tokens; every attribute and layout checked against its metadata checksum at open; format-1 files
// (chunked, read whole) still open; a rewrite never disturbs a reader, and an existing file is replaced only
// when asked.
#include <fcntl.h>
#include <hdf5.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "data_test_util.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/json_text.hpp"

namespace shardtrain::data {
namespace {

constexpr int64_t kVocab = 50257;

struct Corpus {
  std::vector<TokenId> tokens;
  std::vector<int64_t> offsets{0};
};

// Documents of 1 to 3000 tokens until `n` tokens, ids drawn below kVocab from `seed`.
Corpus make_corpus(size_t n, uint32_t seed) {
  Corpus c;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> id(0, kVocab - 1);
  std::uniform_int_distribution<size_t> len(1, 3000);
  while (c.tokens.size() < n) {
    const size_t l = std::min(len(rng), n - c.tokens.size());
    for (size_t i = 0; i < l; ++i) c.tokens.push_back(id(rng));
    c.offsets.push_back(static_cast<int64_t>(c.tokens.size()));
  }
  return c;
}

DatasetInfo info() {
  DatasetInfo i;
  i.tokenizer_name = "synthetic";
  i.tokenizer_hash = "0123";
  i.vocab_size = kVocab;
  i.eot_id = 50256;
  i.validation_fraction = 0.01;
  i.split_seed = 5;
  return i;
}

// The first document that starts inside checksum block `b`.
size_t document_in_block(const Corpus& c, size_t b) {
  for (size_t d = 0; d + 1 < c.offsets.size(); ++d)
    if (static_cast<size_t>(c.offsets[d]) >= b * kChecksumBlockTokens) return d;
  return c.offsets.size() - 2;
}

uint64_t tokens_offset(const std::string& path) {
  auto f = hdf5::open_file(path, hdf5::FileMode::ReadOnly);
  const auto at = hdf5::raw_u32le_offset(f, "tokens");
  EXPECT_TRUE(at.has_value());
  return at.value_or(0);
}

TEST(DatasetFile, TokensAreMappedAndEqualWhatWasWritten) {
  const Corpus c = make_corpus(2 * kChecksumBlockTokens + 12345, 1);
  const auto path = testing::tmp_path("mapped.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_TRUE(ds.mapped());
  ASSERT_EQ(ds.num_tokens(), c.tokens.size());
  ASSERT_EQ(ds.num_documents(), c.offsets.size() - 1);
  for (size_t d = 0; d < ds.num_documents(); d += 97) {
    const auto got = ds.document(d);
    ASSERT_EQ(got.size(), ds.document_size(d));
    ASSERT_TRUE(std::equal(got.begin(), got.end(), c.tokens.begin() + c.offsets[d])) << "document " << d;
  }
  const auto all = ds.tokens();
  EXPECT_TRUE(std::equal(all.begin(), all.end(), c.tokens.begin(), c.tokens.end()));
  EXPECT_EQ(ds.split_documents(DatasetSplit::Train).size() + ds.split_documents(DatasetSplit::Validation).size(),
            ds.num_documents());
}

TEST(DatasetFile, Fletcher64KnownValues) {
  EXPECT_EQ(fletcher64({}), 0u);
  const std::vector<uint32_t> w{1, 2, 3};  // a = 6, b = 1 + 3 + 6 = 10
  EXPECT_EQ(fletcher64(w), (uint64_t{10} << 32) | 6u);
  const std::vector<uint32_t> big(200000, 0xffffffffu);  // each word is 0 modulo 2^32 - 1
  EXPECT_EQ(fletcher64(big), 0u);
  // Order matters (the second sum weights by position), one flipped bit matters.
  EXPECT_NE(fletcher64(std::vector<uint32_t>{3, 2, 1}), fletcher64(w));
  EXPECT_NE(fletcher64(std::vector<uint32_t>{1, 2, 7}), fletcher64(w));
}

// A flipped byte in block 1: opening succeeds (nothing is read yet), blocks 0 and 2 still serve their
// documents, and the first use of block 1 names the file and the damaged tokens.
TEST(DatasetFile, DamagedBlockFailsAtItsFirstUse) {
  const Corpus c = make_corpus(3 * kChecksumBlockTokens, 2);
  const auto path = testing::tmp_path("damaged.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  const uint64_t at = tokens_offset(path);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto pos = static_cast<std::streamoff>(at + 4 * (kChecksumBlockTokens + 777) + 1);
    f.seekg(pos);
    char byte = 0;
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    f.seekp(pos);
    f.write(&byte, 1);
  }
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_NO_THROW(ds.document(0));
  EXPECT_NO_THROW(ds.document(document_in_block(c, 2)));
  // The document holding token 1M + 777.
  const auto pos = static_cast<int64_t>(kChecksumBlockTokens + 777);
  const size_t bad = static_cast<size_t>(std::upper_bound(c.offsets.begin(), c.offsets.end(), pos) - c.offsets.begin()) - 1;
  const std::string msg = testing::data_error_of([&] { ds.document(bad); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("tokens [1048576, 2097152) do not match their checksum"), std::string::npos) << msg;
  EXPECT_NE(testing::data_error_of([&] { ds.tokens(); }).find("do not match their checksum"), std::string::npos);
}

TEST(DatasetFile, IdOutsideTheVocabularyFailsAtFirstUse) {
  Corpus c = make_corpus(2 * kChecksumBlockTokens, 3);
  c.tokens[kChecksumBlockTokens + 5] = kVocab;  // written with a valid checksum: only the id is wrong
  const auto path = testing::tmp_path("vocab.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_NO_THROW(ds.document(0));
  const std::string msg = testing::data_error_of([&] { ds.tokens(); });
  EXPECT_NE(msg.find("token id 50257 (at 1048581) is outside the vocabulary"), std::string::npos) << msg;
}

TEST(DatasetFile, TruncatedTokensAreRefusedAtOpen) {
  const Corpus c = make_corpus(kChecksumBlockTokens / 2, 4);
  const auto path = testing::tmp_path("short.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  // Cut inside the token array: whether HDF5 or the mapping notices first, the error names the file.
  const uint64_t at = tokens_offset(path);
  std::filesystem::resize_file(path, at + 4 * c.tokens.size() / 2);
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

// Format 1 (what earlier versions wrote): chunked tokens with Fletcher32, no block checksums; read whole.
// A format-1 file (chunked tokens, read whole, no metadata checksums); `wide` stores the tokens as int64, as a file
// converted by another tool may.
void write_format1(const std::string& path, const Corpus& c, const std::vector<int64_t>* wide = nullptr) {
  {
    auto f = hdf5::create_file(path);
    const hdf5::DatasetOptions checked{.chunk_elements = 1 << 20, .checksum = hdf5::Checksum::Fletcher32};
    if (wide) hdf5::write_i64(f, "tokens", *wide, checked);
    else hdf5::write_u32(f, "tokens", c.tokens, checked);
    hdf5::write_i64(f, "doc_offsets", c.offsets, checked);
    std::vector<int64_t> train;
    for (size_t d = 0; d + 1 < c.offsets.size(); ++d) train.push_back(static_cast<int64_t>(d));
    auto split = hdf5::create_group(f, "split");
    hdf5::write_i64(split, "train", train, checked);
    hdf5::write_i64(split, "validation", std::vector<int64_t>{}, checked);
    hdf5::set_attr(f, "format", std::string(kDatasetFormat));
    hdf5::set_attr(f, "format_version", int64_t{1});
    hdf5::set_attr(f, "tokenizer_name", std::string("synthetic"));
    hdf5::set_attr(f, "tokenizer_hash", std::string("0123"));
    hdf5::set_attr(f, "vocab_size", kVocab);
    hdf5::set_attr(f, "eot_id", int64_t{50256});
  }
}

TEST(DatasetFile, Format1StillOpens) {
  const Corpus c = make_corpus(300000, 5);
  const auto path = testing::tmp_path("v1.h5").string();
  write_format1(path, c);
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_FALSE(ds.mapped());
  const auto all = ds.tokens();
  EXPECT_TRUE(std::equal(all.begin(), all.end(), c.tokens.begin(), c.tokens.end()));
  const size_t d = ds.num_documents() / 2;
  EXPECT_TRUE(std::equal(ds.document(d).begin(), ds.document(d).end(), c.tokens.begin() + c.offsets[d]));
}

// Tokens stored as signed or 64-bit integers: HDF5 converted them to uint32 by clamping, so an id of -7 trained as
// id 0 without a word. Now they are read wide and checked; in range, they open as they are.
TEST(DatasetFile, WideTokensAreCheckedNotClamped) {
  const Corpus c = make_corpus(50000, 18);
  std::vector<int64_t> wide(c.tokens.begin(), c.tokens.end());
  const auto path = testing::tmp_path("v1-int64.h5").string();
  write_format1(path, c, &wide);
  const TokenDataset ds = TokenDataset::open(path);
  const auto all = ds.tokens();
  EXPECT_TRUE(std::equal(all.begin(), all.end(), c.tokens.begin(), c.tokens.end()));
  wide[3] = -7;
  write_format1(path, c, &wide);
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(path); }),
            path + ": token id -7 (at 3) is outside the vocabulary (vocab_size 50257)");
  wide[3] = (int64_t{1} << 32) + 5;  // clamped to 2^32 - 1 before, wrapped to 5 by a plain cast
  write_format1(path, c, &wide);
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(path); }),
            path + ": token id 4294967301 (at 3) is outside the vocabulary (vocab_size 50257)");
}

// The end-of-text, begin and padding ids go into every sample past the tokens' own check: one outside the vocabulary
// trained as an id the tokenizer does not have (a model with a larger vocab_size), or failed in the embedding with
// "token id 600 at position 17 is outside the vocabulary" and no file named; one of 2^32 or more wrapped to a small
// id. Refused at open, whether the checksums vouch for the lie (recorded with it) or there are none (an older file).
TEST(DatasetFile, SpecialIdOutsideTheVocabularyIsRefusedAtOpen) {
  const Corpus c = make_corpus(50000, 19);
  const auto path = testing::tmp_path("eot-outside.h5").string();
  DatasetInfo lying = info();
  lying.eot_id = static_cast<TokenId>(kVocab);
  write_dataset(path, c.tokens, c.offsets, lying);
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(path); }),
            path + ": attribute 'eot_id' is 50257, outside the vocabulary [0, 50257) (-1: none); prepare the dataset again");
  write_dataset(path, c.tokens, c.offsets, info());
  {
    auto f = hdf5::open_file(path, hdf5::FileMode::ReadWrite);
    for (const char* object : {".", "tokens", "tokens_checksums", "doc_offsets", "split", "split/train", "split/validation"})
      ASSERT_GE(H5Adelete_by_name(f.get(), object, hdf5::kMetadataChecksums, H5P_DEFAULT), 0) << object;
    hdf5::set_attr(f, "pad_id", (int64_t{1} << 32) + 1);
  }
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(path); }),
            path +
                ": attribute 'pad_id' is 4294967297, outside the vocabulary [0, 50257) (-1: none); prepare the dataset "
                "again");
}

// Files that are no dataset: each named for what it is. An HDF5 file of something else was first warned about as a
// dataset from an older build (no metadata checksums), then refused; an empty file and a corpus file were "not an
// HDF5 file (no HDF5 signature)".
TEST(DatasetFile, FilesThatAreNoDatasetSayWhatTheyAre) {
  const auto other = testing::tmp_path("other.h5").string();
  {
    auto f = hdf5::create_file(other);
    hdf5::write_i64(f, "x", std::vector<int64_t>{1, 2, 3});
  }
  ::testing::internal::CaptureStderr();
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(other); });
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(msg, other + ": attribute 'format' is missing (not a shardtrain dataset?)");
  EXPECT_EQ(said.find("prepared by a build before"), std::string::npos) << said;

  const auto empty = testing::tmp_path("empty.h5").string();
  std::ofstream(empty).close();
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(empty); }),
            empty + ": the file is empty (0 bytes), not a dataset (a copy that did not finish?)");
  const auto corpus = testing::tmp_path("corpus.jsonl").string();
  std::ofstream(corpus) << "{\"text\": \"Call me Ishmael.\"}\n";
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(corpus); }),
            corpus +
                ": not an HDF5 file (no HDF5 signature); a dataset is the .h5 file prepare-data makes from a corpus "
                "(text, JSONL, Parquet or Arrow): shardtrain prepare-data --tokenizer T --input " +
                corpus + " --output DATASET.h5");
}

// Files HDF5 cannot open for reasons of the file system, named for them: one the user may not read was "not an HDF5
// file (no HDF5 signature)", one another process holds open for writing (HDF5's exclusive file lock, an h5py session
// in 'a' mode) "cannot open as HDF5 (truncated or corrupt file?)": damage that was not there.
TEST(DatasetFile, UnreadableAndLockedFilesSayWhy) {
  const Corpus c = make_corpus(20000, 21);
  const auto path = testing::tmp_path("locked.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  const int writer = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(writer, 0);
  ASSERT_EQ(flock(writer, LOCK_EX | LOCK_NB), 0);  // what HDF5 takes for a writer
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(path); }),
            path +
                ": another process holds it open for writing (its HDF5 file lock): close that writer (an h5py session "
                "in 'a' or 'w' mode?), then start again");
  ::close(writer);
  EXPECT_EQ(TokenDataset::open(path).num_tokens(), c.tokens.size());

  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {  // as a user who may not read it (root reads anything: it becomes nobody)
    if (getuid() == 0 && setuid(65534) != 0) _exit(3);
    const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
    _exit(write(pipe_fds[1], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()) ? 0 : 4);
  }
  ::close(pipe_fds[1]);
  std::string said(4096, '\0');
  const ssize_t n = read(pipe_fds[0], said.data(), said.size());
  said.resize(n > 0 ? static_cast<size_t>(n) : 0);
  ::close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(said, path + ": cannot open: Permission denied");
}

// prepare-data run again over a dataset a job has mapped: the job keeps reading the file it opened.
TEST(DatasetFile, RewriteLeavesAnOpenReaderItsFile) {
  const Corpus a = make_corpus(100000, 6), b = make_corpus(120000, 7);
  const auto path = testing::tmp_path("rewritten.h5").string();
  write_dataset(path, a.tokens, a.offsets, info());
  const TokenDataset old = TokenDataset::open(path);
  const std::string identity = old.identity();
  write_dataset(path, b.tokens, b.offsets, info());
  EXPECT_NO_THROW(old.check_unchanged());  // a new file renamed over the path: the old one is read on, unchanged
  // What a checkpoint saved now records: the file read, not the new one's size beside the old content's checksums.
  EXPECT_EQ(old.identity(), identity);
  const auto kept = old.tokens();
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), a.tokens.begin(), a.tokens.end()));
  const TokenDataset fresh = TokenDataset::open(path);
  const auto now = fresh.tokens();
  EXPECT_TRUE(std::equal(now.begin(), now.end(), b.tokens.begin(), b.tokens.end()));
}

// A file with a user block (512 bytes in front of HDF5's own, as h5jam writes them) is a valid HDF5 file: its tokens
// were mapped 512 bytes too far (the block counted twice) and refused as damaged ("tokens [0, 1048576) do not match
// their checksum"), exit 4.
TEST(DatasetFile, TokensAfterAUserBlockAreMappedWhereTheyAre) {
  const Corpus c = make_corpus(100000, 20);
  const auto plain = testing::tmp_path("plain.h5").string(), blocked = testing::tmp_path("user-block.h5").string();
  write_dataset(plain, c.tokens, c.offsets, info());
  std::ofstream(blocked, std::ios::binary) << std::string(512, '\0') << testing::slurp(plain);
  EXPECT_EQ(tokens_offset(blocked), tokens_offset(plain) + 512);
  const TokenDataset ds = TokenDataset::open(blocked);
  EXPECT_TRUE(ds.mapped());
  const auto all = ds.tokens();
  EXPECT_TRUE(std::equal(all.begin(), all.end(), c.tokens.begin(), c.tokens.end()));
}

// A dataset written at `path` whose modification time is set a day back, so that a rewrite in place, however soon,
// gives it another one (file times tick in jiffies: a write within the same one could keep it).
void write_dated_dataset(const std::string& path, const Corpus& c) {
  write_dataset(path, c.tokens, c.offsets, info());
  const timespec day_ago[2] = {{time(nullptr) - 86400, 0}, {time(nullptr) - 86400, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), day_ago, 0), 0);
}

// A dataset rewritten in place under a job that has it mapped, at the same size (cp of another file onto it): the job
// read the new tokens where it had not checked them yet, without a word. Now its changed modification time has every
// block checked again before its next use: a changed block stops the reader, naming the file; a file only touched
// (a scratch file system's purge policy) reads on. (A change of size is refused at once: the loader test below.)
TEST(DatasetFile, RewriteInPlaceIsCaughtATouchIsNot) {
  const Corpus c = make_corpus(100000, 15);
  const auto path = testing::tmp_path("in-place.h5").string();
  write_dated_dataset(path, c);
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_NO_THROW(ds.check_unchanged());
  const auto all = ds.tokens();  // every block checked once
  const timespec hour_later[2] = {{time(nullptr) - 82800, 0}, {time(nullptr) - 82800, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), hour_later, 0), 0);  // touched: the same tokens
  EXPECT_NO_THROW(ds.check_unchanged());
  EXPECT_TRUE(std::equal(all.begin(), all.end(), c.tokens.begin(), c.tokens.end()));
  EXPECT_EQ(ds.document(0).size(), static_cast<size_t>(c.offsets[1]));
  {  // one token changed where it lies, as a `cp` of another file of the same size writes it
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(tokens_offset(path)));
    const TokenId other = c.tokens[0] ^ 1;
    f.write(reinterpret_cast<const char*>(&other), sizeof other);
  }
  EXPECT_NO_THROW(ds.check_unchanged());  // the size is the same: the tokens will tell
  EXPECT_EQ(testing::data_error_of([&] { ds.document(0); }),
            path +
                ": tokens [0, 100000) are not the ones this run opened: the file was modified in place while the run "
                "reads it; replace a dataset by renaming a new file over it (prepare-data --overwrite does), never in "
                "place (cp onto it), and resume");
}

// Through the loader, as a run meets it: the second source of a mixture truncated after it was opened (its tokens
// past the cut are gone, SIGBUS on a touch). The first micro-batch is refused before any token is read.
TEST(DatasetFile, LoaderStopsOnAFileTruncatedInPlace) {
  const Corpus a = make_corpus(100000, 16), b = make_corpus(100000, 17);
  const auto pa = testing::tmp_path("loader-a.h5").string(), pb = testing::tmp_path("loader-b.h5").string();
  write_dataset(pa, a.tokens, a.offsets, info());
  write_dataset(pb, b.tokens, b.offsets, info());
  auto da = std::make_shared<const TokenDataset>(TokenDataset::open(pa));
  auto db = std::make_shared<const TokenDataset>(TokenDataset::open(pb));
  const auto size = std::filesystem::file_size(pb);
  const uint64_t cut = tokens_offset(pb) + 4096;
  ASSERT_EQ(truncate(pb.c_str(), static_cast<off_t>(cut)), 0);
  Loader loader({{da, 0.5}, {db, 0.5}}, {.seq_len = 64, .micro_batch_size = 4, .global_batch_size = 4});
  const std::string msg = testing::data_error_of([&] { loader.next(); });
  EXPECT_NE(msg.find(fmt::format("{}: the file was rewritten in place while this run reads it ({} bytes, now {}): ", pb,
                                 size, cut)),
            std::string::npos)
      << msg;
}

// What one flipped bit of an integer attribute does to it: the value changes, nothing else in the file does.
void flip_int_attribute(const std::string& path, const char* object, const char* name, int64_t bits) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen_by_name(f, object, name, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  int64_t v = 0;
  ASSERT_GE(H5Aread(a, H5T_NATIVE_INT64, &v), 0);
  v ^= bits;
  ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(a);
  H5Fclose(f);
}

// The case: the EOT id 50256 becomes 50258 (one bit). Before, the file opened and training used another
// separator; now opening names the file, the attribute and what to do.
TEST(DatasetFile, FlippedAttributeBitIsRefusedAtOpen) {
  const Corpus c = make_corpus(100000, 8);
  const auto path = testing::tmp_path("eot-flipped.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  const TokenDataset good = TokenDataset::open(path);
  EXPECT_TRUE(good.metadata_recorded());
  EXPECT_GE(good.metadata_entries(), 20);  // the root's attributes and links, every dataset's layout
  flip_int_attribute(path, ".", "eot_id", 2);
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
  EXPECT_NE(msg.find(path + ": the root group: attribute 'eot_id' does not match the checksum recorded with it"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("prepare the dataset again"), std::string::npos) << msg;
}

// A dataset's type changed (split/train as int32 with the same values, its record kept): the layout no longer matches.
TEST(DatasetFile, ChangedDatasetTypeIsRefusedAtOpen) {
  const Corpus c = make_corpus(100000, 9);
  const auto path = testing::tmp_path("retyped.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  {
    const TokenDataset ds = TokenDataset::open(path);
    const auto train = ds.split_documents(DatasetSplit::Train);
    std::vector<int32_t> narrow(train.begin(), train.end());
    auto f = hdf5::open_file(path, hdf5::FileMode::ReadWrite);
    const std::string record = hdf5::get_attr_string(f, hdf5::kMetadataChecksums, "split/train").value();
    const hid_t fid = static_cast<hid_t>(f.get());
    ASSERT_GE(H5Ldelete(fid, "split/train", H5P_DEFAULT), 0);
    const hsize_t n = narrow.size();
    const hid_t space = H5Screate_simple(1, &n, nullptr);
    const hid_t d = H5Dcreate2(fid, "split/train", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, narrow.data()), 0);
    H5Dclose(d);
    H5Sclose(space);
    hdf5::set_attr(f, hdf5::kMetadataChecksums, record, "split/train");
  }
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
  EXPECT_NE(msg.find("split/train: the dataset's type, shape or layout does not match the checksum recorded with it"),
            std::string::npos)
      << msg;
}

// The record itself damaged: refused too (it cannot vouch for anything any more).
TEST(DatasetFile, DamagedChecksumRecordIsRefused) {
  const Corpus c = make_corpus(50000, 10);
  const auto path = testing::tmp_path("record.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  {
    auto f = hdf5::open_file(path, hdf5::FileMode::ReadWrite);
    std::string record = hdf5::get_attr_string(f, hdf5::kMetadataChecksums).value();
    const size_t at = record.find("attr:vocab_size\":\"") + 19;  // the first hex digit of its checksum
    record[at] = record[at] == '0' ? '1' : '0';
    hdf5::set_attr(f, hdf5::kMetadataChecksums, record);
  }
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
  EXPECT_NE(msg.find("attribute 'vocab_size' does not match"), std::string::npos) << msg;
}

// A file prepared before the checksums existed (no records): opened as before, and said to be unchecked.
TEST(DatasetFile, FileWithoutChecksumsOpensUnchecked) {
  const Corpus c = make_corpus(50000, 11);
  const auto path = testing::tmp_path("unrecorded.h5").string();
  write_dataset(path, c.tokens, c.offsets, info());
  for (const char* object : {".", "tokens", "tokens_checksums", "doc_offsets", "split", "split/train", "split/validation"})
    ASSERT_GE(H5Adelete_by_name(hdf5::open_file(path, hdf5::FileMode::ReadWrite).get(), object, hdf5::kMetadataChecksums,
                                H5P_DEFAULT),
              0)
        << object;
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_FALSE(ds.metadata_recorded());
  EXPECT_EQ(ds.metadata_entries(), 0);
  EXPECT_EQ(ds.num_tokens(), c.tokens.size());
}

// What ranks compare at start: the same content (another file, the same bytes) gives the same identity, one
// token more another.
TEST(DatasetFile, IdentityFollowsTheContent) {
  Corpus c = make_corpus(200000, 12);
  const auto a = testing::tmp_path("identity-a.h5").string(), b = testing::tmp_path("identity-b.h5").string();
  write_dataset(a, c.tokens, c.offsets, info());
  write_dataset(b, c.tokens, c.offsets, info());
  EXPECT_EQ(TokenDataset::open(a).identity(), TokenDataset::open(b).identity());
  c.tokens[1234] ^= 1;
  write_dataset(b, c.tokens, c.offsets, info());
  EXPECT_NE(TokenDataset::open(a).identity(), TokenDataset::open(b).identity());
}

// ExistingOutput::Refuse never writes over a file, and leaves no temporary file beside it.
// A folder is named as one (HDF5 said "no such file" of it).
TEST(DatasetFile, AFolderIsNotADataset) {
  const auto dir = testing::tmp_path("a-folder.h5");
  std::filesystem::create_directories(dir);
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(dir.string()); }),
            dir.string() + ": is a folder, not a dataset file (expected the .h5 file prepare-data wrote)");
  // So is a named pipe (it was "no such file" too).
  const auto pipe = testing::tmp_path("a-pipe.h5").string();
  ASSERT_EQ(mkfifo(pipe.c_str(), 0600), 0);
  EXPECT_EQ(testing::data_error_of([&] { TokenDataset::open(pipe); }),
            pipe + ": is not a regular file (a pipe, socket or device), not a dataset file");
}

TEST(DatasetFile, RefuseKeepsAnExistingFile) {
  const Corpus a = make_corpus(60000, 13), b = make_corpus(70000, 14);
  const auto path = testing::tmp_path("kept.h5").string();
  write_dataset(path, a.tokens, a.offsets, info(), ExistingOutput::Refuse);
  const auto size = std::filesystem::file_size(path);
  try {
    write_dataset(path, b.tokens, b.offsets, info(), ExistingOutput::Refuse);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": already exists"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::file_size(path), size);
  EXPECT_EQ(TokenDataset::open(path).num_tokens(), a.tokens.size());
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(e.path().string().find(path + ".tmp"), std::string::npos) << e.path();
}

// Replaces one byte of a string attribute in place (the same size), as damage would.
void change_string_attribute(const std::string& path, const char* name, size_t at) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t a = H5Aopen_by_name(f, ".", name, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(a, 0);
  const hid_t type = H5Aget_type(a);
  std::string v(H5Tget_size(type), '\0');
  ASSERT_GE(H5Aread(a, type, v.data()), 0);
  ASSERT_LT(at, v.size());
  v[at] = v[at] == 'x' ? 'y' : 'x';
  ASSERT_GE(H5Awrite(a, type, v.data()), 0);
  H5Tclose(type);
  H5Aclose(a);
  H5Fclose(f);
}

// C4's 1024 shards under a cluster path (105 KB of `sources`) and a tokenizer with 3000 special tokens (100 KB of
// `special_tokens`): each passed the 64 KiB of a compact HDF5 attribute, and prepare-data failed at its very end
// ("H5Acreate2 ... object header message is too large", exit 8, the work lost). Dense attributes hold them, they
// read back whole, and the metadata checksums still cover them.
TEST(DatasetFile, MetadataOver64KiBIsStoredAndChecked) {
  const Corpus c = make_corpus(50000, 15);
  DatasetInfo big = info();
  for (int i = 0; i < 1024; ++i)
    big.sources.push_back(fmt::format(
        "/lustre/projects/llm-pretraining/datasets/allenai/c4/en/train/shards/c4-train.{:05d}-of-01024.json.gz", i));
  nlohmann::json specials = nlohmann::json::object();
  for (int i = 0; i < 3000; ++i) specials[fmt::format("<|reserved_special_token_{}|>", i)] = 47257 + i;
  big.special_tokens_json = specials.dump();
  ASSERT_GT(nlohmann::json(big.sources).dump().size(), 100000u);
  ASSERT_GT(big.special_tokens_json.size(), 90000u);
  const auto path = testing::tmp_path("big-metadata.h5").string();
  EXPECT_NO_THROW(check_dataset_metadata_fits(path, big));
  write_dataset(path, c.tokens, c.offsets, big);
  const TokenDataset ds = TokenDataset::open(path);
  EXPECT_TRUE(ds.metadata_recorded());
  EXPECT_EQ(ds.info().sources, big.sources);
  EXPECT_EQ(ds.info().special_tokens_json, big.special_tokens_json);
  EXPECT_EQ(ds.num_tokens(), c.tokens.size());
  // A byte of the last path changed: refused as a changed small attribute is.
  change_string_attribute(path, "sources", nlohmann::json(big.sources).dump().size() - 10);
  const std::string msg = testing::data_error_of([&] { TokenDataset::open(path); });
  EXPECT_NE(msg.find("attribute 'sources' does not match the checksum recorded with it"), std::string::npos) << msg;
}

// A source path that is not UTF-8 (a latin-1 file name) made the JSON of `sources` throw after the whole
// tokenization (type_error 316, exit 1). Its byte is recorded as U+FFFD, as json_recorded gives it.
TEST(DatasetFile, SourcePathThatIsNotUtf8IsRecordedWithAReplacement) {
  const Corpus c = make_corpus(20000, 16);
  DatasetInfo l1 = info();
  l1.sources = {"corpus/caf\xe9.txt", "corpus/b.txt"};
  const auto path = testing::tmp_path("latin1-source.h5").string();
  write_dataset(path, c.tokens, c.offsets, l1);
  const TokenDataset ds = TokenDataset::open(path);
  ASSERT_EQ(ds.info().sources.size(), 2u);
  EXPECT_EQ(ds.info().sources[0], "corpus/caf\xef\xbf\xbd.txt");
  EXPECT_EQ(ds.info().sources[0], json_recorded(l1.sources[0]));
  EXPECT_EQ(ds.info().sources[1], "corpus/b.txt");
  EXPECT_EQ(json_recorded("plain/path.h5"), "plain/path.h5");
  EXPECT_EQ(json_text(nlohmann::json{{"path",
                                      "donn\xe9"
                                      "es.h5"}}),
            "{\"path\":\"donn\xef\xbf\xbd"
            "es.h5\"}");
}
}  // namespace
}  // namespace shardtrain::data
