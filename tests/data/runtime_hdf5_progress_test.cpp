// runtime/hdf5 helpers (round trips, Fletcher32, attributes, clear errors) and the progress bar's lines.
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "data_test_util.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace shardtrain {
namespace {

TEST(Hdf5, RoundTripsDatasetsAndAttributes) {
  const auto path = data::testing::tmp_path("rt.h5").string();
  {
    auto f = hdf5::create_file(path);
    const std::vector<uint32_t> u{1, 2, 4000000000u};
    const std::vector<int64_t> i{-5, 0, 1ll << 40};
    const std::vector<float> x{0.5f, -1.25f};
    hdf5::write_u32(f, "u", u, {.chunk_elements = 2, .checksum = hdf5::Checksum::Fletcher32});
    auto g = hdf5::create_group(f, "g");
    hdf5::write_i64(g, "i", i);
    hdf5::write_f32(f, "x", x);
    hdf5::set_attr(f, "name", std::string("shard ✓"));
    hdf5::set_attr(f, "count", int64_t{-42}, "u");
  }
  auto f = hdf5::open_file(path, hdf5::FileMode::ReadOnly);
  EXPECT_EQ(hdf5::read_u32(f, "u"), (std::vector<uint32_t>{1, 2, 4000000000u}));
  EXPECT_EQ(hdf5::read_i64(f, "g/i"), (std::vector<int64_t>{-5, 0, 1ll << 40}));
  EXPECT_EQ(hdf5::read_f32(f, "x"), (std::vector<float>{0.5f, -1.25f}));
  std::vector<uint32_t> part(2);
  hdf5::read_u32_range(f, "u", 1, part);
  EXPECT_EQ(part, (std::vector<uint32_t>{2, 4000000000u}));
  EXPECT_EQ(hdf5::get_attr_string(f, "name"), "shard ✓");
  EXPECT_EQ(hdf5::get_attr_int(f, "count", "u"), -42);
  EXPECT_FALSE(hdf5::get_attr_int(f, "absent").has_value());
  EXPECT_TRUE(hdf5::exists(f, "g/i"));
  EXPECT_FALSE(hdf5::exists(f, "nope/i"));
  try {
    hdf5::read_u32(f, "missing");
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("'missing' is missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hdf5::read_f32(f, "u"), DataError);
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::FILE* out = std::tmpfile();
  {
    ProgressBar bar({.label = "tok",
                     .total = 100,
                     .unit = "MB",
                     .style = ProgressStyle::Lines,
                     .line_interval = std::chrono::milliseconds(0),
                     .stream = out});
    bar.set_field("loss", "2.5");
    bar.advance(50);
    bar.advance(50);
  }
  std::rewind(out);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  EXPECT_NE(text.find("tok  50% 50/100 MB"), std::string::npos) << text;
  EXPECT_NE(text.find("100% 100/100 MB"), std::string::npos) << text;
  EXPECT_NE(text.find("loss=2.5"), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(format_duration(3725), "1h02m");
  EXPECT_EQ(format_duration(187), "3m07s");
}

// A bar that starts part-way (a resumed training run at step 600 of 1000, 2 steps in 0.2 s of its loop): its rate and
// ETA count the steps made in that time, not the 600 before, which once gave "eta 0s" to a run with 40 s left, nor
// the time before its first step (a checkpoint being loaded).
TEST(Progress, TheRateCountsOnlyWhatWasMadeInTheTimeGiven) {
  std::FILE* out = std::tmpfile();
  {
    ProgressBar bar({.label = "train",
                     .total = 1000,
                     .unit = "step",
                     .style = ProgressStyle::Lines,
                     .line_interval = std::chrono::milliseconds(0),
                     .stream = out});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the bar's own clock: not the rate's
    bar.set(602, 2, 0.2);
  }
  std::rewind(out);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  EXPECT_NE(text.find("train  60% 602/1000 step 10 step/s eta 40s"), std::string::npos) << text;
}

std::string read_back(std::FILE* out) {
  std::rewind(out);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  return text;
}

// The pieces of a training bar (progress_view.cpp's ranks), in the order shown.
std::vector<ProgressPiece> training_pieces() {
  return {{"train", kProgressLabelRank},
          {"", kProgressBarRank, 0.6},
          {" 60%", kProgressPercentRank},
          {"602/1000 step", kProgressCountRank},
          {"10 step/s", kProgressRateRank},
          {"eta 40s", kProgressEtaRank},
          {"loss=6.1234", 1},
          {"lr=3.00e-04", kProgressFieldRank},
          {"gnorm=0.41", kProgressFieldRank},
          {"tok/s=123456", 3},
          {"mfu=42.0%", kProgressFieldRank},
          {"mem=2048MiB", kProgressFieldRank},
          {"val=5.9876", 6}};
}

// An 80-column terminal got a 155-column bar: every redraw wrapped, and the screen filled with stale half-lines.
// The line fits the width given; what goes first is the highest rank, so a piece is shown only when every piece
// ranked before it is (step/total, then the loss, the time left, tokens/s, ...).
TEST(Progress, TheLineFitsTheWidthDroppingTheHighestRanksFirst) {
  const std::vector<ProgressPiece> pieces = training_pieces();
  for (const size_t width : {size_t{40}, size_t{80}, size_t{200}}) {
    const std::string line = fit_progress_line(pieces, width);
    EXPECT_LE(line.size(), width) << line;
    int worst_kept = -1, best_dropped = 1000;
    for (const ProgressPiece& p : pieces) {
      const bool kept = p.bar_fraction >= 0 ? line.find('[') != std::string::npos : line.find(p.text) != std::string::npos;
      if (kept) worst_kept = std::max(worst_kept, p.rank);
      else best_dropped = std::min(best_dropped, p.rank);
    }
    EXPECT_LT(worst_kept, best_dropped) << width << ": " << line;
    EXPECT_NE(line.find("602/1000 step"), std::string::npos) << line;
    EXPECT_NE(line.find("loss=6.1234"), std::string::npos) << line;
    EXPECT_NE(line.find("eta 40s"), std::string::npos) << line;
    if (width >= 80) {
      EXPECT_NE(line.find("tok/s=123456"), std::string::npos) << line;
    }
    if (width == 80) {  // of 80 columns the line uses most: nothing dropped that would have fitted
      EXPECT_GE(line.size(), 70u) << line;
    }
  }
  EXPECT_EQ(fit_progress_line(pieces, 40), "602/1000 step eta 40s loss=6.1234");
  // Wide enough for everything: all of it, the bar at its widest (30 columns inside its brackets).
  const std::string wide = fit_progress_line(pieces, 200);
  EXPECT_NE(wide.find("train [" + std::string(18, '#') + std::string(12, '.') +
                      "]  60% 602/1000 step 10 step/s eta 40s "
                      "loss=6.1234 lr=3.00e-04 gnorm=0.41 tok/s=123456 mfu=42.0% mem=2048MiB val=5.9876"),
            std::string::npos)
      << wide;
  // Narrower than the most important piece: that piece, cut.
  EXPECT_EQ(fit_progress_line(pieces, 5), "602/1");
  EXPECT_EQ(fit_progress_line(pieces, 0), "");
}

// Emacs' shell and some CI viewers say TERM=dumb: escape codes show there as text, so "auto" draws plain lines; so
// without a TERM at all. A bar asked for by name is drawn there all the same, redrawn with \r and spaces only.
TEST(Progress, ATerminalWithoutEscapeCodesGetsPlainLines) {
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Auto, true, "xterm-256color"), ProgressStyle::Bar);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Auto, true, "dumb"), ProgressStyle::Lines);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Auto, true, nullptr), ProgressStyle::Lines);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Auto, true, ""), ProgressStyle::Lines);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Auto, false, "xterm"), ProgressStyle::Lines);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Bar, true, "dumb"), ProgressStyle::Bar);
  EXPECT_EQ(resolve_progress_style(ProgressStyle::Off, true, "xterm"), ProgressStyle::Off);

  const char* term = std::getenv("TERM");
  const std::string saved = term ? term : "";
  ::setenv("TERM", "dumb", 1);
  std::FILE* out = std::tmpfile();
  {
    ProgressBar bar({.label = "tok",
                     .total = 1000,
                     .unit = "MB",
                     .style = ProgressStyle::Bar,
                     .bar_interval = std::chrono::milliseconds(0),
                     .stream = out,
                     .columns = 200});
    bar.set_field("note", "a long value that the second draw has no more");
    bar.set(10);
    bar.set_field("note", "x");
    bar.set(20);
  }
  if (term) ::setenv("TERM", saved.c_str(), 1);
  else ::unsetenv("TERM");
  const std::string text = read_back(out);
  EXPECT_EQ(text.find('\033'), std::string::npos) << text;
  // Each redraw covers what the one before drew: its line padded with spaces to that one's length.
  std::vector<std::string> draws;
  for (size_t at = 0, next; at < text.size(); at = next) {
    next = text.find('\r', at + 1);
    if (next == std::string::npos) next = text.size();
    draws.push_back(text.substr(at, next - at));
  }
  ASSERT_EQ(draws.size(), 3u) << text;  // the two sets and the final draw
  size_t previous = 0;
  for (const std::string& d : draws) {
    ASSERT_EQ(d[0], '\r') << d;
    const std::string line = d.substr(1, d.find('\n') - 1);
    EXPECT_LE(line.size(), 199u) << line;
    EXPECT_GE(line.size(), previous) << line;
    previous = line.find_last_not_of(' ') + 1;
  }
  EXPECT_NE(draws[0].find("note=a long"), std::string::npos) << draws[0];
  EXPECT_LT(previous, draws[0].size() - 1) << "the later draws are shorter: " << text;
}

// Not a terminal (a pty given no size, here a file): COLUMNS when it is a positive number, else 80.
TEST(Progress, TheWidthIsColumnsWhenTheStreamSaysNone) {
  const char* columns = std::getenv("COLUMNS");
  const std::string saved = columns ? columns : "";
  std::FILE* out = std::tmpfile();
  ::setenv("COLUMNS", "123", 1);
  EXPECT_EQ(terminal_columns(out), 123);
  for (const char* bad : {"0", "-5", "abc", "80x", ""}) {
    ::setenv("COLUMNS", bad, 1);
    EXPECT_EQ(terminal_columns(out), 80) << bad;
  }
  ::unsetenv("COLUMNS");
  EXPECT_EQ(terminal_columns(out), 80);
  if (columns) ::setenv("COLUMNS", saved.c_str(), 1);
  std::fclose(out);
}

}  // namespace
}  // namespace shardtrain
