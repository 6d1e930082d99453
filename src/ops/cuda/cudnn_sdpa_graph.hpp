// cuDNN's fused flash attention as plain data: the tensors (uid, dims, strides, dtype, virtual or by-value, ragged
// offsets) and the operations (matmul, pointwise, reduction, reshape) of the forward and backward graphs that
// cuDNN 9's fused-attention engines recognize. These are the graphs cudnn-frontend's composite SDPA nodes lower
// to (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, softmax.h, diagonal_band_mask.h and the
// score modifiers), written out by hand for the one case shardtrain runs: bf16 in and out, fp32 statistics,
// scale 1/sqrt(Dh), top-left causal mask, grouped-query K/V, no dropout or bias, optionally packed documents.
// Nothing here calls cuDNN: cudnn_library.cpp realizes a description, tests check one without a GPU.
#pragma once

#include <cudnn_graph.h>  // the backend API's enums and types only: the library is loaded at run time

#include <array>
#include <compare>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::ops::cuda {

// Causal: plain causal attention over each row (segments all 0: the padded layout, or a batch without documents).
// Documents: each row is runs of documents, a document a run of positions with one segment id >= 0 (never two
// runs of one id in a row); segment -1 is padding (attends to nothing, attended by nothing). cuDNN runs it as
// its packed ("ragged", THD) layout: every run is one sequence of the graph's batch.
enum class SdpaMasking { Causal, Documents };
enum class SdpaDirection { Forward, Backward };

// One attention call: q, out, dout, dq (B, S, H, Dh); k, v, dk, dv (B, S, Hkv, Dh), all bf16 and contiguous;
// lse (B, H, S) fp32.
struct SdpaCall {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  SdpaDirection direction = SdpaDirection::Forward;
  SdpaMasking masking = SdpaMasking::Causal;
  int64_t max_sequences = 0;   // Documents: an upper bound on the runs of documents in the batch, all rows
  bool deterministic = false;  // Backward: the variant whose dQ is computed without atomics (see below)
  auto operator<=>(const SdpaCall&) const = default;
};

// The graph's batch dimension: B for Causal; for Documents max_sequences rounded up to a power of two, so that a
// run of batches with varying document counts builds few graphs (unused sequences have length 0).
int64_t sdpa_graph_batch(const SdpaCall& call);
// The call a plan is built for and cached under: the graph batch in max_sequences, deterministic only where it
// matters (the backward), max_sequences only where it matters (Documents).
SdpaCall sdpa_plan_key(const SdpaCall& call);
std::string describe_call(const SdpaCall& call);  // "backward B=2 S=512 H=8/2 Dh=64 documents<=8 deterministic"

// What a description depends on besides the call: the cuDNN version (cudnnGetVersion(), 91900 for 9.19.0) and the
// device's compute capability (90 for 9.0). They select the workarounds cudnn-frontend applies per version.
struct SdpaTarget {
  int64_t cudnn_version = 0;
  int sm = 0;
};

// Why cuDNN cannot run the call on the target, from what is known without asking it (dtype, head dim, version,
// architecture); empty when nothing rules it out. `dtype_name` is our dtype's name ("bf16", "f32").
std::string sdpa_static_reason(const SdpaCall& call, const std::string& dtype_name, const SdpaTarget& target);

// Unique ids of the tensors bound at execute time (the variant pack). Virtual tensors get ids from kFirstVirtual.
namespace sdpa_uid {
inline constexpr int64_t Q = 1, K = 2, V = 3, O = 4, Stats = 5, dO = 6, dQ = 7, dK = 8, dV = 9;
inline constexpr int64_t SeqLenQ = 10, SeqLenKV = 11;                        // (B', 1, 1, 1) int32
inline constexpr int64_t OffsetsQO = 12, OffsetsKV = 13, OffsetsStats = 14;  // (B' + 1, 1, 1, 1) int64
inline constexpr int64_t SoftmaxSum = 15, dQAccum = 16, dKFull = 17, dVFull = 18;
inline constexpr int64_t Scale = 19, MaskFill = 20, One = 21;  // fp32 scalars passed by value
inline constexpr int64_t kFirstVirtual = 100;
}  // namespace sdpa_uid

