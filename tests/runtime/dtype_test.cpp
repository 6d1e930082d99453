// bf16 round-to-nearest-even conversion, checked on hand-computed bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

using namespace shardtrain;

namespace {
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
}  // namespace

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 256.0f, 0.15625f, 3.0e38f}) {
    const bf16 b(f);
    if (std::bit_cast<uint32_t>(f) & 0xffffu) continue;  // only values with an exact bf16 form
    EXPECT_EQ(static_cast<float>(b), f);
  }
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16(-2.0f).bits, 0xc000);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1.0 + half an ulp of bf16 (0x3f808000) is a tie: rounds to even (0x3f80).
  EXPECT_EQ(bf16(from_bits(0x3f808000u)).bits, 0x3f80);
  // 0x3f818000 is a tie above an odd mantissa: rounds up to 0x3f82.
  EXPECT_EQ(bf16(from_bits(0x3f818000u)).bits, 0x3f82);
  // Just above the tie rounds up, just below rounds down.
  EXPECT_EQ(bf16(from_bits(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(bf16(from_bits(0x3f807fffu)).bits, 0x3f80);
  // Rounding can carry into the exponent: the largest mantissa rounds up to the next power of two.
  EXPECT_EQ(bf16(from_bits(0x3fffffffu)).bits, 0x4000);
  // Overflow past the largest finite bf16 becomes infinity.
  EXPECT_EQ(bf16(from_bits(0x7f7fffffu)).bits, 0x7f80);
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  const bf16 nan(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(static_cast<float>(nan)));
  // A signalling NaN whose payload sits only in the low bits must not turn into infinity.
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(from_bits(0x7f800001u)))));
  // Denormals keep their (truncated-and-rounded) value.
  EXPECT_EQ(bf16(from_bits(0x00010000u)).bits, 0x0001);
}

TEST(Bf16, BulkConversionsMatchScalar) {
  std::vector<float> in(1001);
  for (size_t i = 0; i < in.size(); ++i) in[i] = std::sin(static_cast<float>(i)) * 1000.0f;
  std::vector<bf16> mid(in.size());
  std::vector<float> out(in.size());
  convert_f32_to_bf16(in.data(), mid.data(), in.size());
  convert_bf16_to_f32(mid.data(), out.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(mid[i].bits, bf16(in[i]).bits);
    EXPECT_NEAR(out[i], in[i], std::abs(in[i]) * (1.0f / 256.0f));  // 8 bits of mantissa
  }
}

TEST(DType, NamesParseBack) {
  for (DType t : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64, DType::U32, DType::U8}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  }
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_THROW(parse_dtype("fp8"), UsageError);
}
