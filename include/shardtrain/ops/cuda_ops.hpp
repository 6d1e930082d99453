// The CUDA backend: kernels/ for everything but GEMMs, cuBLASLt for GEMMs (docs/gpu.md). Tensors live in
// device memory (Tensor::device == DeviceKind::Cuda), in f32 or bf16 (f64 stays on the CPU backend); ops
// run asynchronously on the stream given to set_stream and never synchronize, except where a value must
// reach the host: the two losses (LossSums; not while defer_loss is on), take_loss() and synchronize().
// set_stream keeps call order across a switch: the new stream waits (on the device, through an event) for
// work queued on the previous one.
//
// Bad input a kernel finds (a token id or target outside the vocabulary, a negative document id) is
// recorded on the device and thrown as DataError at the next synchronization point: the loss ops (when not
// deferred), take_loss(), synchronize(), and nothing else. So an out-of-range id given to
// embedding_forward surfaces when the step's loss is read (or at an explicit synchronize()), not from
// embedding_forward itself.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/ops/ops.hpp"

namespace shardtrain::ops {

// The attention implementations of the CUDA backend (CudaOps::set_attention_impl).
enum class AttentionImpl { Auto, Cudnn, Mma, Fma };
const char* attention_impl_name(AttentionImpl impl);  // "auto" | "cudnn" | "mma" | "fma"

// fp32 GEMMs in full fp32 (default) or with TF32 tensor-core inputs (10-bit mantissa, much faster).
enum class F32MatmulPrecision { Full, Tf32 };

struct CudaOpsOptions {
  F32MatmulPrecision f32_matmul = F32MatmulPrecision::Full;
  size_t gemm_workspace_bytes = size_t{32} << 20;  // cuBLASLt workspace, allocated once
};

// The fused lm_head + loss's rows per chunk: `requested` when positive, else about 256 MiB of logits (64M
// in fp32, 128M in bf16), at least 64 and at most 8192 rows; never more than `tokens`.
// src/ops/cuda/loss.cpp uses it.
int64_t linear_loss_chunk_tokens(int64_t vocab, int64_t tokens, int64_t requested, DType logits_dtype);

// The dtype the fused loss stores a chunk's logits and dlogits in: bf16 when h and W both are (a bf16
// lm_head, rounded as PyTorch's is; softmax in fp32), else fp32. Both backends round alike.
DType linear_loss_logits_dtype(DType h, DType weight);

// The device scratch the CUDA backend's ops hold for one micro-batch (grow-only slots, each as large as its
// largest use), which `shardtrain plan` adds to a rank's device memory beside parameters, gradients and
// activations. The kernels' workspace formulas are mirrored here (a build without CUDA plans too);
// kernels_emulated_test checks the mirror against the kernels' own functions.
struct CudaScratchShape {
  int64_t batch = 0, seq = 0, hidden = 0, heads = 0, vocab = 0;
  int64_t loss_chunk_tokens = 0;          // as the model passes it (0: the default)
  DType param_dtype = DType::BF16;        // bf16 h and W: bf16 logits and dlogits (one buffer)
  DType lm_head_grad_dtype = DType::F32;  // not f32: the chunks' dW is summed in an fp32 buffer first
  // cuDNN's fused attention may run (a GPU with cuDNN 9): its workspace shares the op workspace's slot.
  bool cudnn_attention = false;
  bool deterministic_attention = false;  // deterministic_attention_from_env()
  int64_t head_dim = 0;                  // 0: hidden / heads
};
struct CudaScratchBytes {
  size_t loss = 0;            // fp32 logits chunk, bf16 dlogits chunk, row losses, fp32 lm_head gradient
  size_t op_workspace = 0;    // the largest of attention's dvec, RMSNorm's weight-gradient parts, the embedding sort
  size_t sum_partials = 0;    // the gradient norm's per-block partials
  size_t gemm_workspace = 0;  // cuBLASLt's, allocated once
  // cuDNN's attention workspace where it runs (an estimate: its own engines' part is known only at run time):
  // the deterministic backward's dP, B*H*S*S*2 bytes, or the dQ accumulator, B*S*H*Dh*4 bytes, and the
  // row sums. In the op workspace's slot, so the larger of the two counts.
  size_t cudnn_attention = 0;
  size_t total() const { return loss + std::max(op_workspace, cudnn_attention) + sum_partials + gemm_workspace; }
};
CudaScratchBytes cuda_scratch_bytes(const CudaScratchShape& shape, const CudaOpsOptions& options = {});

// Whether cuDNN's attention backward is asked for its deterministic variant: SHARDTRAIN_ATTENTION_DETERMINISTIC=1
// (the same bits every run; slower, and past the workspace limit at long sequences, where our kernels' backward
// runs instead), 0 or unset the faster one whose dQ accumulates with atomics (PyTorch's default too; measured in
// docs/performance.md). Anything else is a UsageError naming the variable. The backend and the planner both ask.
bool deterministic_attention_from_env();

#if SHARDTRAIN_WITH_CUDA

namespace cuda {
struct Context;
}

class CudaOps final : public Ops {
 public:
  // Uses the current CUDA device (runtime's select_device makes it current); throws a Device error without one.
  explicit CudaOps(const CudaOpsOptions& options = {});
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  DeviceKind device() const override { return DeviceKind::Cuda; }
  void set_stream(StreamRef stream) override;
  StreamRef stream() const override;
  // A CudaOps with this one's options but no cuBLASLt workspace (side streams cast and add only).
  std::unique_ptr<Ops> make_side_ops() const override;

