// runtime/hdf5 helpers (round trips, Fletcher32, attributes, clear errors) and the progress bar's lines.
#include <cstdio>
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

}  // namespace
}  // namespace shardtrain
