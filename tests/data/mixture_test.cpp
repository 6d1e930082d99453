// Data mixtures (mixture.hpp): the index permutation is a bijection, shares are exact and evenly spread,
// down-weighted sources show every sample before any repeats, up-weighted ones repeat whole passes, one
// source is exactly the plain loader, rows hold the right source's tokens, and resume is exact.
#include <map>
#include <numeric>
#include <set>

#include "data_test_util.hpp"
#include "shardtrain/data/loader.hpp"
#include "shardtrain/data/mixture.hpp"

namespace shardtrain::data {
namespace {

// `docs` documents of `length` tokens whose values encode (tag, document, position); padded samples are
// one document each, so sample d of the source is document d.
std::shared_ptr<const TokenDataset> tagged_dataset(const std::string& name, int tag, size_t docs, size_t length,
                                                   const std::string& tokenizer_hash = "hash-a") {
  std::vector<TokenId> tokens;
  std::vector<int64_t> offsets{0};
  for (size_t d = 0; d < docs; ++d) {
    for (size_t k = 0; k < length; ++k) tokens.push_back(static_cast<TokenId>(100000 * tag + 100 * d + k + 10));
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  return testing::open_synthetic(name, tokens, offsets, 1 << 22, tokenizer_hash);
}

TEST(Mixture, PermuteIndexIsABijectionPerKey) {
  for (uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 64ull, 100ull, 1000ull, 4097ull}) {
    for (uint64_t key : {0ull, 7ull, 0xdeadbeefull}) {
      std::vector<int> hit(n, 0);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t p = permute_index(i, n, key);
        ASSERT_LT(p, n);
        ++hit[p];
      }
      EXPECT_EQ(static_cast<size_t>(std::count(hit.begin(), hit.end(), 1)), n) << "n=" << n << " key=" << key;
    }
  }
  // Different keys give different orders, the same key the same one, and the order is not the identity.
  std::vector<uint64_t> a, b, c;
  for (uint64_t i = 0; i < 1000; ++i)
    a.push_back(permute_index(i, 1000, 1)), b.push_back(permute_index(i, 1000, 2)), c.push_back(permute_index(i, 1000, 1));
  EXPECT_NE(a, b);
  EXPECT_EQ(a, c);
  size_t fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += a[i] == i;
  EXPECT_LT(fixed, 10u);
  EXPECT_THROW(permute_index(5, 5, 0), InternalError);
}

TEST(Mixture, EntriesParseOrNameTheField) {
  auto e = parse_mixture_entry("data/web.h5:0.7", "data.mixture[0]");
  EXPECT_EQ(e.path, "data/web.h5");
  EXPECT_DOUBLE_EQ(e.weight, 0.7);
  e = parse_mixture_entry("odd:name.h5:2", "data.mixture[1]");  // split at the last ':'
  EXPECT_EQ(e.path, "odd:name.h5");
  EXPECT_DOUBLE_EQ(e.weight, 2.0);
  for (const char* bad :
       {"data/web.h5", ":0.5", "data/web.h5:", "web.h5:-1", "web.h5:0", "web.h5:abc", "web.h5:inf", "web.h5:1x"}) {
    try {
      parse_mixture_entry(bad, "data.mixture[3]");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& err) {
      EXPECT_NE(std::string(err.what()).find("data.mixture[3]"), std::string::npos) << err.what();
    }
  }
}

TEST(Mixture, SharesAreExactAndEvenlySpread) {
  const auto a = tagged_dataset("share-a.h5", 1, 300, 4), b = tagged_dataset("share-b.h5", 2, 100, 4),
             c = tagged_dataset("share-c.h5", 3, 37, 4);
  MixedSource mix({{a, 1.0}, {b, 1.0}, {c, 0.5}}, DatasetSplit::Train, BatchLayout::Padded, 8, 5, true);
  ASSERT_EQ(mix.num_samples(), 437u);
  // Shares 0.4, 0.4, 0.2 of 437: 174.8, 174.8, 87.4 -> 175, 175, 87 (the remainder to the largest fractions).
  EXPECT_EQ(mix.samples_per_epoch(0), 175u);
  EXPECT_EQ(mix.samples_per_epoch(1), 175u);
  EXPECT_EQ(mix.samples_per_epoch(2), 87u);
  EXPECT_DOUBLE_EQ(mix.weight(2), 0.2);
  EXPECT_EQ(mix.source_samples(0), 300u);
  // Every prefix holds each source's share to within one sample.
  std::vector<double> count(3, 0);
  for (uint64_t i = 0; i < mix.num_samples(); ++i) {
    ++count[mix.locate(0, i).source];
    for (size_t k = 0; k < 3; ++k) {
      const double expected = static_cast<double>(mix.samples_per_epoch(k)) * static_cast<double>(i + 1) / 437.0;
      ASSERT_LE(std::abs(count[k] - expected), 1.0) << "prefix " << i + 1 << " source " << k;
    }
  }
  EXPECT_EQ(count, (std::vector<double>{175, 175, 87}));
}

TEST(Mixture, DownWeightedSourcesShowEverySampleBeforeRepeatsAndUpWeightedOnesRepeatPasses) {
  const auto big = tagged_dataset("pass-big.h5", 1, 300, 3), small = tagged_dataset("pass-small.h5", 2, 100, 3);
  for (bool shuffle : {true, false}) {
    MixedSource mix({{big, 1.0}, {small, 1.0}}, DatasetSplit::Train, BatchLayout::Padded, 8, 9, shuffle);
    ASSERT_EQ(mix.samples_per_epoch(0), 200u);
    ASSERT_EQ(mix.samples_per_epoch(1), 200u);
    // The big source's stream over epochs 0..2 is 600 draws: two passes, each a permutation of its 300.
    std::vector<uint64_t> big_stream;
    std::vector<std::vector<uint64_t>> small_epochs(3);
    for (uint64_t e = 0; e < 3; ++e)
      for (uint64_t i = 0; i < mix.num_samples(); ++i) {
        const auto d = mix.locate(e, i);
        (d.source == 0 ? big_stream : small_epochs[e]).push_back(d.sample);
      }
    ASSERT_EQ(big_stream.size(), 600u);
    for (size_t pass = 0; pass < 2; ++pass) {
      std::set<uint64_t> seen(big_stream.begin() + static_cast<ptrdiff_t>(pass * 300),
                              big_stream.begin() + static_cast<ptrdiff_t>(pass * 300 + 300));
      EXPECT_EQ(seen.size(), 300u) << "pass " << pass << " shuffle " << shuffle;
      EXPECT_EQ(*seen.rbegin(), 299u);
    }
    // The small source gives each of its 100 samples exactly twice per epoch.
    for (const auto& ep : small_epochs) {
      std::map<uint64_t, int> times;
      for (auto s : ep) ++times[s];
      ASSERT_EQ(times.size(), 100u);
      for (const auto& [s, n] : times) EXPECT_EQ(n, 2) << "sample " << s;
    }
    if (shuffle) {
      EXPECT_NE(std::vector<uint64_t>(big_stream.begin(), big_stream.begin() + 300),
                std::vector<uint64_t>(big_stream.begin() + 300, big_stream.end()))
          << "each pass is its own permutation";
    } else {
      for (size_t j = 0; j < 600; ++j) ASSERT_EQ(big_stream[j], j % 300) << "file order without shuffle";
    }
  }
}

TEST(Mixture, OneSourceIsThePlainSampleSpace) {
  const auto a = tagged_dataset("one.h5", 1, 57, 5);
  MixedSource mix({{a, 3.0}}, DatasetSplit::Train, BatchLayout::Padded, 8, 1, true);
  SampleSource plain(*a, DatasetSplit::Train, BatchLayout::Padded, 8);
  ASSERT_EQ(mix.num_samples(), plain.num_samples());
  std::vector<int32_t> x(8), y(8), d(8), px(8), py(8), pd(8);
  for (uint64_t e : {0ull, 4ull})
    for (uint64_t i = 0; i < mix.num_samples(); ++i) {
      EXPECT_EQ(mix.locate(e, i).sample, i);
      EXPECT_EQ(mix.fill(e, i, x.data(), y.data(), d.data()), 0u);
      plain.fill(i, px.data(), py.data(), pd.data());
      ASSERT_EQ(x, px);
      ASSERT_EQ(y, py);
      ASSERT_EQ(d, pd);
    }
}

TEST(Mixture, RefusesWhatCannotBeMixed) {
  const auto a = tagged_dataset("bad-a.h5", 1, 1000, 3), b = tagged_dataset("bad-b.h5", 2, 10, 3),
             other = tagged_dataset("bad-other.h5", 3, 10, 3, "hash-b");
  try {
    MixedSource({{a, 1.0}, {other, 1.0}}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true);
    ADD_FAILURE() << "two tokenizers were mixed";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad-other.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("same tokenizer"), std::string::npos) << e.what();
  }
  try {  // 1e-5 of 1010 samples is no sample at all
    MixedSource({{a, 1.0}, {b, 1e-5}}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true);
    ADD_FAILURE() << "a share of no sample was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad-b.h5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MixedSource({{a, 1.0}, {b, -1.0}}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true), ConfigError);
  try {  // each weight finite, their sum not: every share was 0 / inf = 0, and the losses means over nothing
    MixedSource({{a, 1e308}, {b, 1e308}}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true);
    ADD_FAILURE() << "weights summing to inf were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.mixture: the weights sum to inf"), std::string::npos) << e.what();
  }
  // Weights near the largest double whose sum is finite mix as their ratio says.
  const MixedSource big({{a, 1e307}, {b, 1e307}}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true);
  EXPECT_DOUBLE_EQ(big.weight(0), 0.5);
  EXPECT_EQ(big.samples_per_epoch(0) + big.samples_per_epoch(1), 1010u);
  EXPECT_THROW(MixedSource({}, DatasetSplit::Train, BatchLayout::Padded, 8, 0, true), ConfigError);
  // A split without samples names its file.
  try {
    MixedSource({{a, 1.0}, {b, 1.0}}, DatasetSplit::Validation, BatchLayout::Padded, 8, 0, true);
    ADD_FAILURE() << "an empty validation split was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad-a.h5"), std::string::npos) << e.what();
  }
}

