// cuBLASLt GEMMs for row-major tensors. cuBLASLt is column-major, and a row-major (r x c) matrix is the
// column-major (c x r) matrix with the same memory, so C = op(A) op(B) runs as C^T = op(B)^T op(A)^T:
// cuBLASLt's A is our b (transposed as tb), its B is our a (transposed as ta), m and n swap.
// One handle per backend; one plan (operation descriptor, three layouts, the heuristic's algorithm) per
// distinct key of transposes, sizes, dtypes and pointer alignments, asked for once and cached; one
// workspace allocated at construction.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>

#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::ops::cuda {

// c (m, n) = alpha op(a) op(b) + beta c, all contiguous row-major; op(a) is (m, k), op(b) is (k, n).
struct GemmCall {
  Transpose ta = Transpose::No, tb = Transpose::No;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  DType a_dtype = DType::F32;
  const void* b = nullptr;
  DType b_dtype = DType::F32;
  void* c = nullptr;  // D, and C unless c_in is set
  DType c_dtype = DType::F32;
  float alpha = 1, beta = 0;
  const void* c_in = nullptr;  // C when it is not D (same dtype and layout)
};

class LtGemm {
 public:
  LtGemm(size_t workspace_bytes, F32MatmulPrecision f32_precision);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Runs the call on `stream` and returns true when cuBLASLt supports its dtype combination (bf16 x bf16 ->
  // bf16 or f32, f32 x f32 -> f32) and its heuristic found an algorithm for its layouts and alignments;
  // returns false otherwise, having run nothing (the caller then converts to fp32).
  bool run(const GemmCall& call, StreamRef stream);
  size_t plans() const { return plans_.size(); }

 private:
  struct Key {
    int ta = 0, tb = 0;
    int64_t m = 0, n = 0, k = 0;
    DType a_dtype = DType::F32, b_dtype = DType::F32, c_dtype = DType::F32;
    uint32_t a_align = 0, b_align = 0, c_align = 0;
    auto operator<=>(const Key&) const = default;
  };
  struct DescDeleter {
    void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
  };
  struct LayoutDeleter {
    void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
  };
  using DescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescDeleter>;
  using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
  struct Plan {
    bool supported = false;
    DescPtr desc;
    LayoutPtr a, b, c;  // cuBLASLt's A (our b), B (our a), C = D (our c)
    cublasLtMatmulAlgo_t algo{};
  };

  const Plan& plan_for(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  F32MatmulPrecision f32_precision_;
  std::map<Key, Plan> plans_;
};

}  // namespace shardtrain::ops::cuda
