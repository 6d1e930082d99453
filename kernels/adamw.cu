// The fused AdamW update: one block per chunk of the chunk table (grid-stride over chunks past the grid),
// float4 loads and stores where the chunk's four arrays share a 16-byte alignment (a scalar head of at
// most 3 elements reaches it, a scalar tail ends the chunk), scalar accesses otherwise.
#include <algorithm>

#include "kernels/adamw.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// One element. The _rn intrinsics are never contracted into FMAs, so each operation rounds exactly as
// the CPU loop's (which src/optim compiles with -ffp-contract=off), in the same order.
ST_DEV void update(float& p, float g, float& m, float& v, const AdamWScalars& s, float decay) {
  const float gk = simt::fmul_rn(g, s.grad_scale);
  m = simt::fadd_rn(simt::fmul_rn(s.beta1, m), simt::fmul_rn(simt::fsub_rn(1.0f, s.beta1), gk));
  v = simt::fadd_rn(simt::fmul_rn(s.beta2, v), simt::fmul_rn(simt::fmul_rn(simt::fsub_rn(1.0f, s.beta2), gk), gk));
  const float denom = simt::fadd_rn(simt::fmul_rn(simt::fsqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  p = simt::fsub_rn(simt::fmul_rn(p, decay), simt::fdiv_rn(simt::fmul_rn(s.step_size, m), denom));
}

ST_DEV void update_at(const AdamWChunk& c, int k, const AdamWScalars& s, float decay) {
  float p = c.param[k], m = c.exp_avg[k], v = c.exp_avg_sq[k];
  update(p, simt::ldg(c.grad + k), m, v, s, decay);
  c.param[k] = p;
  c.exp_avg[k] = m;
  c.exp_avg_sq[k] = v;
}

ST_GLOBAL void ST_LAUNCH_BOUNDS(kThreads)
    adamw_kernel(const AdamWChunk* __restrict__ chunks, int64_t num_chunks, AdamWScalars s) {
  for (int64_t ci = simt::block_x(); ci < num_chunks; ci += simt::grid_x()) {
    const AdamWChunk c = chunks[ci];
    const float decay = c.decay ? s.decay_factor : 1.0f;
    const int n = static_cast<int>(c.n);
    // The four arrays are vectorized together or not at all: they must sit at the same offset from a
    // 16-byte boundary (true for shards and states allocated alike); `head` elements reach that boundary.
    const uintptr_t a = reinterpret_cast<uintptr_t>(c.param);
    const bool together = (a & 3) == 0 && ((a ^ reinterpret_cast<uintptr_t>(c.grad)) & 15) == 0 &&
                          ((a ^ reinterpret_cast<uintptr_t>(c.exp_avg)) & 15) == 0 &&
                          ((a ^ reinterpret_cast<uintptr_t>(c.exp_avg_sq)) & 15) == 0;
    const int head = together ? simt::imin(n, static_cast<int>(((16 - (a & 15)) & 15) / 4)) : n;
    const int vecs = (n - head) / 4;  // float4s after the head
    for (int k = simt::thread_x(); k < head; k += simt::block_dim_x()) update_at(c, k, s, decay);
    float4* p4 = reinterpret_cast<float4*>(c.param + head);
    const float4* g4 = reinterpret_cast<const float4*>(c.grad + head);
    float4* m4 = reinterpret_cast<float4*>(c.exp_avg + head);
    float4* v4 = reinterpret_cast<float4*>(c.exp_avg_sq + head);
    for (int k = simt::thread_x(); k < vecs; k += simt::block_dim_x()) {
      float4 p = p4[k], m = m4[k], v = v4[k];
      const float4 g = simt::ldg(g4 + k);  // read-only: the non-coherent cache path
      update(p.x, g.x, m.x, v.x, s, decay);
      update(p.y, g.y, m.y, v.y, s, decay);
      update(p.z, g.z, m.z, v.z, s, decay);
      update(p.w, g.w, m.w, v.w, s, decay);
      p4[k] = p;
      m4[k] = m;
      v4[k] = v;
    }
    for (int k = head + 4 * vecs + simt::thread_x(); k < n; k += simt::block_dim_x()) update_at(c, k, s, decay);
  }
}

}  // namespace

void adamw_step(const AdamWChunk* chunks, int64_t num_chunks, const AdamWScalars& scalars, StreamRef stream) {
  if (num_chunks <= 0) return;
  const auto blocks = static_cast<unsigned>(std::min(num_chunks, kMaxBlocks));
  simt::launch(adamw_kernel, blocks, kThreads, 0, detail::cuda_stream(stream), chunks, num_chunks, scalars);
  ST_CHECK_KERNEL("adamw_kernel");
}

}  // namespace shardtrain::kernels
