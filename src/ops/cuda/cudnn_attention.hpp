// cuDNN's fused flash attention, forward and backward: a second attention path of the CUDA backend beside
// kernels/attention*.cu, which stays the reference and the fallback. Same semantics as kernels::attention_forward /
// attention_backward (kernels/attention.cuh): q, out (B, S, H, Dh); k, v (B, S, Hkv, Dh), bf16 and contiguous;
// lse (B, H, S) fp32, the natural-log log-sum-exp of each row of scaled scores (-inf for padding rows); scale
// 1/sqrt(Dh); causal always; grouped queries without repeating K/V; dq, dk, dv overwritten, dk and dv summed over
// each group's query heads. Masking as SdpaMasking says (cudnn_sdpa_graph.hpp).
//
// cuDNN is loaded at first use (dlopen, cudnn_library.hpp): a binary runs unchanged where there is none, and
// unsupported_reason() then says so. One CudnnAttention per CudaOps Context (its handle is the current device's).
//
// Costs. A plan (graph, engine choice, execution plan) is built the first time a call's key (sdpa_plan_key:
// dims, masking, the graph batch, the deterministic flag) is met, and cached: up to about a second the first
// time (the attention engines are runtime-compiled, with NVRTC), nothing afterwards. forward() and backward() never synchronize and
// never allocate device memory: they queue on the caller's stream a small kernel deriving the sequence arrays
// (packed documents, or cuDNN <= 9.15's padding workaround), cuDNN's kernels, and for packed documents the
// statistics' layout change and the zeroing of padding rows. Each call creates one cuDNN variant-pack descriptor
// (host memory inside cuDNN, as cudnn-frontend does per execute).
//
// Determinism. The backward's default graph accumulates dQ across key blocks in an fp32 buffer (dQAccum), in an
// order that is not fixed (FlashAttention-2's atomic adds), so the last bits may vary between runs; cuDNN 9.19's
// engines carry no NONDETERMINISTIC note for it: the knowledge is cudnn-frontend's, which builds the graph below
// whenever a deterministic backward is asked for. SdpaCall::deterministic selects the graph without the accumulator (dQ is the output of the dS @ K matmul
// itself; the frontend's "dP workspace" variant) and only engines without that note: bit-identical runs, at the
// cost of a dP buffer of about B' * H * S * S * 2 bytes in cuDNN's workspace (the frontend's sizing: 4 GiB at
// B' * H = 32 and S = 8192; B' is the sequence bound with packed documents) and the time to write and read it.
// A call whose workspace passes CudnnAttentionOptions::max_workspace_bytes is reported unsupported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "cudnn_library.hpp"
#include "cudnn_sdpa_graph.hpp"
#include "kernels/attention_sequences.cuh"
#include "kernels/data_error.cuh"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::ops::cuda {

struct CudnnAttentionOptions {
  // A call whose workspace (cuDNN's plus the fp32 scratch below) would pass this is reported unsupported: the
  // deterministic backward's dP buffer alone is B' * H * S^2 * 2 bytes.
  size_t max_workspace_bytes = size_t{4} << 30;
  // Deviceless planning (tests): plans are built for this described device instead of the current one, with
  // cuDNN's JSON device properties (9.11 and later) and its compute capability (90 for 9.0); no handle is
  // created and forward()/backward() refuse to run.
  std::string device_properties_json;
  int device_sm = 0;
};

