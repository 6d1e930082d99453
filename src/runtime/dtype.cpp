// dtype names and bulk bf16 conversions.
#include "shardtrain/runtime/dtype.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U32: return "u32";
    case DType::U8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::F32;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f64" || n == "fp64" || n == "float64" || n == "double") return DType::F64;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  if (n == "u32" || n == "uint32") return DType::U32;
  if (n == "u8" || n == "uint8") return DType::U8;
  throw UsageError(fmt::format("unknown dtype '{}' (expected fp32, bf16, fp64, int32, int64, uint32 or uint8)", n));
}

void convert_f32_to_bf16(const float* in, bf16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i].bits = bf16_bits_from_float(in[i]);
}

void convert_bf16_to_f32(const bf16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_from_bf16_bits(in[i].bits);
}

}  // namespace shardtrain
