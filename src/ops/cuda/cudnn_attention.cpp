// cuDNN fused attention (cudnn_attention.hpp): loading, plan building and caching, the workspace layout, and the
// work a forward or backward call queues.
#include "cudnn_attention.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>

#include "kernels/attention_sequences.cuh"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::ops::cuda {
namespace {

constexpr size_t kAlign = 256;  // every piece of the workspace starts at a multiple of this

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string bytes_text(size_t b) {
  if (b >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string sdpa_call_of(const AttentionShape& shape, const AttentionMask& mask, SdpaDirection direction, bool deterministic,
                         SdpaCall* call) {
  *call = SdpaCall{};
  call->batch = shape.batch;
  call->seq = shape.seq;
  call->heads = shape.heads;
  call->kv_heads = shape.kv_heads;
  call->head_dim = shape.head_dim;
  call->direction = direction;
  call->deterministic = deterministic;
  if (!mask.segments.defined() || mask.hint == SegmentsHint::Causal) return "";
  if (mask.hint == SegmentsHint::Documents) {
    if (mask.runs <= 0) return "packed documents without a bound on their runs";
    call->masking = SdpaMasking::Documents;
    call->max_sequences = mask.runs;
    return "";
  }
  return "segments the batch does not describe (padding or documents without a hint)";
}

struct CudnnAttention::Plan {
  SdpaGraph graph;
  RealizedGraph realized;
  ExecutionPlan exec;
  SdpaPlanInfo info;
  std::vector<PlanAttempt> attempts;
  std::string reason;  // non-empty: cuDNN cannot run the call
  // The workspace, as byte offsets from the caller's pointer.
  size_t total = 0, cudnn_at = 0;
  std::vector<std::pair<int64_t, size_t>> scratch;  // uid -> offset
  size_t seq_lens_at = 0, offsets_qo_at = 0, offsets_kv_at = 0, offsets_stats_at = 0;
  // The variant pack: the bound uids and their pointers (set per call).
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  // The by-value scalars (scale, mask fill, one), each at a 16-byte boundary: cuDNN reads them during execute.
  alignas(16) float scalars[12] = {};

  size_t scratch_at(int64_t uid) const {
    for (const auto& [u, at] : scratch)
      if (u == uid) return at;
    throw InternalError(fmt::format("cuDNN attention: no scratch for tensor #{}", uid));
  }
  void bind(int64_t uid, const void* p) {
    for (size_t i = 0; i < uids.size(); ++i)
      if (uids[i] == uid) {
        pointers[i] = const_cast<void*>(p);
        return;
      }
  }
};

CudnnAttention::CudnnAttention(CudnnAttentionOptions options) : options_(std::move(options)) {}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // descriptors before the handle and the library
  device_ = BackendDescriptor();
  if (handle_ != nullptr) lib_->api().Destroy(handle_);
}

void CudnnAttention::init() {
  if (initialized_) return;
  initialized_ = true;
#if defined(SHARDTRAIN_CUDA_EMULATED)
  // The emulator's CUDA runtime is not the one cuDNN would call into.
  unavailable_ = "the host CUDA emulator runs no cuDNN";
#else
  std::string why;
  lib_ = CudnnLibrary::load(&why);
  if (!lib_) {
    unavailable_ = why;
    return;
  }
  target_.cudnn_version = lib_->version();
  if (!options_.device_properties_json.empty()) {
    target_.sm = options_.device_sm;
    try {
      device_ = device_properties(*lib_, options_.device_properties_json);
    } catch (const CudnnBuildError& e) {
      unavailable_ = fmt::format("cuDNN {}: deviceless planning: {}", lib_->version_text(), e.what());
    }
    return;
  }
  int device = 0;
  cudaDeviceProp prop{};
  cudaError_t ce = cudaGetDevice(&device);
  if (ce == cudaSuccess) ce = cudaGetDeviceProperties(&prop, device);
  if (ce != cudaSuccess) {
    unavailable_ = fmt::format("no CUDA device for cuDNN: {}", cudaGetErrorString(ce));
    return;
  }
  target_.sm = prop.major * 10 + prop.minor;
  if (const cudnnStatus_t st = lib_->api().Create(&handle_); st != CUDNN_STATUS_SUCCESS) {
    handle_ = nullptr;
    unavailable_ = fmt::format("cudnnCreate (cuDNN {}): {}", lib_->version_text(), lib_->error_text(st));
    return;
  }
  log::debug("cuDNN {} loaded ({}) for compute capability {}.{}", lib_->version_text(), lib_->soname(), prop.major,
             prop.minor);
#endif
}

std::string CudnnAttention::library_description() {
  init();
  if (!lib_) return unavailable_;
  std::string s = fmt::format("cuDNN {} ({})", lib_->version_text(), lib_->soname());
  if (!unavailable_.empty()) s += ": " + unavailable_;
  return s;
}

std::string CudnnAttention::unavailable_reason() {
  init();
  return unavailable_;
}

int64_t CudnnAttention::library_version() {
  init();
  return lib_ ? lib_->version() : 0;
}

const SdpaPlanInfo* CudnnAttention::plan_info(const SdpaCall& call) const {
  const auto it = plans_.find(sdpa_plan_key(call));
  if (it == plans_.end() || !it->second->reason.empty()) return nullptr;
  return &it->second->info;
}

const std::vector<PlanAttempt>& CudnnAttention::plan_attempts(const SdpaCall& call) const {
  static const std::vector<PlanAttempt> none;
  const auto it = plans_.find(sdpa_plan_key(call));
  return it == plans_.end() ? none : it->second->attempts;
}

std::string CudnnAttention::unsupported_reason(const SdpaCall& call, DType dtype) {
  init();
  if (!unavailable_.empty()) return unavailable_;
  if (std::string why = sdpa_static_reason(call, dtype_name(dtype), target_); !why.empty()) return why;
  return plan_for(call).reason;
}

CudnnAttention::Plan& CudnnAttention::plan_for(const SdpaCall& call) {
  const SdpaCall key = sdpa_plan_key(call);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto p = std::make_unique<Plan>();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    p->graph = describe_sdpa(key, target_);
    p->realized = realize_operations(*lib_, p->graph);
    finalize_graph(*lib_, p->realized, handle_);
    const bool deterministic = key.direction == SdpaDirection::Backward && key.deterministic;
    p->exec = choose_plan(*lib_, p->realized.graph, handle_, device_.get() != nullptr ? &device_ : nullptr, deterministic,
                          &p->attempts);
  } catch (const CudnnBuildError& e) {
    p->reason = fmt::format("cuDNN {}: {}", lib_->version_text(), e.what());
  }
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (p->reason.empty()) {
    const SdpaGraph& g = p->graph;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off += round_up(bytes);
      return at;
    };
    p->cudnn_at = take(static_cast<size_t>(p->exec.workspace_bytes));
    for (const GraphTensor& t : g.tensors)
      if (t.scratch_bytes > 0) p->scratch.emplace_back(t.uid, take(static_cast<size_t>(t.scratch_bytes)));
    if (g.padding_mask) p->seq_lens_at = take(static_cast<size_t>(g.graph_batch) * sizeof(int32_t));
    if (g.ragged) {
      const size_t n = static_cast<size_t>(g.graph_batch + 1) * sizeof(int64_t);
      p->offsets_qo_at = take(n);
      p->offsets_kv_at = take(n);
      p->offsets_stats_at = take(n);
    }
    p->total = off;
    p->uids = g.bound_uids();
    p->pointers.assign(p->uids.size(), nullptr);
    p->scalars[0] = g.scale;
    p->scalars[4] = g.mask_fill;
    p->scalars[8] = g.one;
    SdpaPlanInfo& info = p->info;
    info.engine = p->exec.describe();
    info.nondeterministic = p->exec.nondeterministic;
    info.build_ms = build_ms;
    info.cudnn_workspace_bytes = p->exec.workspace_bytes;
    info.workspace_bytes = p->total;
    info.graph_batch = g.graph_batch;
    info.padding_mask = g.padding_mask;
    info.ragged = g.ragged;
    info.ragged_intermediates = g.ragged_intermediates;
    if (p->total > options_.max_workspace_bytes) {
      p->reason =
          fmt::format("needs {} of workspace (limit {})", bytes_text(p->total), bytes_text(options_.max_workspace_bytes));
    } else {
      log::info("cuDNN {} attention plan for {}: {}, built in {:.0f} ms, workspace {}", lib_->version_text(),
                describe_call(key), info.engine, build_ms, bytes_text(p->total));
    }
  }
  if (!p->reason.empty()) log::debug("cuDNN attention for {}: {}", describe_call(key), p->reason);
  return *plans_.emplace(key, std::move(p)).first->second;
}