// The loader over a mixture: each row holds the tokens of the source and sample it reports, packed across
// sources, and a loader started at a saved position continues with exactly the same rows.
TEST(Mixture, LoaderRowsComeFromTheirSourceAndResumeExactly) {
  const auto web = tagged_dataset("mix-web.h5", 1, 120, 37), code = tagged_dataset("mix-code.h5", 2, 40, 11);
  std::vector<MixtureComponent> sources{{web, 0.75}, {code, 0.25}};
  LoaderOptions o;
  o.layout = BatchLayout::Packed;
  o.seq_len = 16;
  o.micro_batch_size = 2;
  o.global_batch_size = 8;
  o.dp_rank = 1;
  o.dp_size = 2;
  o.seed = 3;
  Loader full(sources, o);
  const MixedSource& mix = full.source();
  const SampleSource web_samples(*web, DatasetSplit::Train, BatchLayout::Packed, 16),
      code_samples(*code, DatasetSplit::Train, BatchLayout::Packed, 16);
  std::vector<std::vector<int32_t>> rows;
  std::vector<uint32_t> row_sources;
  std::vector<int32_t> x(16), y(16), d(16);
  const size_t steps = full.micro_batches_per_epoch() + 5;  // into the second epoch
  for (size_t i = 0; i < steps; ++i) {
    MicroBatch mb = full.next();
    for (size_t r = 0; r < 2; ++r) {
      const auto draw = mix.locate(mb.position.epoch, mb.samples[r]);
      ASSERT_EQ(mb.sources[r], draw.source);
      (draw.source == 0 ? web_samples : code_samples).fill(draw.sample, x.data(), y.data(), d.data());
      const std::vector<int32_t> row(mb.tokens.begin() + static_cast<ptrdiff_t>(r * 16),
                                     mb.tokens.begin() + static_cast<ptrdiff_t>(r * 16 + 16));
      ASSERT_EQ(row, x);
      // Tokens carry their dataset's tag: a row never mixes sources (EOT is 1).
      for (int32_t t : row) {
        if (t != 1) {
          ASSERT_EQ(t / 100000, static_cast<int32_t>(draw.source) + 1);
        }
      }
      rows.push_back(row);
      row_sources.push_back(mb.sources[r]);
    }
    full.recycle(std::move(mb));
  }
  // About a quarter of the rows are code (0.25 of the tokens' samples, within the interleave's slack).
  const auto code_rows = static_cast<double>(std::count(row_sources.begin(), row_sources.end(), 1u));
  EXPECT_NEAR(code_rows / static_cast<double>(row_sources.size()), 0.25, 0.1);

  const size_t cut = 7;
  LoaderOptions again = o;
  Loader probe(sources, o);
  for (size_t i = 0; i < cut; ++i) probe.next();
  again.start = probe.position();
  Loader resumed(sources, again);
  for (size_t i = cut; i < steps; ++i) {
    MicroBatch mb = resumed.next();
    for (size_t r = 0; r < 2; ++r) {
      const std::vector<int32_t> row(mb.tokens.begin() + static_cast<ptrdiff_t>(r * 16),
                                     mb.tokens.begin() + static_cast<ptrdiff_t>(r * 16 + 16));
      ASSERT_EQ(row, rows[i * 2 + r]) << "micro-batch " << i << " row " << r;
    }
  }
}

}  // namespace
}  // namespace shardtrain::data
