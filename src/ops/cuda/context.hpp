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

  template <typename T>
  T* scratch_for(Slot slot, int64_t count) {
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
  // Attention: cuDNN's backward deterministic or not (deterministic_attention_from_env() at start,
  // CudaOps::set_deterministic_attention), and the calls whose choice of implementation was logged.
  bool deterministic_attention = false;
  std::set<std::string> attention_logged;
  // cuDNN's fused attention (cudnn_attention.hpp), made at the first attention call that may use it.
  std::unique_ptr<CudnnAttention> cudnn;
  CudnnAttention& cudnn_attention();
};

std::string attention_choice(Context& ctx, const AttentionShape& shape, DType dtype, const AttentionMask& mask,
                             bool backward);

inline void require_device(const Tensor& t, const char* op, const char* name) {
  require(t.defined(), op, "{} is not bound", name);
  require(t.device == DeviceKind::Cuda, op, "{} ({}) is not in device memory: the CUDA backend takes CUDA tensors", name,
          t.describe());
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
  void require_resident(const Tensor& t, const char* op, const char* name) const override { require_device(t, op, name); }
  void require_float(const Tensor& t, const char* op, const char* name) const override { cuda::require_float(t, op, name); }
  void require_peer(const Tensor& t, const char* op, const char* name) const override { cuda::require_float(t, op, name); }
};
inline constexpr DeviceTensorChecks tensor_checks{};

// The op families' entry points, cuda::<op>(Context&, the op's parameters) for each op of op_list.inc:
// gemm.cpp (matmul, matmul_add: any mix of f32 and bf16, natively where cuBLASLt can, else through fp32 copies
// like the CPU backend; matmul_add in one cuBLASLt call, C read and D written), elementwise.cpp, norm_rope.cpp,
// attention.cpp, loss.cpp.
#define SHARDTRAIN_OP(R, name, params, args) R name(Context& ctx, SHARDTRAIN_OP_UNPAREN params);
#include "shardtrain/ops/op_list.inc"
#undef SHARDTRAIN_OP

}  // namespace shardtrain::ops::cuda
