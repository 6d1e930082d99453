// exp(x) for fp32 in plain arithmetic that the compiler vectorizes inside `#pragma omp simd` loops (glibc's
// expf is a call, one element at a time, unless -ffast-math, which this backend does not use). The softmax of
// the CPU attention and the SiLU of SwiGLU spend most of their time here.
//
// Method: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2; exp(r) by its Taylor series to degree 7
// (truncation error r^8 / 8! <= 5.3e-9 relative, below fp32's half ulp), times 2^n built in the exponent
// bits. Rounding to an integer adds and subtracts 1.5 * 2^23, which needs no SSE4.1 rounding instruction.
// Measured against glibc's expf over [-87, 88] (tests/ops/vec_exp_test.cpp): at most 2 ulp apart.
// Edges: exp(-inf) = 0, and so is anything below -86.9 (true results under 1.7e-38, near fp32's subnormals:
// a softmax or SiLU term that small is nothing next to the others); above the largest x whose exp is finite,
// +inf; NaN stays NaN.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace shardtrain::ops::cpu {

inline float vexp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 significant bits, so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: t + kRound rounds t to an integer in the low mantissa bits
  constexpr float kLow = -86.9f;         // n >= -125 from here on, so 2^(n - 1) below is a normal fp32
  constexpr float kHigh = 88.7228317f;   // the largest fp32 x with a finite exp(x)
  const float xc = x < kLow ? kLow : (x > kHigh ? kHigh : x);
  const float shifted = xc * kLog2e + kRound;
  const float n = shifted - kRound;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  // 1 + r + r^2/2! + ... + r^7/7!, Horner's rule.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n for n in [-125, 128] as 2^(n - 1) * 2 (2^128 itself is no fp32; both products are exact scalings).
  const float scale = std::bit_cast<float>((ni + 126) << 23);
  const float y = p * scale * 2.0f;
  const float out = x < kLow ? 0.0f : (x > kHigh ? __builtin_inff() : y);
  return x != x ? x : out;
}

// exp in the compute type: vexp for fp32, std::exp for f64 (the gradient checks' precision).
template <typename A>
inline A exp_compute(A x) {
  if constexpr (std::is_same_v<A, float>) return vexp(x);
  else return std::exp(x);
}

}  // namespace shardtrain::ops::cpu