size_t CudnnAttention::workspace_bytes(const SdpaCall& call) {
  if (std::string why = unsupported_reason(call, DType::BF16); !why.empty())
    throw InternalError(fmt::format("cuDNN attention cannot run {}: {}", describe_call(call), why));
  return plan_for(call).total;
}

CudnnAttention::Plan& CudnnAttention::ready_plan(const SdpaCall& call, SdpaDirection direction, void* workspace,
                                                 size_t workspace_bytes) {
  const char* op = direction == SdpaDirection::Forward ? "cuDNN attention forward" : "cuDNN attention backward";
  if (call.direction != direction) throw InternalError(fmt::format("{} called for a {} call", op, describe_call(call)));
  if (std::string why = unsupported_reason(call, DType::BF16); !why.empty())
    throw InternalError(fmt::format("{} cannot run {}: {}", op, describe_call(call), why));
  if (handle_ == nullptr) throw InternalError(fmt::format("{}: plans built for a described device do not run", op));
  Plan& p = plan_for(call);
  if (workspace_bytes < p.total ||
      (p.total > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % kAlign != 0)))
    throw InternalError(fmt::format("{} {}: the workspace ({} bytes at {}) must be {} bytes, {}-byte aligned", op,
                                    describe_call(call), workspace_bytes, workspace, p.total, kAlign));
  return p;
}

