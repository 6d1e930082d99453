// Element types shared by every layer, and bf16 storage with round-to-nearest-even conversion.
// bf16 is a storage and communication type: arithmetic converts to fp32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardtrain {

enum class DType : uint8_t { F32, BF16, F64, I32, I64, U32, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}
constexpr bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F64; }
const char* dtype_name(DType t);           // "f32", "bf16", ...
DType parse_dtype(std::string_view name);  // accepts "f32"/"fp32"/"float32", "bf16"/"bfloat16", ...; throws UsageError

// Round-to-nearest-even fp32 -> bf16; NaN stays a (quiet) NaN, infinities stay infinite.
constexpr uint16_t bf16_bits_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
constexpr float float_from_bf16_bits(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

struct bf16 {
  uint16_t bits = 0;
  constexpr bf16() = default;
  constexpr explicit bf16(float f) : bits(bf16_bits_from_float(f)) {}
  static constexpr bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  constexpr operator float() const { return float_from_bf16_bits(bits); }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};
static_assert(sizeof(bf16) == 2);

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint32_t> {
  static constexpr DType value = DType::U32;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};
template <typename T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

// Bulk conversions (vectorizable loops), used by casts on the CPU backend and by tests.
void convert_f32_to_bf16(const float* in, bf16* out, size_t n);
void convert_bf16_to_f32(const bf16* in, float* out, size_t n);

}  // namespace shardtrain
