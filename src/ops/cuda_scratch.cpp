// The CUDA backend's scratch sizes for the memory planner (cuda_ops.hpp), in every build.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {
namespace {

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

}  // namespace

int64_t linear_loss_chunk_tokens(int64_t vocab, int64_t tokens, int64_t requested, DType logits_dtype) {
  // About 256 MiB of logits per chunk (64M in fp32, 128M in bf16; the CPU backend takes 16M): at V = 50000
  // in bf16 that is 2684 rows, so the dW GEMM (K = the chunk's rows) runs 40-odd k-iterations per tile and
  // dW's fp32 read-modify-write happens 13 times for a batch of 32768 tokens; still a few percent of what
  // the full (N, V) logits would take.
  const int64_t logits = (int64_t{256} << 20) / static_cast<int64_t>(dtype_size(logits_dtype));
  int64_t chunk = requested > 0 ? requested : std::clamp<int64_t>(logits / std::max<int64_t>(vocab, 1), 64, 8192);
  return std::min(chunk, std::max<int64_t>(tokens, 1));
}

DType linear_loss_logits_dtype(DType h, DType weight) {
  return h == DType::BF16 && weight == DType::BF16 ? DType::BF16 : DType::F32;
}

CudaScratchBytes cuda_scratch_bytes(const CudaScratchShape& s, const CudaOpsOptions& options) {
  const int64_t n = s.batch * s.seq;
  CudaScratchBytes b;
  const DType logits_dtype = linear_loss_logits_dtype(s.param_dtype, s.param_dtype);
  const auto chunk = static_cast<size_t>(linear_loss_chunk_tokens(s.vocab, n, s.loss_chunk_tokens, logits_dtype));
  const auto vocab = static_cast<size_t>(s.vocab), hidden = static_cast<size_t>(s.hidden);
  // Logits (the dlogits in place), RowLoss, and WeightGrad unless dW is fp32 already.
  b.loss = chunk * vocab * dtype_size(logits_dtype) + static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
  if (s.lm_head_grad_dtype != DType::F32) b.loss += vocab * hidden * 4;
  // kernels/attention_bwd.cu, rmsnorm.cu (64-row parts), embedding.cu (keys and rows in and out, the fp32 head
  // and tail pieces of 64-position segments, each 256-byte aligned, then cub's radix-sort storage, counted here
  // as one more copy of keys and rows).
  const size_t attention = 4 * static_cast<size_t>(s.batch * s.heads * s.seq);
  const size_t rmsnorm = static_cast<size_t>((n + 63) / 64) * hidden * 4;
  const size_t embedding =
      4 * align256(static_cast<size_t>(n) * 4) + 2 * align256(rmsnorm) + align256(static_cast<size_t>(n) * 8);
  b.op_workspace = std::max({attention, rmsnorm, embedding});
  if (s.cudnn_attention) {
    // Mirrors src/ops/cuda/cudnn_attention.cpp's sizing; past CudnnAttentionOptions::max_workspace_bytes (4 GiB)
    // a call runs our kernels instead, whose workspace op_workspace holds.
    const auto bhs = static_cast<size_t>(s.batch * s.heads * s.seq);
    const auto dh = static_cast<size_t>(s.head_dim > 0 ? s.head_dim : s.hidden / std::max<int64_t>(s.heads, 1));
    const size_t rows = align256(bhs * 4);
    const size_t need =
        s.deterministic_attention ? align256(bhs * static_cast<size_t>(s.seq) * 2) + rows : align256(bhs * dh * 4) + rows;
    b.cudnn_attention = need <= (size_t{4} << 30) ? need : 0;
  }
  b.sum_partials = 1024 * sizeof(double);  // kernels/sum_squares.cu: at most 1024 blocks
  b.gemm_workspace = options.gemm_workspace_bytes;
  return b;
}

bool deterministic_attention_from_env() {
  const char* env = std::getenv("SHARDTRAIN_ATTENTION_DETERMINISTIC");
  if (env == nullptr || *env == '\0') return false;
  const std::string v = env;
  if (v != "0" && v != "1") throw UsageError("SHARDTRAIN_ATTENTION_DETERMINISTIC='" + v + "': expected 0 or 1");
  return v == "1";
}

}  // namespace shardtrain::ops
