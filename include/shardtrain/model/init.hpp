// Counter-based parameter initialization. Element e of parameter p is a pure function of
// (seed, p.stable_id, e): Philox4x32-10 with counter (e, stable_id) and key seed, then a uniform or a
// Box-Muller normal built from that one draw. So any slice of any parameter can be filled alone, on any
// rank, and the model is identical whatever the slicing, the wrap policy or the world size.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "shardtrain/model/spec.hpp"
#include "shardtrain/ops/tensor.hpp"

namespace shardtrain::model {

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
constexpr std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u, kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key = {key[0] + kWeyl0, key[1] + kWeyl1};
  }
  return ctr;
}

// FNV-1a of the parameter's Hugging Face name.
constexpr uint64_t stable_param_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// The initial value of one element, in double (rounded to the storage dtype by the caller).
double init_value(InitKind kind, double scale, uint64_t seed, uint64_t param_id, int64_t element);

// Fills out (numel = count elements, host memory, any float dtype) with elements [first, first + count) of
// the flattened (row-major) parameter. Throws InternalError when the range is outside the parameter.
void init_param_slice(const ParamInfo& param, uint64_t seed, int64_t first, const ops::Tensor& out);

}  // namespace shardtrain::model
