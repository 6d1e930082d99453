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
#include "shardtrain/train/progress_view.hpp"

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

// A start that finds the file's last line cut off part-way (a process killed inside its write, or a node lost before
// the file system had the line: the tail may be zeros) removes the fragment, so that this start's first line is not
// joined to it: every line of the file stays valid JSON, and the earlier whole lines stay as they were.
TEST(MetricsWriter, AnEarlierStartsLineCutOffPartWayIsRemovedNotJoinedToTheNextOne) {
  const fs::path path = fs::temp_directory_path() / ("shardtrain_metrics_torn_" + std::to_string(::getpid()) + ".jsonl");
  const std::string whole = "{\"kind\":\"train\",\"step\":1}\n{\"kind\":\"train\",\"step\":2}\n";
  for (const std::string& tail :
       {std::string(R"({"kind":"train","step":3,"lo)"), std::string(300, '\0'), std::string(9000, 'x'), std::string()}) {
    fs::remove(path);
    {
      std::ofstream out(path, std::ios::binary);
      out << whole << tail;
    }
    {
      train::MetricsWriter w(path.string());
      w.write(R"({"kind":"train","step":3})");
    }
    std::ifstream in(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, whole + "{\"kind\":\"train\",\"step\":3}\n") << "a tail of " << tail.size() << " bytes";
  }
  // A file of one cut-off line and nothing else: the fragment goes, the file starts with this start's line.
  fs::remove(path);
  {
    std::ofstream out(path, std::ios::binary);
    out << R"({"kind":"tr)";
  }
  {
    train::MetricsWriter w(path.string());
    w.write(R"({"kind":"train","step":1})");
  }
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "{\"kind\":\"train\",\"step\":1}\n");
  fs::remove(path);
}

// The time left in the progress lines: after a resume at step 600 of 1000 and 2 steps in 0.2 s, 398 steps at 0.1 s,
// not 398 steps at 0.2 s / 602 (the run's step number: "eta 0s" for a run with a minute to go).
TEST(ProgressView, TheTimeLeftCountsTheStepsOfThisStartNotTheStepNumber) {
  train::StepMetrics m;
  m.step = 602;
  m.elapsed_s = 0.2;
  EXPECT_NEAR(train::ProgressView::eta_seconds(m, 2, 1000), 39.8, 1e-9);
  m.step = 1000;
  EXPECT_EQ(train::ProgressView::eta_seconds(m, 400, 1000), 0.0);
  // After a rollback the step number goes back while the steps run go on: the mean per step is still this start's.
  m.step = 7;
  m.elapsed_s = 1.1;
  EXPECT_NEAR(train::ProgressView::eta_seconds(m, 11, 10), 0.3, 1e-9);
}

// The training bar on a terminal of 40, 80 and 200 columns: every redraw fits (one column spare), so it replaces the
// last instead of wrapping (an 80-column terminal filled with half-lines of a 155-column bar). A narrow one keeps
// step/total, the loss and the time left, then tokens/s; learning rate, grad norm, MFU and memory go first.
TEST(ProgressView, TheBarFitsTheTerminalKeepingStepLossEtaAndTokensPerSecond) {
  const char* term = std::getenv("TERM");
  const std::string saved_term = term ? term : "";
  ::setenv("TERM", "xterm", 1);  // escape codes: ESC[2K erases the line before each redraw
  train::StepMetrics m;
  m.step = 602;
  m.loss = 6.12345;
  m.lr = 3e-4;
  m.grad_norm = 0.41;
  m.tokens_per_s = 123456;
  m.mfu = 0.42;
  m.peak_mem_bytes = int64_t{2048} << 20;
  m.elapsed_s = 0.2;
  for (const int width : {40, 80, 200}) {
    std::FILE* out = std::tmpfile();
    {
      ProgressBar bar({.label = "train",
                       .total = 1000,
                       .unit = "step",
                       .style = ProgressStyle::Bar,
                       .bar_interval = std::chrono::milliseconds(0),
                       .stream = out,
                       .columns = width});
      train::ProgressView::show_step(bar, m, 2);
    }
    std::rewind(out);
    std::string text(1 << 14, '\0');
    text.resize(std::fread(text.data(), 1, text.size(), out));
    std::fclose(out);
    const std::string erase = "\r\033[2K";
    ASSERT_EQ(text.rfind(erase, 0), 0u) << text;
    for (size_t at = 0; at != std::string::npos;) {
      const size_t next = text.find(erase, at + erase.size());
      std::string line =
          text.substr(at + erase.size(), next == std::string::npos ? std::string::npos : next - at - erase.size());
      if (!line.empty() && line.back() == '\n') line.pop_back();
      EXPECT_LT(line.size(), static_cast<size_t>(width)) << line;
      EXPECT_NE(line.find("602/1000 step"), std::string::npos) << line;
      EXPECT_NE(line.find("loss=6.1235"), std::string::npos) << line;
      EXPECT_TRUE(line.find("eta 40s") != std::string::npos || line.find("in ") != std::string::npos) << line;
      EXPECT_EQ(line.find("tok/s=123456") != std::string::npos, width >= 80) << line;
      EXPECT_EQ(line.find("mfu=42.0%") != std::string::npos, width >= 200) << line;
      EXPECT_EQ(line.find("mem=2048MiB") != std::string::npos, width >= 200) << line;
      at = next;
    }
  }
  if (term) ::setenv("TERM", saved_term.c_str(), 1);
  else ::unsetenv("TERM");
}
