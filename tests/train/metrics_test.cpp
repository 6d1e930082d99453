// metrics.jsonl on a file system that refuses a write: the line is dropped whole (a partial write is cut off
// again), nothing is thrown, and the next line that can be written is preceded by a metrics_gap line counting
// the lost ones, so every line of the file stays valid JSON. The refusal is real: the process's file size
// limit (RLIMIT_FSIZE) makes the kernel answer EFBIG part-way through a line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardtrain/train/metrics.hpp"

using namespace shardtrain;
namespace fs = std::filesystem;

TEST(MetricsWriter, ALineTheFileSystemRefusesIsDroppedWholeAndCounted) {
  const fs::path path = fs::temp_directory_path() / ("shardtrain_metrics_test_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(path);
  std::signal(SIGXFSZ, SIG_IGN);  // as shardtrain's main does
  {
    train::MetricsWriter w(path.string());
    w.write(R"({"kind":"train","step":1})");
    const auto size = fs::file_size(path);
    rlimit old{};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    rlimit small = old;
    small.rlim_cur = size + 10;  // room for 10 more bytes: the next line is written in part, then refused
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    EXPECT_NO_THROW(w.write(R"({"kind":"train","step":2,"loss":6.25,"note":"longer than ten bytes"})"));
    EXPECT_EQ(fs::file_size(path), size) << "the partial line is cut off again";
    EXPECT_EQ(w.dropped(), 1);
    EXPECT_NO_THROW(w.write(R"({"kind":"train","step":3})"));
    EXPECT_EQ(w.dropped(), 2);
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
    w.write(R"({"kind":"train","step":4})");
    EXPECT_EQ(w.dropped(), 0);
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    ASSERT_TRUE(nlohmann::json::accept(line)) << line;
    lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["kind"], "metrics_gap");
  EXPECT_EQ(lines[1]["dropped"], 2);
  EXPECT_EQ(lines[2]["step"], 4);
  fs::remove(path);
}
