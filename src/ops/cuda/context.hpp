// Private state and helpers of the CUDA backend: its side of the shared argument checks (../validate.hpp),
// grow-only device scratch, the readback of loss sums and data errors, the cuBLASLt GEMM, and the op
// families' entry points (one .cpp per family), which mirror the CPU backend's (src/ops/cpu/kernels.hpp).
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../validate.hpp"
#include "gemm.hpp"
#include "kernels/cross_entropy.cuh"
#include "kernels/data_error.cuh"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops::cuda {

class CudnnAttention;

// Scratch slots: each use has its own, so a helper never overwrites its caller's buffer.
enum class Slot { GemmA, GemmB, GemmC, Logits, RowLoss, WeightGrad, OpWorkspace, SumPartials, Count };

// Grow-only device memory. Growing a buffer that holds memory first synchronizes the device, since work
// queued earlier (on any stream) may still use the old buffer; once shapes repeat, nothing grows.
class Scratch {
 public:
  void* get(size_t bytes);

 private:
  DeviceBuffer buffer_;
};

// What the host reads back at a synchronization point, in one copy.
struct Readback {
  kernels::LossSumsDevice sums;
  kernels::LossSumsDevice deferred;  // the losses since the last take_loss(), while deferring
  kernels::DataErrorRecord error;
};

struct Context {
  explicit Context(const CudaOpsOptions& options);
  ~Context();

  template <typename T> T* scratch_for(Slot slot, int64_t count) {
    return static_cast<T*>(scratch[static_cast<size_t>(slot)].get(static_cast<size_t>(count) * sizeof(T)));
  }
  kernels::DataErrorRecord* error_record() { return &static_cast<Readback*>(readback_device.data())->error; }
  kernels::LossSumsDevice* loss_sums() { return &static_cast<Readback*>(readback_device.data())->sums; }
  kernels::LossSumsDevice* deferred_sums() { return &static_cast<Readback*>(readback_device.data())->deferred; }
  // Copies the readback to pinned host memory, waits for the stream, and throws DataError (after resetting
  // the record) when a kernel recorded bad input since the last check.
  Readback synchronize_and_check();
  // Makes `next` the stream ops run on. Work already queued on the previous stream comes first (an event
  // the new stream waits for, no host synchronization): scratch and the cuBLASLt workspace are shared, and
  // ops keep running in call order.
  void switch_stream(StreamRef next);

  StreamRef stream;
  bool defer_loss = false;  // Ops::defer_loss: the losses add into Readback::deferred, nothing is read back
  cudaEvent_t stream_switch = nullptr;
  CudaOpsOptions options;
  std::vector<Scratch> scratch = std::vector<Scratch>(static_cast<size_t>(Slot::Count));
  DeviceBuffer readback_device;  // one Readback
  PinnedBuffer readback_host;    // its host mirror
  LtGemm gemm;
  // Attention: cuDNN's backward deterministic or not (CudaOps::set_deterministic_attention), and the calls whose
  // choice of implementation was logged.
  bool deterministic_attention = true;
  std::set<std::string> attention_logged;
  // cuDNN's fused attention (cudnn_attention.hpp), made at the first attention call that may use it.
  std::unique_ptr<CudnnAttention> cudnn;
  CudnnAttention& cudnn_attention();
};

std::string attention_choice(Context& ctx, const AttentionShape& shape, DType dtype, const AttentionMask& mask, bool backward);

inline void require_device(const Tensor& t, const char* op, const char* name) {
  require(t.defined(), op, "{} is not bound", name);
  require(t.device == DeviceKind::Cuda, op, "{} ({}) is not in device memory: the CUDA backend takes CUDA tensors",
          name, t.describe());
}

inline void require_float(const Tensor& t, const char* op, const char* name) {
  require_device(t, op, name);
  require(t.dtype != DType::F64, op, "{} is f64, which the CUDA backend does not support (the CPU backend does)", name);
  require(t.dtype == DType::F32 || t.dtype == DType::BF16, op, "{} has dtype {}, expected f32 or bf16", name,
          dtype_name(t.dtype));
}

// The CUDA backend's side of the shared validators: device memory; f32 or bf16. Every tensor a kernel
// touches is checked, peers included.
class DeviceTensorChecks final : public TensorChecks {
 public:
  void require_resident(const Tensor& t, const char* op, const char* name) const override {
    require_device(t, op, name);
  }
  void require_float(const Tensor& t, const char* op, const char* name) const override {
    cuda::require_float(t, op, name);
  }
  void require_peer(const Tensor& t, const char* op, const char* name) const override {
    cuda::require_float(t, op, name);
  }
};
inline constexpr DeviceTensorChecks tensor_checks{};

// gemm.cpp: c = alpha op(a) op(b) + beta c for any mix of f32 and bf16 (natively where cuBLASLt can, else
// through fp32 copies, like the CPU backend).
void matmul(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
            const Tensor& c);
// out = alpha op(a) op(b) + c in one cuBLASLt call (C read, D written) where native, else c copied into out and
// matmul with beta = 1.
void matmul_add(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b,
                const Tensor& c, const Tensor& out);

// elementwise.cpp
void fill(Context& ctx, const Tensor& out, double value);
void copy(Context& ctx, const Tensor& src, const Tensor& dst);
void add(Context& ctx, const Tensor& x, const Tensor& y);
void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out);
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable);
void swiglu_forward(Context& ctx, const Tensor& gate_up, GateUpLayout layout, const Tensor& out);
void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up, GateUpLayout layout,
                     const Tensor& dgate_up);
void sum_squares(Context& ctx, const Tensor& x, const Tensor& out, SumInto mode);

// norm_rope.cpp
void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     const Tensor& h_out, const Tensor& y, const Tensor& rstd);
void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight);
void rope(Context& ctx, const Tensor& x, const Tensor& positions, const RopeFrequencies& freq, RopeDirection direction);
void rope_qkv_forward(Context& ctx, const Tensor& qkv, const Tensor& positions, const RopeFrequencies& freq,
                      const Tensor& q, const Tensor& k, const Tensor& v);
void rope_qkv_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                       const RopeFrequencies& freq, const Tensor& dqkv);

// attention.cpp
void attention_forward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, const Tensor& out, const Tensor& lse);
void attention_backward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);
void attention_segments(Context& ctx, const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                        const Tensor& segments, const Tensor& positions);

// loss.cpp
LossSums cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, int32_t ignore_index,
                       double grad_scale, const Tensor& dlogits);
LossSums linear_cross_entropy(Context& ctx, const Tensor& h, const Tensor& weight, const Tensor& targets,
                              int32_t ignore_index, double grad_scale, int64_t chunk_tokens, const Tensor& dh,
                              const Tensor& dweight);

}  // namespace shardtrain::ops::cuda
