// Rotary position embedding, rotate-half convention (x1 = first half of a head, x2 = second half):
// forward (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); backward applies the transpose (the rotation by
// -angle) to a gradient. Frequencies and angles are formed in the compute type, as Hugging Face does in fp32
// (ops/rope.hpp).
#include <cmath>
#include <vector>

#include "kernels.hpp"

namespace shardtrain::ops::cpu {
namespace {

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
      const A p = static_cast<A>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const A angle = p * inv_freq[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = std::cos(angle);
        cs[static_cast<size_t>(half + i)] = sign * std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* row = base + (t * heads + h) * dh;
        for (int64_t i = 0; i < half; ++i) {
          const A c = cs[static_cast<size_t>(i)], s = cs[static_cast<size_t>(half + i)];
          const A x1 = load(row[i]), x2 = load(row[i + half]);
          store(row[i], x1 * c - x2 * s);
          store(row[i + half], x2 * c + x1 * s);
        }
      }
    }
  }
}

}  // namespace

void rope(Context& ctx, const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction) {
  validate_rope(tensor_checks, x, positions);
  dispatch_float(x.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    rope_rows<T>(ctx, x, positions.as<const int32_t>(), freq, direction);
  });
}

}  // namespace shardtrain::ops::cpu