struct GraphTensor {
  int64_t uid = 0;
  std::string name;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::array<int64_t, 4> dims{}, strides{};
  bool is_virtual = false;
  bool by_value = false;
  int64_t ragged_offset_uid = 0;  // 0: none; else the uid of its (B' + 1, 1, 1, 1) int64 element-offset tensor
  // Non-virtual tensors that are neither the caller's nor the sequence arrays live in the workspace the caller
  // gives (CudnnAttention lays it out): their bytes, and whether they must be zero before each execute.
  int64_t scratch_bytes = 0;
  bool zero_before_execute = false;
};

enum class GraphOpKind { Matmul, Pointwise, Reduction, Reshape };

// Tensors by uid. Pointwise: y = mode(x[, b][, t]) (BINARY_SELECT: y = t ? x : b; GEN_INDEX: y = index of x
// along `axis`). Reduction: y = reduce(x) over the dims where y has 1. Reshape: y = x seen with y's dims and
// strides. Matmul: y (c) = x (a) @ b over the last two dims, the leading ones batched (b's head dim may divide a's:
// grouped queries), with the GEMM's M, N, K overridden per batch entry by int32 tensors where given.
struct GraphOp {
  GraphOpKind kind = GraphOpKind::Pointwise;
  std::string name;
  cudnnPointwiseMode_t pointwise = CUDNN_POINTWISE_IDENTITY;
  cudnnReduceTensorOp_t reduction = CUDNN_REDUCE_TENSOR_ADD;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  int64_t axis = -1;  // GEN_INDEX only
  int64_t x = 0, b = 0, t = 0, y = 0;
  int64_t m_override = 0, n_override = 0, k_override = 0;  // Matmul only
  bool padded_matmul = false;  // Matmul: sets CUDNN_ATTR_MATMUL_PADDING_VALUE (0.0) as cudnn-frontend's bmm1 does
};

struct SdpaGraph {
  SdpaCall call;  // the plan key
  SdpaTarget target;
  int64_t graph_batch = 0;                  // B'
  bool padding_mask = false;                // sequence lengths bound the GEMMs and mask the scores
  bool ragged = false;                      // Documents: q, k, v, o (and grads) in the packed layout, stats token-major
  bool ragged_intermediates = false;        // the backward's fp32 scratch sized by tokens (B * S), not by B' * S
  bool dq_accumulated = false;              // backward: dQ through the fp32 dQAccum tensor (atomics: nondeterministic)
  float scale = 0, mask_fill = 0, one = 1;  // the by-value scalars' values
  std::vector<GraphTensor> tensors;
  std::vector<GraphOp> ops;

  const GraphTensor& tensor(int64_t uid) const;  // throws InternalError when absent
  bool has(int64_t uid) const;
  // Every non-virtual uid, in tensor order: the variant pack binds exactly these.
  std::vector<int64_t> bound_uids() const;
};

// The description of a call's graph on a target. The call must pass sdpa_static_reason (throws InternalError
// otherwise). Backward with call.deterministic: dQ is the output of the dS @ K matmul itself (cudnn-frontend's
// "dP workspace" variant, which it forces for deterministic backward passes), without the dQAccum tensor the
// engines accumulate into with atomics.
SdpaGraph describe_sdpa(const SdpaCall& call, const SdpaTarget& target);

// Readable forms for logs and test messages.
const char* data_type_name(cudnnDataType_t t);
std::string describe_tensor(const GraphTensor& t);
std::string describe_op(const SdpaGraph& g, const GraphOp& op);

}  // namespace shardtrain::ops::cuda
