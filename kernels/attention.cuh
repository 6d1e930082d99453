// Causal grouped-query attention on the device, flash style: the (S, S) score matrix is never stored; the
// forward keeps a running softmax per query row, the backward recomputes probabilities from the saved lse.
// Semantics exactly as Ops::attention_forward / attention_backward (include/shardtrain/ops/ops.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

struct AttentionDims {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

// q, out: (B, S, H, Dh); k, v: (B, S, Hkv, Dh), element type `dtype` (DType::F32 or DType::BF16, same for all);
// lse: (B, H, S) fp32 (-inf for a fully masked row); segments: (B, S) int32 or nullptr (plain causal);
// scale = 1/sqrt(Dh). Any head_dim from 1 to 128 is supported; larger ones throw InternalError.
void attention_forward(DType dtype, const AttentionDims& d, const void* q, const void* k, const void* v,
                       const int32_t* segments, float scale, void* out, float* lse, StreamRef stream);

// Bytes of device scratch attention_backward needs: one fp32 per (B, H, S) row.
size_t attention_backward_workspace_bytes(const AttentionDims& d);

// dq (B, S, H, Dh), dk and dv (B, S, Hkv, Dh) are overwritten; dk, dv are summed over the query heads of each
// group. Deterministic: no atomics.
void attention_backward(DType dtype, const AttentionDims& d, const void* q, const void* k, const void* v, const void* out,
                        const float* lse, const void* dout, const int32_t* segments, float scale, void* dq, void* dk,
                        void* dv, void* workspace, StreamRef stream);

// Which attention runs. Auto: cuDNN's fused flash attention where it can run the call (the CUDA backend decides,
// src/ops/cuda/attention.cpp), else the tensor-core kernels (attention_mma.cu: mma.sync, bf16 tiles) for bf16 and
// the fp32-FMA kernels for f32; Cudnn: cuDNN or an error naming why it cannot; Mma: the tensor-core kernels for
// bf16; Fma: the FMA kernels for both (the reference the tensor-core kernels were checked against). Here, in the
// kernels, Auto, Cudnn and Mma all mean the tensor-core kernels for bf16. The initial value comes from
// SHARDTRAIN_ATTENTION_KERNEL = auto | cudnn | mma | fma (unset: auto; anything else throws UsageError naming the
// variable).
enum class AttentionKernel { Auto, Cudnn, Mma, Fma };
void set_attention_kernel(AttentionKernel kernel);
AttentionKernel attention_kernel();
bool attention_uses_mma(DType dtype);

// One warp: d = a b three times (3 x (16 x 16) fp32, row-major) for a, b and bt = b^T (16 x 16 bf16 bits each,
// row-major): with fragments loaded register by register in the documented mma layout, then with the
// tensor-core kernels' ldmatrix and ldmatrix.trans loaders (attention_mma_body.cuh, mma_probe_body). Device
// pointers. Tests use it to check the mma and ldmatrix layouts against the hardware.
void mma_fragment_probe(const uint16_t* a, const uint16_t* b, const uint16_t* bt, float* d, StreamRef stream);

}  // namespace shardtrain::kernels
