// kernels/attention_sequences.cu under the SIMT emulator (the launchers and kernels' own source, one fiber per GPU
// thread, under the three warp schedules): the sequence arrays of cuDNN's packed-documents layout against a host
// walk of the same segments (runs split at rows and padding, tiles of 256 tokens crossed, the bound's unused
// entries, the two recorded data errors), the statistics' layout changes, and the zeroing of padding rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "shardtrain/runtime/dtype.hpp"
#include "tests/emulator/simt_emulator.hpp"
// Last: the launchers compiled for the emulator, in namespace shardtrain::kernels_emulated.
#include "tests/kernels/emulated_prelude.hpp"
#include "kernels/attention_sequences.cuh"
#include "kernels/data_error.cuh"

namespace shardtrain {
namespace {

namespace k = ::shardtrain::kernels;  // kernels_emulated (emulated_prelude.hpp)

struct SequenceRun {
  int64_t start, length;
};

// The runs of equal segment >= 0 of each row, row-major: what cuDNN's batch of sequences must be.
std::vector<SequenceRun> host_runs(const std::vector<int32_t>& seg, int64_t batch, int64_t seq) {
  std::vector<SequenceRun> runs;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) {
      const int32_t s = seg[static_cast<size_t>(b * seq + t)];
      if (s < 0) continue;
      if (t > 0 && seg[static_cast<size_t>(b * seq + t - 1)] == s) {
        ++runs.back().length;
      } else {
        runs.push_back(SequenceRun{b * seq + t, 1});
      }
    }
  return runs;
}

struct Arrays {
  std::vector<int32_t> lengths;
  std::vector<int64_t> q, kv, stats;
  k::DataErrorRecord error{};
  explicit Arrays(int64_t count)
      : lengths(static_cast<size_t>(count), -7),
        q(static_cast<size_t>(count + 1), -7),
        kv(static_cast<size_t>(count + 1), -7),
        stats(static_cast<size_t>(count + 1), -7) {
    k::data_error_reset(&error, {});
  }
  k::AttentionSequences view() { return {lengths.data(), q.data(), kv.data(), stats.data()}; }
};

class AttentionSequencesEmulated : public ::testing::TestWithParam<simt_emulator::Schedule> {
 protected:
  void SetUp() override { simt_emulator::set_schedule(GetParam()); }
  void TearDown() override { simt_emulator::set_schedule(simt_emulator::Schedule::Lockstep); }

