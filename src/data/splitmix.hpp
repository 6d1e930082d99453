// The data layer's generator: splitmix64, chosen because it is a few integer operations with no state beyond
// one word, so every platform and standard library draws the same numbers (std::mt19937 does too, but the
// distributions over it do not). Internal to src/data.
#pragma once

#include <cstdint>

namespace shardtrain::data::detail {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return mix64(state += 0x9e3779b97f4a7c15ull); }
  uint64_t below(uint64_t bound) {  // unbiased in [0, bound), by rejection
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % bound;
  }
};

}  // namespace shardtrain::data::detail