void CudnnAttention::execute(Plan& p, void* cudnn_workspace, StreamRef stream) {
  const auto& api = lib_->api();
  for (size_t i = 0; i < p.uids.size(); ++i)
    if (p.pointers[i] == nullptr)
      throw InternalError(fmt::format("cuDNN attention: tensor {} is not bound", p.graph.tensor(p.uids[i]).name));
  ST_CHECK_CUDNN(*lib_, api.SetStream(handle_, static_cast<cudaStream_t>(stream.handle)));
  cudnnBackendDescriptor_t pack = nullptr;
  ST_CHECK_CUDNN(*lib_, api.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
  struct Release {
    const CudnnLibrary::Api& api;
    cudnnBackendDescriptor_t d;
    ~Release() { api.BackendDestroyDescriptor(d); }
  } release{api, pack};
  const auto n = static_cast<int64_t>(p.uids.size());
  ST_CHECK_CUDNN(*lib_,
                 api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, p.uids.data()));
  ST_CHECK_CUDNN(*lib_, api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                                                p.pointers.data()));
  ST_CHECK_CUDNN(*lib_,
                 api.BackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &cudnn_workspace));
  ST_CHECK_CUDNN(*lib_, api.BackendFinalize(pack));
  ST_CHECK_CUDNN(*lib_, api.BackendExecute(handle_, p.exec.plan.get(), pack));
}

kernels::AttentionSequences CudnnAttention::queue_sequence_arrays(const Plan& p, const SdpaCall& call,
                                                                  const int32_t* segments, char* ws,
                                                                  kernels::DataErrorRecord* error, StreamRef stream) {
  const SdpaGraph& g = p.graph;
  const auto dims =
      kernels::AttentionSequenceDims{call.batch, call.seq, call.heads, call.kv_heads, call.head_dim, g.graph_batch};
  kernels::AttentionSequences arrays;
  if (g.padding_mask) arrays.lengths = reinterpret_cast<int32_t*>(ws + p.seq_lens_at);
  if (g.ragged) {
    arrays.q_offsets = reinterpret_cast<int64_t*>(ws + p.offsets_qo_at);
    arrays.kv_offsets = reinterpret_cast<int64_t*>(ws + p.offsets_kv_at);
    arrays.stats_offsets = reinterpret_cast<int64_t*>(ws + p.offsets_stats_at);
  }
  if (g.padding_mask) kernels::attention_sequences(g.ragged ? segments : nullptr, dims, arrays, error, stream);
  return arrays;
}