  // Runs the kernel on `seg` and checks every entry against the host's runs.
  void check(const std::vector<int32_t>& seg, int64_t batch, int64_t seq, int64_t count, const std::string& what) {
    SCOPED_TRACE(what);
    const int64_t H = 6, Hk = 2, D = 8, tokens = batch * seq;
    Arrays a(count);
    k::attention_sequences(seg.data(), k::AttentionSequenceDims{batch, seq, H, Hk, D, count}, a.view(), &a.error, {});
    const std::vector<SequenceRun> runs = host_runs(seg, batch, seq);
    ASSERT_LE(static_cast<int64_t>(runs.size()), count) << "the case's bound";
    EXPECT_EQ(a.error.code, 0);
    for (int64_t i = 0; i <= count; ++i) {
      const auto at = static_cast<size_t>(i);
      const bool used = i < static_cast<int64_t>(runs.size());
      const int64_t start = used ? runs[at].start : tokens;
      if (i < count) {
        EXPECT_EQ(a.lengths[at], used ? runs[at].length : 0) << "length " << i;
      }
      EXPECT_EQ(a.q[at], start * H * D) << "q offset " << i;
      EXPECT_EQ(a.kv[at], start * Hk * D) << "kv offset " << i;
      EXPECT_EQ(a.stats[at], start * H) << "stats offset " << i;
    }
  }
};

TEST_P(AttentionSequencesEmulated, PlainCausalIsOneSequencePerRow) {
  const int64_t B = 3, S = 5, H = 4, Hk = 2, D = 8, count = 4;
  Arrays a(count);
  k::attention_sequences(nullptr, k::AttentionSequenceDims{B, S, H, Hk, D, count}, a.view(), &a.error, {});
  EXPECT_EQ(a.lengths, (std::vector<int32_t>{5, 5, 5, 0}));
  EXPECT_EQ(a.q, (std::vector<int64_t>{0, 5 * H * D, 10 * H * D, 15 * H * D, 15 * H * D}));
  EXPECT_EQ(a.kv, (std::vector<int64_t>{0, 5 * Hk * D, 10 * Hk * D, 15 * Hk * D, 15 * Hk * D}));
  EXPECT_EQ(a.error.code, 0);
  // Lengths alone (cuDNN <= 9.15's padding workaround needs no offsets).
  std::vector<int32_t> lengths(3, -1);
  k::AttentionSequences only{lengths.data(), nullptr, nullptr, nullptr};
  k::attention_sequences(nullptr, k::AttentionSequenceDims{B, S, H, Hk, D, 3}, only, nullptr, {});
  EXPECT_EQ(lengths, (std::vector<int32_t>{5, 5, 5}));
  EXPECT_THROW(k::attention_sequences(nullptr, k::AttentionSequenceDims{B, S, H, Hk, D, 2}, only, nullptr, {}),
               InternalError);
}

TEST_P(AttentionSequencesEmulated, RunsOfDocumentsWithPadding) {
  // Row 0: documents of 3, 1 and 2 tokens, then padding; row 1: padding, a document with row 0's last id (a new
  // run: rows never join), padding, a 1-token document, a last document to the row's end.
  const std::vector<int32_t> seg = {4,  4, 4, 9,  2, 2, -1, -1,  //
                                    -1, 2, 2, -1, 5, 7, 7,  7};
  check(seg, 2, 8, 8, "two short rows");
  check(seg, 2, 8, 6, "the bound equal to the runs");
  std::vector<int32_t> all_padding(16, -1);
  check(all_padding, 2, 8, 4, "all padding");
}

TEST_P(AttentionSequencesEmulated, RunsAcrossTilesOfLongRows) {
  // S = 700: 256-token tiles, runs crossing tile and row boundaries, ids not monotonic, padding tails.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t B = 2, S = 700;
    std::vector<int32_t> seg(static_cast<size_t>(B * S));
    int32_t documents = 0;
    for (int64_t b = 0; b < B; ++b) {
      int64_t t = 0;
      while (t < S) {
        const int64_t len = 1 + static_cast<int64_t>(rng() % (trial == 0 ? 300 : 40));
        const bool pad = rng() % 5 == 0;
        // Ids not monotonic and never reused: 7919 * k mod 10007 is a permutation of [0, 10007).
        const int32_t id = pad ? -1 : static_cast<int32_t>((7919LL * ++documents) % 10007);
        for (int64_t i = 0; i < len && t < S; ++i, ++t) seg[static_cast<size_t>(b * S + t)] = id;
      }
    }
    const int64_t runs = static_cast<int64_t>(host_runs(seg, B, S).size());
    check(seg, B, S, runs + 3, "random runs, trial " + std::to_string(trial));
  }
}

TEST_P(AttentionSequencesEmulated, RecordsTooManyRunsAndSplitDocuments) {
  const int64_t H = 6, Hk = 2, D = 8;
  // Five runs, room for three: the fourth run (index 3, token 6) is recorded; the kept three are right.
  const std::vector<int32_t> five = {1, 1, 2, 2, 3, 3, 4, 5};
  Arrays a(3);
  k::attention_sequences(five.data(), k::AttentionSequenceDims{1, 8, H, Hk, D, 3}, a.view(), &a.error, {});
  EXPECT_EQ(a.error.code, static_cast<int32_t>(k::DataErrorCode::SequenceCount));
  EXPECT_EQ(a.error.value, 3);
  EXPECT_EQ(a.error.index, 6);
  EXPECT_EQ(a.error.bound, 3);
  EXPECT_EQ(a.lengths, (std::vector<int32_t>{2, 2, 2}));
  EXPECT_EQ(a.q, (std::vector<int64_t>{0, 2 * H * D, 4 * H * D, 8 * H * D}));
  // Document 0 twice in row 1 (positions 0-1 and 4-5): the op would join them, the packed layout cannot.
  const std::vector<int32_t> split = {0, 0, 1, 1, 2, 2, 2,  2,  //
                                      0, 0, 3, 3, 0, 0, -1, -1};
  Arrays b(8);
  k::attention_sequences(split.data(), k::AttentionSequenceDims{2, 8, H, Hk, D, 8}, b.view(), &b.error, {});
  EXPECT_EQ(b.error.code, static_cast<int32_t>(k::DataErrorCode::DocumentSplit));
  EXPECT_EQ(b.error.value, 0);
  EXPECT_EQ(b.error.index, 12);
  EXPECT_EQ(b.error.bound, 8);
  // Padding inside a document splits it the same way (the op joins the two parts around the padding).
  const std::vector<int32_t> holed = {6, 6, -1, 6, 8, 8, 8, 8};
  Arrays c(4);
  k::attention_sequences(holed.data(), k::AttentionSequenceDims{1, 8, H, Hk, D, 4}, c.view(), &c.error, {});
  EXPECT_EQ(c.error.code, static_cast<int32_t>(k::DataErrorCode::DocumentSplit));
  EXPECT_EQ(c.error.index, 3);
}