// Device pointers. segments (B, S) int32: needed for Documents (the same segments the op's mask holds), ignored
// for Causal.
struct SdpaForwardTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int32_t* segments = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
};
struct SdpaBackwardTensors {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  const void* dout = nullptr;
  const int32_t* segments = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// The SdpaCall of an Ops attention call (include/shardtrain/ops/ops.hpp): the mask's hint picks the masking
// (SegmentsHint::Causal: Causal, the segments all 0 or absent; Documents: Documents, mask.runs bounding the runs).
// Returns the reason cuDNN's path cannot take the call ("" when it can be asked): a hint of Unknown (padding or
// documents the batch did not describe), Documents without a bound.
std::string sdpa_call_of(const AttentionShape& shape, const AttentionMask& mask, SdpaDirection direction, bool deterministic,
                         SdpaCall* call);

// What was built for a call, for logs and tests.
struct SdpaPlanInfo {
  std::string engine;  // ExecutionPlan::describe()
  bool nondeterministic = false;
  double build_ms = 0;  // graph, heuristics and plan
  int64_t cudnn_workspace_bytes = 0;
  size_t workspace_bytes = 0;  // all of it: cuDNN's, the fp32 scratch, the sequence arrays
  int64_t graph_batch = 0;
  bool padding_mask = false, ragged = false, ragged_intermediates = false;
};

class CudnnAttention {
 public:
  explicit CudnnAttention(CudnnAttentionOptions options = {});
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Empty when cuDNN can run the call; else one short reason ("libcudnn.so.9 not found: ...", "cuDNN 9.5.1 older
  // than 9.6.0 needed for packed documents ...", "compute capability 8.0: ...", "f32 (cuDNN's flash attention
  // takes bf16/fp16; ...)", "head dim 72 (multiple of 8 up to 256 needed)", "no engine for this graph (...)",
  // "needs 5.2 GiB of workspace (limit 4 GiB)"). Builds and caches the call's plan to find out, so a shape
  // cuDNN cannot run is known before a step uses it. Loads cuDNN and creates the handle at the first call.
  std::string unsupported_reason(const SdpaCall& call, DType dtype);

  // Device bytes forward/backward need at `workspace` for a supported call (builds its plan; throws InternalError
  // with the reason for an unsupported one). The same for every call with the same plan key.
  size_t workspace_bytes(const SdpaCall& call);

  // Queue the call on `stream` (call.direction must match). workspace: workspace_bytes(call) bytes, 256-byte
  // aligned, in device memory, free until the stream has run the call. error: the backend's data-error record
  // (packed documents the layout cannot express are recorded there: kernels/attention_sequences.cuh).
  // Tensor pointers 16-byte aligned. Throws InternalError for an unsupported call or bad arguments, LibraryError
  // (exit code Device) when cuDNN fails at execute.
  void forward(const SdpaCall& call, const SdpaForwardTensors& t, void* workspace, size_t workspace_bytes,
               kernels::DataErrorRecord* error, StreamRef stream);
  void backward(const SdpaCall& call, const SdpaBackwardTensors& t, void* workspace, size_t workspace_bytes,
                kernels::DataErrorRecord* error, StreamRef stream);

  // "cuDNN 9.19.0 (libcudnn.so.9)", or why none is usable. Loads cuDNN.
  std::string library_description();
  // Why cuDNN cannot be used for any call here ("" when it can: loaded, a handle on the current device or a
  // described one). Loads cuDNN.
  std::string unavailable_reason();
  // cudnnGetVersion() of the loaded library (0 when none). Loads cuDNN.
  int64_t library_version();
  // The plan built for a call (null when none was, or the call is unsupported).
  const SdpaPlanInfo* plan_info(const SdpaCall& call) const;
  // The engine configs tried for a call's plan (empty when none was built or the call was ruled out before).
  const std::vector<PlanAttempt>& plan_attempts(const SdpaCall& call) const;
  size_t plans() const { return plans_.size(); }

 private:
  struct Plan;
  void init();
  Plan& plan_for(const SdpaCall& call);
  Plan& ready_plan(const SdpaCall& call, SdpaDirection direction, void* workspace, size_t workspace_bytes);
  void execute(Plan& p, void* cudnn_workspace, StreamRef stream);
  // The sequence arrays a plan with a padding mask or ragged offsets reads: their places in `ws`, and (with a
  // padding mask) the kernel that derives them from the segments queued on `stream`.
  kernels::AttentionSequences queue_sequence_arrays(const Plan& p, const SdpaCall& call, const int32_t* segments, char* ws,
                                                    kernels::DataErrorRecord* error, StreamRef stream);

  CudnnAttentionOptions options_;
  bool initialized_ = false;
  std::string unavailable_;  // why cuDNN cannot be used at all, once init() ran
  std::unique_ptr<CudnnLibrary> lib_;
  cudnnHandle_t handle_ = nullptr;
  BackendDescriptor device_;  // deviceless planning only
  SdpaTarget target_;
  std::map<SdpaCall, std::unique_ptr<Plan>> plans_;
};

}  // namespace shardtrain::ops::cuda