  // Every op of op_list.inc (asynchronous on the stream: nothing waits for the GPU).
#define SHARDTRAIN_OP(R, name, params, args) R name params override;
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP
  void defer_loss(bool on) override;
  LossSums take_loss() override;

  // Beyond Ops.
  // Waits for the stream, then throws DataError if a kernel recorded bad input since the last check.
  void synchronize();
  // Distinct GEMM configurations planned so far (each asked cuBLASLt's heuristic once).
  size_t gemm_plans() const;
  // Which attention runs, process-wide (docs/gpu.md, "Attention: cuDNN and our kernels"): Auto runs cuDNN's
  // fused flash attention where it can run the call and our tensor-core kernels where it cannot (bf16; f32
  // always runs the FMA kernels), logging the choice and its reason once per shape; Cudnn insists (a call cuDNN
  // cannot run throws, naming why); Mma and Fma run our kernels alone. SHARDTRAIN_ATTENTION_KERNEL =
  // auto | cudnn | mma | fma sets the initial choice.
  static void set_attention_impl(AttentionImpl impl);
  static AttentionImpl attention_impl();
  static void use_fma_attention(bool on);  // Fma, or back to Auto
  static bool fma_attention();
  // cuDNN's backward: its faster variant (dQ accumulated with atomics: the last bits may differ between runs; the
  // default) or the deterministic one. deterministic_attention_from_env() sets the initial choice.
  void set_deterministic_attention(bool on);
  bool deterministic_attention() const;
  // What Auto runs for this call, and why: "cudnn", or "mma (cuDNN: <why it cannot>)" (and "fma ...").
  std::string attention_choice(const AttentionShape& shape, DType dtype, const AttentionMask& mask, bool backward);

 private:
  std::unique_ptr<cuda::Context> ctx_;
};

// Which cuDNN the attention would use on the current device: "cuDNN 9.19.0 (libcudnn.so.9)", or
// "none: <why>" (not found, too old, the emulator). Loads cuDNN; for `shardtrain env`.
std::string cudnn_attention_status();

#endif  // SHARDTRAIN_WITH_CUDA

// A CudaOps on the current device; in a build without CUDA it throws a Device error.
std::unique_ptr<Ops> make_cuda_ops(const CudaOpsOptions& options = {});

}  // namespace shardtrain::ops
