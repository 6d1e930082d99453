// rows.hpp's fp32 loops, each compiled for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline,
// with the best chosen when the program starts (an ifunc). Elsewhere (another architecture, another
// compiler) they are built once, for the target the build names; so they are with -DSHARDTRAIN_NATIVE=ON,
// which builds everything for this CPU: there a clone's narrower target could not inline vexp and std::max
// compiled for the wider native one, and the loops ran as calls, ten times slower (measured).
#include "rows.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(SHARDTRAIN_NATIVE_ARCH)
#define ST_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ST_CPU_CLONES
#endif

namespace shardtrain::ops::cpu::rows {

ST_CPU_CLONES float softmax(float* row, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own) {
  return softmax<float>(row, n, cend, key_seg, own);
}

ST_CPU_CLONES void probs_and_ds(float* p, float* ds, int64_t n, int64_t cend, const int32_t* key_seg, int32_t own, float lse,
                                float d) {
  probs_and_ds<float>(p, ds, n, cend, key_seg, own, lse, d);
}

ST_CPU_CLONES float cross_entropy(float* z, int64_t vocab, int32_t target, float scale, bool grad) {
  return cross_entropy<float>(z, vocab, target, scale, grad);
}

ST_CPU_CLONES void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
  swiglu_forward<float>(gate, up, out, n);
}

ST_CPU_CLONES void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate, float* dup,
                                   int64_t n) {
  swiglu_backward<float>(dout, gate, up, dgate, dup, n);
}

}  // namespace shardtrain::ops::cpu::rows