TEST_P(AttentionSequencesEmulated, StatsLayoutChangesAndPaddingRows) {
  const int64_t B = 2, S = 37, H = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  std::vector<int32_t> seg(static_cast<size_t>(B * S));
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = (i % 11 == 3 || i >= seg.size() - 4) ? -1 : static_cast<int32_t>(i / 9);
  std::vector<float> tokens_major(static_cast<size_t>(B * S * H));
  for (float& x : tokens_major) x = dist(rng);
  std::vector<float> lse(static_cast<size_t>(B * H * S), 123.f);
  k::attention_stats_from_tokens(tokens_major.data(), seg.data(), B, S, H, lse.data(), {});
  size_t wrong = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < S; ++t) {
        const float got = lse[static_cast<size_t>((b * H + h) * S + t)];
        const float want =
            seg[static_cast<size_t>(b * S + t)] < 0 ? -INFINITY : tokens_major[static_cast<size_t>((b * S + t) * H + h)];
        wrong += !(got == want);
      }
  EXPECT_EQ(wrong, 0u);
  std::vector<float> back(tokens_major.size(), 7.f);
  k::attention_stats_to_tokens(lse.data(), B, S, H, back.data(), {});
  wrong = 0;
  for (size_t token = 0; token < static_cast<size_t>(B * S); ++token)
    for (size_t h = 0; h < static_cast<size_t>(H); ++h)
      wrong += back[token * H + h] != (seg[token] < 0 ? -INFINITY : tokens_major[token * H + h]);
  EXPECT_EQ(wrong, 0u);

  for (int64_t row : {48, 13}) {  // 16-byte stores, and element by element
    SCOPED_TRACE("row of " + std::to_string(row));
    std::vector<uint16_t> x(static_cast<size_t>(B * S * row));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(1 + i % 1000);
    const std::vector<uint16_t> before = x;
    k::attention_zero_padding_rows(seg.data(), B * S, row, x.data(), {});
    size_t bad = 0;
    for (size_t token = 0; token < static_cast<size_t>(B * S); ++token)
      for (size_t e = 0; e < static_cast<size_t>(row); ++e) {
        const size_t at = token * static_cast<size_t>(row) + e;
        bad += x[at] != (seg[token] < 0 ? 0 : before[at]);
      }
    EXPECT_EQ(bad, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, AttentionSequencesEmulated,
                         ::testing::Values(simt_emulator::Schedule::Lockstep, simt_emulator::Schedule::InOrder,
                                           simt_emulator::Schedule::Reversed),
                         [](const ::testing::TestParamInfo<simt_emulator::Schedule>& info) {
                           switch (info.param) {
                             case simt_emulator::Schedule::Lockstep: return std::string("Lockstep");
                             case simt_emulator::Schedule::InOrder: return std::string("WarpsInOrder");
                             case simt_emulator::Schedule::Reversed: return std::string("WarpsReversed");
                           }
                           return std::string("Unknown");
                         });

}  // namespace
}  // namespace shardtrain
