// RoPE: one thread per (token, i < head_dim / 2), grid-stride, rotating pair i of every head of the token with
// one angle; the frequencies come formed on the host (ops/rope.hpp, the CPU backend's own) as a kernel parameter,
// the angle in fp32 with the accurate sincosf (not the fast intrinsic), to stay close to the CPU backend at long
// positions. The heads share the angle, so it is computed once per token and pair, not once per head (the
// accurate sincosf costs more than the pair's memory traffic).
#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

struct InvFreq {  // by value: 512 bytes of kernel parameters, read from the constant bank
  float v[kRopeMaxPairs];
};

template <typename T>
ST_GLOBAL void rope_kernel(T* __restrict__ x, const int32_t* __restrict__ positions, int64_t tokens, int64_t heads,
                           int64_t head_dim, InvFreq freq, float sign) {
  const int64_t half = head_dim / 2;
  const int64_t total = tokens * half;
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t idx = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); idx < total; idx += stride) {
    const int64_t i = idx % half;
    const int64_t t = idx / half;
    const float angle = static_cast<float>(positions[t]) * freq.v[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= sign;
    for (int64_t h = 0; h < heads; ++h) {
      T* row = x + (t * heads + h) * head_dim;
      const float x1 = to_f32(row[i]), x2 = to_f32(row[i + half]);
      row[i] = from_f32<T>(x1 * c - x2 * s);
      row[i + half] = from_f32<T>(x2 * c + x1 * s);
    }
  }
}

}  // namespace

void rope(DType dtype, void* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
          const float* inv_freq, RopeDirection direction, StreamRef stream) {
  if (head_dim % 2 != 0) throw InternalError("rope: head_dim " + std::to_string(head_dim) + " is odd");
  if (head_dim / 2 > kRopeMaxPairs)
    throw InternalError("rope: head_dim " + std::to_string(head_dim) + " above " + std::to_string(2 * kRopeMaxPairs));
  const int64_t total = tokens * (head_dim / 2);
  if (total <= 0 || heads <= 0) return;
  const float sign = direction == RopeDirection::Forward ? 1.0f : -1.0f;
  InvFreq freq{};
  for (int64_t i = 0; i < head_dim / 2; ++i) freq.v[i] = inv_freq[i];
  detail::dispatch_float(dtype, "rope", [&](auto tag) {
    using T = typename decltype(tag)::type;
    simt::launch(rope_kernel<T>, detail::grid_for(total, kThreads), kThreads, 0, detail::cuda_stream(stream),
                 static_cast<T*>(x), positions, tokens, heads, head_dim, freq, sign);
    ST_CHECK_KERNEL("rope_kernel");
  });
}

}  // namespace shardtrain::kernels
