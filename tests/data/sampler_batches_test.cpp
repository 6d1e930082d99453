// Sampler, packing/padding and loader: every sample used once per epoch across ranks, reproducible and
// epoch-dependent shuffles, exact save/restore, gap-free packed windows with the right document ids.
#include <numeric>
#include <set>

#include "data_test_util.hpp"
#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/data/sampler.hpp"
#include "shardtrain/runtime/hdf5.hpp"

namespace shardtrain::data {
namespace {

TEST(Sampler, EverySampleOnceAcrossRanks) {
  for (int w : {1, 2, 4}) {
    const size_t n = 1003;
    const int b = 3, accum = 2;
    const int global = b * w * accum;
    std::vector<int> used(n, 0);
    size_t micro = 0;
    for (int r = 0; r < w; ++r) {
      DistributedSampler s({n, b, global, r, w, 42, true});
      micro = s.micro_batches_per_epoch();
      EXPECT_EQ(s.accumulation_steps(), accum);
      EXPECT_EQ(s.global_batches_per_epoch(), n / static_cast<size_t>(global));
      std::vector<uint64_t> out(b);
      for (size_t i = 0; i < micro; ++i) {
        s.micro_batch(0, i, out);
        for (auto x : out) ++used[x];
      }
    }
    const size_t kept = n / static_cast<size_t>(global) * static_cast<size_t>(global);
    EXPECT_EQ(static_cast<size_t>(std::count(used.begin(), used.end(), 1)), kept) << "W=" << w;
    EXPECT_EQ(static_cast<size_t>(std::count(used.begin(), used.end(), 0)), n - kept) << "W=" << w;
    EXPECT_EQ(micro * static_cast<size_t>(b * w), kept);
  }
}

TEST(Sampler, ShufflesDifferByEpochAndRepeatBySeed) {
  DistributedSampler a({500, 4, 8, 1, 2, 7, true}), b({500, 4, 8, 1, 2, 7, true}), c({500, 4, 8, 1, 2, 8, true});
  std::vector<uint64_t> x(4), y(4), z(4);
  std::vector<uint64_t> e0, e1, other_seed;
  for (size_t i = 0; i < 20; ++i) {
    a.micro_batch(0, i, x);
    b.micro_batch(0, i, y);
    EXPECT_EQ(x, y);
    e0.insert(e0.end(), x.begin(), x.end());
    a.micro_batch(1, i, x);
    e1.insert(e1.end(), x.begin(), x.end());
    c.micro_batch(0, i, z);
    other_seed.insert(other_seed.end(), z.begin(), z.end());
  }
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, other_seed);
  DistributedSampler plain({500, 4, 8, 1, 2, 7, false});
  plain.micro_batch(0, 3, x);
  EXPECT_EQ(x, (std::vector<uint64_t>{25, 27, 29, 31}));  // the seed's rank-strided order, unshuffled
  EXPECT_THROW(DistributedSampler({500, 4, 12, 0, 2, 7, true}), ConfigError);
  EXPECT_THROW(DistributedSampler({500, 4, 8, 2, 2, 7, true}), ConfigError);
}

// A step takes the same slice of the epoch's order at any world size and micro-batch size, so a position
// kept as a sample count resumes at the same data on another number of ranks.
TEST(Sampler, SampleCountsMeanTheSameDataAtAnyWorldSize) {
  const size_t n = 500;
  auto step_samples = [&](int b, int w, size_t step) {  // every rank's micro-batches of global step `step`
    std::multiset<uint64_t> out;
    for (int r = 0; r < w; ++r) {
      DistributedSampler s({n, b, 8, r, w, 7, true});
      std::vector<uint64_t> mb(static_cast<size_t>(b));
      const size_t a = static_cast<size_t>(s.accumulation_steps());
      for (size_t j = 0; j < a; ++j) {
        s.micro_batch(1, step * a + j, mb);
        out.insert(mb.begin(), mb.end());
      }
    }
    return out;
  };
  for (size_t step : {0u, 5u, 61u}) {
    const auto two = step_samples(4, 2, step);  // 2 ranks x 4, no accumulation
    EXPECT_EQ(two.size(), 8u);
    EXPECT_EQ(two, step_samples(1, 4, step)) << "4 ranks x 1 x 2 accumulation, step " << step;
    EXPECT_EQ(two, step_samples(8, 1, step)) << "1 rank x 8, step " << step;
  }
  DistributedSampler two({n, 4, 8, 0, 2, 7, true}), four({n, 1, 8, 3, 4, 7, true});
  EXPECT_EQ(two.samples_before({1, 5}), 40u);
  EXPECT_EQ(four.position_after(1, 40), (SamplerPosition{1, 10}));  // 10 micro-steps of 4 ranks x 1
  EXPECT_EQ(four.samples_before({1, 10}), 40u);
  EXPECT_EQ(four.position_after(1, 42), (SamplerPosition{1, 10}));  // rounded down to a micro-step
  EXPECT_EQ(four.micro_batches_per_epoch(), 124u);                  // 62 global batches x 2
  EXPECT_EQ(four.position_after(1, 496), (SamplerPosition{2, 0}));  // past the epoch: the next one
}

// A dataset of small synthetic documents whose token values encode (document, position).
std::shared_ptr<TokenDataset> synthetic_dataset(const std::string& name, std::vector<size_t> lengths) {
  std::vector<TokenId> tokens;
  std::vector<int64_t> offsets{0};
  for (size_t d = 0; d < lengths.size(); ++d) {
    for (size_t k = 0; k < lengths[d]; ++k) tokens.push_back(static_cast<TokenId>(1000 * (d + 1) + k));
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  return testing::open_synthetic(name, tokens, offsets, 1 << 20);
}

TEST(Batches, PackedWindowsCoverStreamWithDocumentIds) {
  const std::vector<size_t> lengths = {5, 1, 9, 3, 17, 2, 8};
  const auto ds = synthetic_dataset("packed.h5", lengths);
  // The stream: doc tokens then EOT(1), document by document.
  std::vector<int32_t> stream, stream_doc;
  for (size_t d = 0; d < lengths.size(); ++d) {
    for (auto t : ds->document(d)) stream.push_back(static_cast<int32_t>(t)), stream_doc.push_back(static_cast<int32_t>(d));
    stream.push_back(1);
    stream_doc.push_back(static_cast<int32_t>(d));
  }
  for (int s : {1, 4, 7, 16}) {
    SampleSource src(*ds, DatasetSplit::Train, BatchLayout::Packed, s);
    EXPECT_EQ(src.num_samples(), (stream.size() - 1) / static_cast<size_t>(s));
    std::vector<int32_t> x(s), y(s), doc(s), covered;
    for (size_t i = 0; i < src.num_samples(); ++i) {
      src.fill(i, x.data(), y.data(), doc.data());
      for (int j = 0; j < s; ++j) {
        const size_t p = i * static_cast<size_t>(s) + static_cast<size_t>(j);
        ASSERT_EQ(x[j], stream[p]) << "s=" << s << " window " << i << " pos " << j;
        ASSERT_EQ(y[j], stream[p + 1]);
        ASSERT_EQ(doc[j], stream_doc[p]);
        covered.push_back(x[j]);
      }
    }
    // No gaps: the inputs are exactly the stream's prefix.
    EXPECT_TRUE(std::equal(covered.begin(), covered.end(), stream.begin()));
    EXPECT_GE(covered.size() + static_cast<size_t>(s), stream.size());
  }
}

TEST(Batches, PaddedLikeTheSeed) {
  const auto ds = synthetic_dataset("padded.h5", {3, 10});
  SampleSource src(*ds, DatasetSplit::Train, BatchLayout::Padded, 6);
  ASSERT_EQ(src.num_samples(), 2u);
  std::vector<int32_t> x(6), y(6), doc(6);
  src.fill(0, x.data(), y.data(), doc.data());  // [BOT] 1000 1001 1002 [EOT] [PAD] [PAD]
  EXPECT_EQ(x, (std::vector<int32_t>{2, 1000, 1001, 1002, 1, 3}));
  EXPECT_EQ(y, (std::vector<int32_t>{1000, 1001, 1002, 1, kIgnoreIndex, kIgnoreIndex}));
  EXPECT_EQ(doc, (std::vector<int32_t>{0, 0, 0, 0, 0, -1}));
  src.fill(1, x.data(), y.data(), doc.data());  // truncated to seq_len + 1
  EXPECT_EQ(x, (std::vector<int32_t>{2, 2000, 2001, 2002, 2003, 2004}));
  EXPECT_EQ(y, (std::vector<int32_t>{2000, 2001, 2002, 2003, 2004, 2005}));
}

TEST(Batches, LayoutStatsCountWhatPaddingCutsAndPads) {
  const auto ds = synthetic_dataset("stats.h5", {3, 10, 5});
  // seq 6 with a BOT: [BOT] doc [EOT] fits 7 positions, so 5 text tokens keep their EOT, 6 appear at most.
  const LayoutStats padded = layout_stats(*ds, DatasetSplit::Train, BatchLayout::Padded, 6);
  EXPECT_EQ(padded.samples, 3u);
  EXPECT_EQ(padded.documents_cut, 1u);  // the 10-token document (the 5-token one ends exactly at the last target)
  EXPECT_EQ(padded.tokens_cut, 4u);     // its tokens 1006..1009 are never an input or a target
  EXPECT_DOUBLE_EQ(padded.padding_fraction, 1.0 - (5.0 + 6.0 + 6.0) / 18.0);  // inputs: 5, 6 and 6 real positions
  const LayoutStats packed = layout_stats(*ds, DatasetSplit::Train, BatchLayout::Packed, 6);
  EXPECT_EQ(packed.samples, (3u + 10u + 5u + 3u - 1u) / 6u);  // the stream with EOTs, minus the last target
  EXPECT_EQ(packed.documents_cut, 0u);
  EXPECT_EQ(layout_stats(*ds, DatasetSplit::Validation, BatchLayout::Packed, 6).samples, 0u);  // no validation split
}

TEST(Loader, ResumeContinuesWithTheSameSamples) {
  std::vector<size_t> lengths;
  for (size_t d = 0; d < 200; ++d) lengths.push_back(5 + d % 23);
  const auto ds = synthetic_dataset("loader.h5", lengths);
  LoaderOptions o;
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.global_batch_size = 8;
  o.dp_rank = 1;
  o.dp_size = 2;
  o.seed = 11;
  Loader full(ds, o);
  const size_t per_epoch = full.micro_batches_per_epoch();
  ASSERT_GT(per_epoch, 10u);
  std::vector<std::vector<int32_t>> reference;
  SamplerPosition saved;
  const size_t stop_at = per_epoch / 2 + 1, total = per_epoch + 7;  // crosses an epoch boundary
  for (size_t i = 0; i < total; ++i) {
    if (i == stop_at) saved = full.position();
    auto mb = full.next();
    reference.emplace_back(mb.tokens.begin(), mb.tokens.end());
    full.recycle(std::move(mb));
  }
  EXPECT_EQ(saved, (SamplerPosition{0, stop_at}));
  EXPECT_EQ(full.position(), (SamplerPosition{1, 7}));
  o.start = saved;
  Loader resumed(ds, o);
  for (size_t i = stop_at; i < total; ++i) {
    auto mb = resumed.next();
    ASSERT_EQ(std::vector<int32_t>(mb.tokens.begin(), mb.tokens.end()), reference[i]) << "micro-batch " << i;
  }
  resumed.seek(SamplerPosition{0, 2});
  auto mb = resumed.next();
  EXPECT_EQ(std::vector<int32_t>(mb.tokens.begin(), mb.tokens.end()), reference[2]);
}

}  // namespace
}  // namespace shardtrain::data
