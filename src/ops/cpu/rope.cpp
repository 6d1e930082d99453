// Rotary position embedding, rotate-half convention (x1 = first half of a head, x2 = second half):
// forward (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); backward applies the transpose (the rotation by
// -angle) to a gradient. Frequencies and angles are formed in the compute type, as Hugging Face does in fp32
// (ops/rope.hpp). rope_qkv_forward/backward do the same between the packed (N, (H + 2 Hkv) Dh) projection of
// q, k, v and the three contiguous tensors attention takes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.hpp"

namespace shardtrain::ops::cpu {
namespace {

// cs[0, half) = cos(pos * inv_freq[i]), cs[half, dh) = sign * sin(pos * inv_freq[i]).
template <typename A>
void rope_angles(A p, const std::vector<A>& inv_freq, A sign, std::vector<A>& cs) {
  const size_t half = inv_freq.size();
  for (size_t i = 0; i < half; ++i) {
    const A angle = p * inv_freq[i];
    cs[i] = std::cos(angle);
    cs[half + i] = sign * std::sin(angle);
  }
}

// One head of dh = 2 * half elements rotated from `in` into `out` (the same pointer: in place).
template <typename T, typename A>
void rotate_head(const T* in, T* out, const std::vector<A>& cs, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const A c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
    const A x1 = load(in[i]), x2 = load(in[i + half]);
    store(out[i], x1 * c - x2 * s);
    store(out[i + half], x2 * c + x1 * s);
  }
}

template <typename T>
void rope_rows(Context& ctx, const Tensor& x, const int32_t* pos, const RopeFrequencies& freq, RopeDirection direction) {
  using A = acc_t<T>;
  const int64_t heads = x.shape[1], dh = x.shape[2], half = dh / 2, n = x.shape[0];
  const std::vector<A> inv_freq = rope_inv_freq<A>(freq, dh);
  const A sign = direction == RopeDirection::Forward ? A(1) : A(-1);
  T* base = x.as<T>();
#pragma omp parallel num_threads(ctx.threads) if (n * heads * dh > (1 << 14))
  {
    std::vector<A> cs(static_cast<size_t>(dh));  // cos in [0, half), signed sin in [half, dh)
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      rope_angles(static_cast<A>(pos[t]), inv_freq, sign, cs);
      for (int64_t h = 0; h < heads; ++h) {
        T* row = base + (t * heads + h) * dh;
        rotate_head(row, row, cs, half);
      }
    }
  }
}

// Token t's packed row of (H + 2 Hkv) heads against its q (H heads), k and v (Hkv heads each): Forward reads the
// packed row and writes the three (q and k rotated), Backward reads the three and writes the packed row (dq and
// dk rotated back). The same angles and arithmetic as rope_rows, so the results are rope's to the bit.
template <typename T>
void rope_qkv_rows(Context& ctx, const QkvDims& dims, T* packed, T* q, T* k, T* v, const int32_t* pos,
                   const RopeFrequencies& freq, RopeDirection direction) {
  using A = acc_t<T>;
  const int64_t n = dims.tokens, heads = dims.heads, kv = dims.kv_heads, dh = dims.head_dim, half = dh / 2;
  const int64_t width = (heads + 2 * kv) * dh;
  const std::vector<A> inv_freq = rope_inv_freq<A>(freq, dh);
  const bool forward = direction == RopeDirection::Forward;
  const A sign = forward ? A(1) : A(-1);
#pragma omp parallel num_threads(ctx.threads) if (n * width > (1 << 14))
  {
    std::vector<A> cs(static_cast<size_t>(dh));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      rope_angles(static_cast<A>(pos[t]), inv_freq, sign, cs);
      T* row = packed + t * width;
      T* qt = q + t * heads * dh;
      T* kt = k + t * kv * dh;
      T* vt = v + t * kv * dh;
      for (int64_t h = 0; h < heads; ++h) {
        if (forward) rotate_head(row + h * dh, qt + h * dh, cs, half);
        else rotate_head(qt + h * dh, row + h * dh, cs, half);
      }
      for (int64_t h = 0; h < kv; ++h) {
        T* packed_k = row + (heads + h) * dh;
        if (forward) rotate_head(packed_k, kt + h * dh, cs, half);
        else rotate_head(kt + h * dh, packed_k, cs, half);
      }
      T* packed_v = row + (heads + kv) * dh;
      if (forward) std::copy(packed_v, packed_v + kv * dh, vt);
      else std::copy(vt, vt + kv * dh, packed_v);
    }
  }
}

const char* const kQkvNames[4] = {"qkv", "q", "k", "v"};
const char* const kDqkvNames[4] = {"dqkv", "dq", "dk", "dv"};

}  // namespace

void rope(Context& ctx, const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) {
  validate_rope(tensor_checks, x, positions);
  dispatch_float(x.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    rope_rows<T>(ctx, x, positions.as<const int32_t>(), freq, direction);
  });
}

void rope_qkv_forward(Context& ctx, const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq, const Tensor& q,
                      const Tensor& k, const Tensor& v) {
  const char* op = "rope_qkv_forward";
  const QkvDims dims = validate_rope_qkv(tensor_checks, op, qkv, positions, q, k, v, kQkvNames);
  dispatch_float(qkv.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    rope_qkv_rows<T>(ctx, dims, qkv.as<T>(), q.as<T>(), k.as<T>(), v.as<T>(), positions.as<const int32_t>(), freq,
                     RopeDirection::Forward);
  });
}

void rope_qkv_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                       const RopeFrequencies& freq, const Tensor& dqkv) {
  const char* op = "rope_qkv_backward";
  const QkvDims dims = validate_rope_qkv(tensor_checks, op, dqkv, positions, dq, dk, dv, kDqkvNames);
  dispatch_float(dqkv.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    rope_qkv_rows<T>(ctx, dims, dqkv.as<T>(), dq.as<T>(), dk.as<T>(), dv.as<T>(), positions.as<const int32_t>(), freq,
                     RopeDirection::Backward);
  });
}

}  // namespace shardtrain::ops::cpu
