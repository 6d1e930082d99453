// The element-wise inner loops of the CPU backend that are not GEMMs: the masked softmax rows of attention
// (forward, and backward's recomputed probabilities and ds), the cross-entropy row, and SwiGLU. Each is
// written once, as a template over the compute type A. The fp32 instances are compiled in rows_f32.cpp
// three times, for AVX-512, for AVX2 + FMA and for the baseline x86-64 (SSE2), and the loader picks the
// best one the CPU has (GCC function multiversioning: an ifunc resolved once at start). So the portable
// build runs these loops 8 or 16 lanes wide without -march=native and still starts on any x86-64. The f64
// instances (the gradient checks) are the templates themselves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "vec_exp.hpp"

namespace shardtrain::ops::cpu::rows {

#define ST_ROW_INLINE [[gnu::always_inline]] inline

// One attention row of scores (length n, keys j0..j0+n-1) -> probabilities in place, for a query whose keys
// j0..j0+cend-1 may be visible: with key_seg, only those of segment `own`; keys from cend on get 0. Returns
// the row's log-sum-exp.
template <typename A>
ST_ROW_INLINE A softmax(A* row, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own) {
  const A neg_inf = -std::numeric_limits<A>::infinity();
  if (key_seg) {
#pragma omp simd
    for (int64_t c = 0; c < cend; ++c) row[c] = key_seg[c] == own ? row[c] : neg_inf;
  }
  A m = neg_inf;
#pragma omp simd reduction(max : m)
  for (int64_t c = 0; c < cend; ++c) m = std::max(m, row[c]);
  A l = 0;
#pragma omp simd reduction(+ : l)
  for (int64_t c = 0; c < cend; ++c) {
    const A p = exp_compute(row[c] - m);
    row[c] = p;
    l += p;
  }
  const A inv_l = A(1) / l;
#pragma omp simd
  for (int64_t c = 0; c < cend; ++c) row[c] *= inv_l;
  std::fill(row + cend, row + n, A(0));
  return m + std::log(l);
}

// Attention backward, one row: p = exp(s - lse) where visible (as in softmax), else 0, in place over the
// scores s; ds = p (dp - d) in place over dp. Keys from cend on get 0 in both.
template <typename A>
ST_ROW_INLINE void probs_and_ds(A* p, A* ds, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own, A lse, A d) {
#pragma omp simd
  for (int64_t c = 0; c < cend; ++c) {
    const A pc = !key_seg || key_seg[c] == own ? exp_compute(p[c] - lse) : A(0);
    p[c] = pc;
    ds[c] = pc * (ds[c] - d);
  }
  std::fill(p + cend, p + n, A(0));
  std::fill(ds + cend, ds + n, A(0));
}

// One row of logits z (V) in place, a counted target: returns -log softmax(z)[target]; with grad, z becomes
// scale * (softmax(z) - onehot(target)).
template <typename A>
ST_ROW_INLINE A cross_entropy(A* z, int64_t vocab, int32_t target, A scale, bool grad) {
  const A zt = z[target];
  A m = z[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 1; j < vocab; ++j) m = std::max(m, z[j]);
  A l = 0;
  if (grad) {
#pragma omp simd reduction(+ : l)
    for (int64_t j = 0; j < vocab; ++j) {
      z[j] = exp_compute(z[j] - m);
      l += z[j];
    }
  } else {
#pragma omp simd reduction(+ : l)
    for (int64_t j = 0; j < vocab; ++j) l += exp_compute(z[j] - m);
  }
  const A loss = m + std::log(l) - zt;
  if (!grad) return loss;
  const A f = scale / l;
#pragma omp simd
  for (int64_t j = 0; j < vocab; ++j) z[j] *= f;
  z[target] -= scale;
  return loss;
}

template <typename A>
ST_ROW_INLINE A sigmoid(A x) {
  return A(1) / (A(1) + exp_compute(-x));
}

// out = silu(gate) * up over n elements.
template <typename A>
ST_ROW_INLINE void swiglu_forward(const A* gate, const A* up, A* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// dup = dout silu(gate); dgate = dout up silu'(gate). dgate may be gate and dup may be up (each element is read
// before it is written).
template <typename A>
ST_ROW_INLINE void swiglu_backward(const A* dout, const A* gate, const A* up, A* dgate, A* dup, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A x = gate[i], y = up[i], d = dout[i];
    const A s = sigmoid(x);
    const A silu = x * s;
    dup[i] = d * silu;
    dgate[i] = d * y * (s + silu * (A(1) - s));  // d silu/dx = s (1 + x (1 - s))
  }
}

#undef ST_ROW_INLINE

// The fp32 instances, each built for three instruction sets (rows_f32.cpp). Overloads of the templates: a
// call with float arguments takes these, one with double the templates.
float softmax(float* row, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own);
void probs_and_ds(float* p, float* ds, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own, float lse, float d);
float cross_entropy(float* z, int64_t vocab, int32_t target, float scale, bool grad);
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate, float* dup, int64_t n);

}  // namespace shardtrain::ops::cpu::rows
