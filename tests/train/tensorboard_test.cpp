// TensorBoard event files at the unit level: the TFRecord frame (layout and the masked CRC-32C, against the
// CRC-32C check value of the standard's "123456789"), the scalars a metrics line maps to, and a record the
// file system refuses being dropped whole. tensorboard_cli_test.py reads a training run's files back with an
// independent decoder.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "shardtrain/train/metrics.hpp"
#include "shardtrain/train/tensorboard.hpp"

using namespace shardtrain;
namespace fs = std::filesystem;

namespace {
uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + static_cast<size_t>(i)])) << (8 * i);
  return v;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The records of an event file, each checked for its length and both CRCs.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    if (at + 12 > file.size()) {
      ADD_FAILURE() << "a torn header at " << at;
      break;
    }
    const uint64_t n = le(file, at, 8);
    EXPECT_EQ(le(file, at + 8, 4), train::masked_crc32c(std::string_view(file).substr(at, 8)));
    if (at + 16 + n > file.size()) {
      ADD_FAILURE() << "a torn record at " << at;
      break;
    }
    out.push_back(file.substr(at + 12, n));
    EXPECT_EQ(le(file, at + 12 + n, 4), train::masked_crc32c(out.back()));
    at += 16 + n;
  }
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path());
  return out;
}
}  // namespace

TEST(TensorBoard, MaskedCrc32cOfTheCheckString) {
  EXPECT_EQ(train::masked_crc32c("123456789"), mask(0xe3069283u));  // CRC-32C's published check value
  EXPECT_EQ(train::masked_crc32c(""), mask(0u));
}

TEST(TensorBoard, RecordFrame) {
  const std::string data = "\x08\x01 some event bytes";
  const std::string r = train::tfrecord(data);
  ASSERT_EQ(r.size(), data.size() + 16);
  EXPECT_EQ(le(r, 0, 8), data.size());
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(le(r, 8, 4), train::masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(le(r, 12 + data.size(), 4), train::masked_crc32c(data));
}

TEST(TensorBoard, ScalarsOfAMetricsLine) {
  int64_t step = -1;
  auto s = train::tensorboard_scalars(
      R"({"kind":"train","step":7,"loss":2.5,"grad_norm":null,"skipped":true,"skip_reason":"nonfinite","lr":0.001,)"
      R"("comm_bytes":{"shard":1024,"replicate":0,"world":16}})",
      &step);
  EXPECT_EQ(step, 7);
  std::map<std::string, double> got;
  for (const auto& x : s) got[x.tag] = x.value;
  const std::map<std::string, double> want = {{"train/loss", 2.5},
                                              {"train/lr", 0.001},
                                              {"train/comm_bytes/shard", 1024},
                                              {"train/comm_bytes/replicate", 0},
                                              {"train/comm_bytes/world", 16}};
  EXPECT_EQ(got, want) << "numbers only: no step, no null (a NaN), no string, no boolean";

  s = train::tensorboard_scalars(
      R"({"kind":"eval","step":30,"val_loss":5.5,"val_loss_by_source":{"a.h5":5.25,"b.h5":null}})", &step);
  got.clear();
  for (const auto& x : s) got[x.tag] = x.value;
  EXPECT_EQ(step, 30);
  EXPECT_EQ(got, (std::map<std::string, double>{{"eval/val_loss", 5.5}, {"eval/val_loss_by_source/a.h5", 5.25}}));

  for (const char* other :
       {R"({"kind":"rollback","step":5,"to_step":2})", R"({"kind":"train","loss":1})", "not json", R"([1,2])"})
    EXPECT_TRUE(train::tensorboard_scalars(other, &step).empty()) << other;
}

TEST(TensorBoard, MetricsWriterWritesBothFilesAndTensorBoardCanBeOff) {
  const fs::path dir = fresh_dir("shardtrain_tensorboard_test");
  {
    train::MetricsWriter w((dir / "metrics.jsonl").string(), dir.string());
    ASSERT_NE(w.tensorboard(), nullptr);
    w.write(R"({"kind":"train","step":1,"loss":8.25})");
    w.write(R"({"kind":"checkpoint_failed","step":1})");
    w.write(R"({"kind":"train","step":2,"loss":7.5})");
    // Both in their files when write returns: nothing is buffered.
    const auto files = event_files(dir);
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(records(read_all(files[0])).size(), 3u) << "file version, step 1, step 2";
  }
  // A second writer in the same second gets its own file.
  {
    train::TensorBoardWriter a(dir.string()), b(dir.string());
    EXPECT_NE(a.path(), b.path());
  }
  const fs::path off = fresh_dir("shardtrain_tensorboard_test_off");
  {
    train::MetricsWriter w((off / "metrics.jsonl").string());
    EXPECT_EQ(w.tensorboard(), nullptr);
    w.write(R"({"kind":"train","step":1,"loss":8.25})");
  }
  EXPECT_TRUE(event_files(off).empty());
  fs::remove_all(dir);
  fs::remove_all(off);
}

// As metrics.jsonl's: the file size limit (RLIMIT_FSIZE) makes the kernel refuse a record part-way through;
// the file is cut back to whole records, nothing is thrown, and the next record that fits is written.
TEST(TensorBoard, ARecordTheFileSystemRefusesIsDroppedWhole) {
  const fs::path dir = fresh_dir("shardtrain_tensorboard_refused");
  std::signal(SIGXFSZ, SIG_IGN);  // as shardtrain's main does
  {
    train::TensorBoardWriter w(dir.string());
    w.write_scalars(1, {{"train/loss", 8.0}});
    const auto size = fs::file_size(w.path());
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    rlimit small = old;
    small.rlim_cur = size + 10;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    EXPECT_NO_THROW(w.write_scalars(2, {{"train/loss", 7.0}}));
    EXPECT_EQ(fs::file_size(w.path()), size) << "the partial record is cut off again";
    EXPECT_EQ(w.dropped(), 1);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    w.write_scalars(3, {{"train/loss", 6.0}});
    EXPECT_EQ(w.dropped(), 0);
    EXPECT_EQ(records(read_all(w.path())).size(), 3u) << "file version, step 1, step 3";
  }
  fs::remove_all(dir);
}