void CudnnAttention::forward(const SdpaCall& call, const SdpaForwardTensors& t, void* workspace, size_t workspace_bytes,
                             kernels::DataErrorRecord* error, StreamRef stream) {
  Plan& p = ready_plan(call, SdpaDirection::Forward, workspace, workspace_bytes);
  const SdpaGraph& g = p.graph;
  for (const void* ptr : {t.q, t.k, t.v, static_cast<const void*>(t.out), static_cast<const void*>(t.lse)})
    if (ptr == nullptr || !aligned16(ptr))
      throw InternalError("cuDNN attention forward: q, k, v, out and lse must be 16-byte aligned device pointers");
  if (g.ragged && t.segments == nullptr) throw InternalError("cuDNN attention forward: packed documents need segments");
  char* ws = static_cast<char*>(workspace);
  const kernels::AttentionSequences arrays = queue_sequence_arrays(p, call, t.segments, ws, error, stream);
  float* stats = g.ragged ? reinterpret_cast<float*>(ws + p.scratch_at(sdpa_uid::Stats)) : t.lse;
  using namespace sdpa_uid;
  p.bind(Q, t.q);
  p.bind(K, t.k);
  p.bind(V, t.v);
  p.bind(O, t.out);
  p.bind(Stats, stats);
  p.bind(Scale, &p.scalars[0]);
  p.bind(MaskFill, &p.scalars[4]);
  p.bind(SeqLenQ, arrays.lengths);
  p.bind(SeqLenKV, arrays.lengths);
  p.bind(OffsetsQO, arrays.q_offsets);
  p.bind(OffsetsKV, arrays.kv_offsets);
  p.bind(OffsetsStats, arrays.stats_offsets);
  execute(p, ws + p.cudnn_at, stream);
  if (g.ragged) {
    kernels::attention_stats_from_tokens(stats, t.segments, call.batch, call.seq, call.heads, t.lse, stream);
    kernels::attention_zero_padding_rows(t.segments, call.batch * call.seq, call.heads * call.head_dim,
                                         static_cast<uint16_t*>(t.out), stream);
  }
}

void CudnnAttention::backward(const SdpaCall& call, const SdpaBackwardTensors& t, void* workspace, size_t workspace_bytes,
                              kernels::DataErrorRecord* error, StreamRef stream) {
  Plan& p = ready_plan(call, SdpaDirection::Backward, workspace, workspace_bytes);
  const SdpaGraph& g = p.graph;
  for (const void* ptr : {t.q, t.k, t.v, t.out, static_cast<const void*>(t.lse), t.dout, static_cast<const void*>(t.dq),
                          static_cast<const void*>(t.dk), static_cast<const void*>(t.dv)})
    if (ptr == nullptr || !aligned16(ptr))
      throw InternalError(
          "cuDNN attention backward: q, k, v, out, lse, dout, dq, dk and dv must be 16-byte aligned device pointers");
  if (g.ragged && t.segments == nullptr) throw InternalError("cuDNN attention backward: packed documents need segments");
  char* ws = static_cast<char*>(workspace);
  const kernels::AttentionSequences arrays = queue_sequence_arrays(p, call, t.segments, ws, error, stream);
  const float* stats = t.lse;
  if (g.ragged) {
    float* tokens_major = reinterpret_cast<float*>(ws + p.scratch_at(sdpa_uid::Stats));
    kernels::attention_stats_to_tokens(t.lse, call.batch, call.seq, call.heads, tokens_major, stream);
    stats = tokens_major;
  }
  using namespace sdpa_uid;
  for (const GraphTensor& gt : g.tensors) {
    if (gt.scratch_bytes <= 0 || gt.uid == Stats) continue;
    void* at = ws + p.scratch_at(gt.uid);
    p.bind(gt.uid, at);
    if (gt.zero_before_execute)
      ST_CHECK_CUDA(cudaMemsetAsync(at, 0, static_cast<size_t>(gt.scratch_bytes), static_cast<cudaStream_t>(stream.handle)));
  }
  p.bind(Q, t.q);
  p.bind(K, t.k);
  p.bind(V, t.v);
  p.bind(O, t.out);
  p.bind(dO, t.dout);
  p.bind(Stats, stats);
  p.bind(dQ, t.dq);
  p.bind(dK, t.dk);
  p.bind(dV, t.dv);
  p.bind(Scale, &p.scalars[0]);
  p.bind(MaskFill, &p.scalars[4]);
  p.bind(One, &p.scalars[8]);
  p.bind(SeqLenQ, arrays.lengths);
  p.bind(SeqLenKV, arrays.lengths);
  p.bind(OffsetsQO, arrays.q_offsets);
  p.bind(OffsetsKV, arrays.kv_offsets);
  p.bind(OffsetsStats, arrays.stats_offsets);
  execute(p, ws + p.cudnn_at, stream);
  if (g.ragged) {
    const int64_t tokens = call.batch * call.seq;
    kernels::attention_zero_padding_rows(t.segments, tokens, call.heads * call.head_dim, static_cast<uint16_t*>(t.dq),
                                         stream);
    kernels::attention_zero_padding_rows(t.segments, tokens, call.kv_heads * call.head_dim, static_cast<uint16_t*>(t.dk),
                                         stream);
    kernels::attention_zero_padding_rows(t.segments, tokens, call.kv_heads * call.head_dim, static_cast<uint16_t*>(t.dv),
                                         stream);
  }
}

}  // namespace shardtrain::ops::cuda
