// The tensor-core attention kernels: ST_GLOBAL wrappers around the bodies in attention_mma_body.cuh (which
// the tests also run under the SIMT emulator), their launchers, and the choice between them and the FMA
// kernels (attention.cuh: AttentionKernel).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_mma_body.cuh"
#include "kernels/device_common.cuh"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::kernels {
namespace {

namespace mma = attention_mma;

template <int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(mma::kThreads) attention_mma_forward_kernel(mma::Args a) {
  mma::forward_body<DMAX>(a);
}
template <int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(mma::kThreads) attention_mma_dkdv_kernel(mma::Args a) {
  mma::dkdv_body<DMAX>(a);
}
template <int DMAX>
ST_GLOBAL void ST_LAUNCH_BOUNDS(mma::kThreads) attention_mma_dq_kernel(mma::Args a) {
  mma::dq_body<DMAX>(a);
}
ST_GLOBAL void ST_LAUNCH_BOUNDS(32)
    attention_mma_probe_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* bt, float* d) {
  mma::mma_probe_body(a, b, bt, d);
}

template <typename Kernel>
void launch(Kernel kernel, const char* name, dim3 grid, size_t smem, const mma::Args& a, cudaStream_t stream) {
  ST_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  simt::launch(kernel, grid, mma::kThreads, smem, stream, a);
  ST_CHECK_KERNEL(name);
}

mma::Args make_args(const AttentionDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                    float scale) {
  mma::Args a{};
  a.q = static_cast<const uint16_t*>(q);
  a.k = static_cast<const uint16_t*>(k);
  a.v = static_cast<const uint16_t*>(v);
  a.seg = segments;
  a.seq = int(d.seq);
  a.heads = int(d.heads);
  a.kv_heads = int(d.kv_heads);
  a.head_dim = int(d.head_dim);
  a.group = int(d.heads / d.kv_heads);
  a.scale = scale;
  a.vec16 = d.head_dim % 8 == 0 && detail::aligned16(q, k, v);
  return a;
}

AttentionKernel kernel_from_environment() {
  const char* env = std::getenv("SHARDTRAIN_ATTENTION_KERNEL");
  if (env == nullptr || std::string(env).empty() || std::string(env) == "auto") return AttentionKernel::Auto;
  if (std::string(env) == "cudnn") return AttentionKernel::Cudnn;
  if (std::string(env) == "mma") return AttentionKernel::Mma;
  if (std::string(env) == "fma") return AttentionKernel::Fma;
  throw UsageError(std::string("SHARDTRAIN_ATTENTION_KERNEL='") + env + "': expected auto, cudnn, mma or fma");
}

std::atomic<int>& kernel_choice() {
  static std::atomic<int> choice{static_cast<int>(kernel_from_environment())};
  return choice;
}

}  // namespace

void set_attention_kernel(AttentionKernel kernel) { kernel_choice().store(static_cast<int>(kernel)); }
AttentionKernel attention_kernel() { return static_cast<AttentionKernel>(kernel_choice().load()); }
bool attention_uses_mma(DType dtype) { return dtype == DType::BF16 && attention_kernel() != AttentionKernel::Fma; }

void attention_forward_mma(const AttentionDims& d, const void* q, const void* k, const void* v, const int32_t* segments,
                           float scale, void* out, float* lse, StreamRef stream) {
  mma::Args a = make_args(d, q, k, v, segments, scale);
  a.out = static_cast<uint16_t*>(out);
  a.lse_out = lse;
  const dim3 grid(unsigned((d.seq + mma::kRows - 1) / mma::kRows), unsigned(d.heads), unsigned(d.batch));
  mma::with_dmax(d.head_dim, [&]<int DMAX>() {
    launch(attention_mma_forward_kernel<DMAX>, "attention_mma_forward_kernel", grid, mma::forward_smem_bytes<DMAX>(), a,
           detail::cuda_stream(stream));
  });
}

void attention_backward_mma(const AttentionDims& d, const void* q, const void* k, const void* v, const float* lse,
                            const void* dout, const int32_t* segments, float scale, const float* dvec, void* dq, void* dk,
                            void* dv, StreamRef stream) {
  mma::Args a = make_args(d, q, k, v, segments, scale);
  a.vec16 = a.vec16 && detail::aligned16(dout);
  a.dout = static_cast<const uint16_t*>(dout);
  a.lse = lse;
  a.dvec = dvec;
  a.dq = static_cast<uint16_t*>(dq);
  a.dk = static_cast<uint16_t*>(dk);
  a.dv = static_cast<uint16_t*>(dv);
  const unsigned tiles = unsigned((d.seq + mma::kRows - 1) / mma::kRows);
  const cudaStream_t s = detail::cuda_stream(stream);
  mma::with_dmax(d.head_dim, [&]<int DMAX>() {
    launch(attention_mma_dkdv_kernel<DMAX>, "attention_mma_dkdv_kernel",
           dim3(tiles, unsigned(d.kv_heads), unsigned(d.batch)), mma::dkdv_smem_bytes<DMAX>(), a, s);
    launch(attention_mma_dq_kernel<DMAX>, "attention_mma_dq_kernel", dim3(tiles, unsigned(d.heads), unsigned(d.batch)),
           mma::dq_smem_bytes<DMAX>(), a, s);
  });
}

void mma_fragment_probe(const uint16_t* a, const uint16_t* b, const uint16_t* bt, float* d, StreamRef stream) {
  simt::launch(attention_mma_probe_kernel, 1, 32, mma::kProbeSmemBytes, detail::cuda_stream(stream), a, b, bt, d);
  ST_CHECK_KERNEL("attention_mma_probe_kernel");
}

}  // namespace shardtrain::kernels
