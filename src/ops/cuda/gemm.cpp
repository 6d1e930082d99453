// cuBLASLt GEMMs (gemm.hpp) and the backend's matmul: native for bf16 x bf16 -> bf16/f32 and
// f32 x f32 -> f32 with fp32 accumulation (CUBLAS_COMPUTE_32F, or _FAST_TF32 when asked for); any other
// mix, or a layout cuBLASLt has no algorithm for, runs in fp32 copies as the CPU backend does.
#include "gemm.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "context.hpp"
#include "kernels/elementwise.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::ops::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: break;
  }
  throw InternalError(fmt::format("matmul: dtype {} has no cuBLASLt path", dtype_name(t)));
}

// The largest power of two (at most 256) dividing the address: cuBLASLt's heuristic must only pick
// algorithms that work at this alignment (row slices of a matrix are often not 256-byte aligned).
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a >>= 1;
  return a;
}

bool native_combination(DType a, DType b, DType c) {
  if (a != b) return false;
  if (a == DType::BF16) return c == DType::BF16 || c == DType::F32;
  return a == DType::F32 && c == DType::F32;
}

struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, T value) {
  ST_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof(value)));
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, T value) {
  ST_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof(value)));
}

}  // namespace

LtGemm::LtGemm(size_t workspace_bytes, F32MatmulPrecision f32_precision)
    : workspace_(workspace_bytes), f32_precision_(f32_precision) {
  ST_CHECK_CUBLAS(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();  // descriptors before the handle
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan& LtGemm::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  Plan p;
  const bool tf32 = key.a_dtype == DType::F32 && f32_precision_ == F32MatmulPrecision::Tf32;
  cublasLtMatmulDesc_t desc = nullptr;
  ST_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p.desc.reset(desc);
  // cuBLASLt's A is our b and its B is our a (see gemm.hpp).
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, key.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, key.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  // Stored row-major shapes: a (a_rows, a_cols), b (b_rows, b_cols); column-major they are transposed.
  const int64_t a_rows = key.ta ? key.k : key.m, a_cols = key.ta ? key.m : key.k;
  const int64_t b_rows = key.tb ? key.n : key.k, b_cols = key.tb ? key.k : key.n;
  auto make_layout = [](DType t, int64_t rows, int64_t cols) {
    cublasLtMatrixLayout_t l = nullptr;
    ST_CHECK_CUBLAS(
        cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows));
    return LayoutPtr(l);
  };
  p.a = make_layout(key.b_dtype, b_cols, b_rows);
  p.b = make_layout(key.a_dtype, a_cols, a_rows);
  p.c = make_layout(key.c_dtype, key.n, key.m);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  ST_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref_raw));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter> pref(pref_raw);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_.size()));
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.b_align);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.a_align);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.c_align);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.c_align);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc, p.a.get(), p.b.get(), p.c.get(), p.c.get(),
                                                               pref_raw, 1, &result, &found);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
      (status == CUBLAS_STATUS_SUCCESS && (found == 0 || result.state != CUBLAS_STATUS_SUCCESS))) {
    p.supported = false;
  } else {
    ST_CHECK_CUBLAS(status);
    p.algo = result.algo;
    p.supported = true;
  }
  return plans_.emplace(key, std::move(p)).first->second;
}

bool LtGemm::run(const GemmCall& call, StreamRef stream) {
  if (!native_combination(call.a_dtype, call.b_dtype, call.c_dtype)) return false;
  const void* c_in = call.c_in != nullptr ? call.c_in : call.c;
  // C and D share a layout; the algorithm must suit the less aligned of the two.
  const uint32_t c_align = std::min(alignment_of(call.c), alignment_of(c_in));
  const Key key{call.ta == Transpose::Yes ? 1 : 0,
                call.tb == Transpose::Yes ? 1 : 0,
                call.m,
                call.n,
                call.k,
                call.a_dtype,
                call.b_dtype,
                call.c_dtype,
                alignment_of(call.a),
                alignment_of(call.b),
                c_align};
  const Plan& plan = plan_for(key);
  if (!plan.supported) return false;
  ST_CHECK_CUBLAS(cublasLtMatmul(handle_, plan.desc.get(), &call.alpha, call.b, plan.a.get(), call.a, plan.b.get(),
                                 &call.beta, c_in, plan.c.get(), call.c, plan.c.get(), &plan.algo, workspace_.data(),
                                 workspace_.size(), static_cast<cudaStream_t>(stream.handle)));
  return true;
}

void matmul(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
            const Tensor& c) {
  const auto [m, n, k] = validate_matmul(tensor_checks, ta, tb, a, b, c);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // c = beta c
    if (beta == 0.0) kernels::elementwise_fill(c.dtype, c.data, c.numel(), 0.0f, ctx.stream);
    else if (beta != 1.0) kernels::elementwise_scale(c.dtype, c.data, c.numel(), static_cast<float>(beta), ctx.stream);
    return;
  }
  const GemmCall call{ta,
                      tb,
                      m,
                      n,
                      k,
                      a.data,
                      a.dtype,
                      b.data,
                      b.dtype,
                      c.data,
                      c.dtype,
                      static_cast<float>(alpha),
                      static_cast<float>(beta)};
  if (ctx.gemm.run(call, ctx.stream)) return;

  // fp32 copies of whatever is not fp32, one fp32 GEMM, then c rounded back once (the CPU backend's way).
  GemmCall f = call;
  if (a.dtype != DType::F32) {
    float* p = ctx.scratch_for<float>(Slot::GemmA, a.numel());
    kernels::elementwise_copy(a.dtype, a.data, DType::F32, p, a.numel(), ctx.stream);
    f.a = p;
    f.a_dtype = DType::F32;
  }
  if (b.dtype != DType::F32) {
    float* p = ctx.scratch_for<float>(Slot::GemmB, b.numel());
    kernels::elementwise_copy(b.dtype, b.data, DType::F32, p, b.numel(), ctx.stream);
    f.b = p;
    f.b_dtype = DType::F32;
  }
  if (c.dtype != DType::F32) {
    float* p = ctx.scratch_for<float>(Slot::GemmC, m * n);
    if (beta != 0.0) kernels::elementwise_copy(c.dtype, c.data, DType::F32, p, m * n, ctx.stream);
    f.c = p;
    f.c_dtype = DType::F32;
  }
  if (!ctx.gemm.run(f, ctx.stream))
    throw InternalError(fmt::format("matmul: cuBLASLt has no fp32 algorithm for ({} x {}) @ ({} x {}), ta={}, tb={}", m, k,
                                    k, n, ta == Transpose::Yes, tb == Transpose::Yes));
  if (c.dtype != DType::F32) kernels::elementwise_copy(DType::F32, f.c, c.dtype, c.data, m * n, ctx.stream);
}

void matmul_add(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, const Tensor& c,
                const Tensor& out) {
  const auto [m, n, k] = validate_matmul_add(tensor_checks, ta, tb, a, b, c, out);
  if (c.data != out.data && m > 0 && n > 0 && k > 0) {
    GemmCall call{ta, tb, m, n, k, a.data, a.dtype, b.data, b.dtype, out.data, out.dtype, static_cast<float>(alpha), 1.0f};
    call.c_in = c.data;
    if (ctx.gemm.run(call, ctx.stream)) return;
  }
  if (c.data != out.data) copy(ctx, c, out);
  matmul(ctx, ta, tb, alpha, a, b, 1.0, out);
}

}  // namespace shardtrain::ops::cuda
