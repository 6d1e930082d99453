// The cuBLASLt API that src/ops/cuda/gemm.cpp uses, on the host (SHARDTRAIN_CUDA=EMULATED), with the
// semantics the cuBLASLt documentation gives: column-major layouts (rows, cols, leading dimension),
// D = alpha op(A) op(B) + beta C with op() the descriptor's TRANSA / TRANSB, alpha and beta read from host
// memory when the call is made, C not read when beta is 0, fp32 accumulation (bf16 and fp32 operands; TF32
// rounds the operands' mantissas to 10 bits first). Every check cuBLASLt makes, and a few it leaves to the
// caller, fail with CUBLAS_STATUS_INVALID_VALUE and a message: inconsistent shapes, a leading dimension
// shorter than the rows, a pointer less aligned than the algorithm was chosen for, operands outside device
// memory. The product runs on the stream, when the emulator's schedule gets to it, through OpenBLAS.
#include <cblas.h>
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/runtime/dtype.hpp"
#include "tests/emulator/cuda_emulator.hpp"

struct cublasLtContext {
  int unused = 0;
};

namespace shardtrain::cuda_emulator {
namespace {

// What the semi-opaque structs hold here.
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Desc {
  cublasComputeType_t compute;
  cudaDataType scale;
  cublasOperation_t transa, transb;
};
struct Pref {
  uint64_t max_workspace;
  uint32_t align[4];  // A, B, C, D
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(4 * sizeof(uint32_t) <= sizeof(cublasLtMatmulAlgo_t));

template <typename T, typename Opaque>
T& as(Opaque* o) {
  return *reinterpret_cast<T*>(o->data);
}

cublasStatus_t invalid(const std::string& message) {
  std::fprintf(stderr, "cuda emulator (cuBLASLt): %s\n", message.c_str());
  return CUBLAS_STATUS_INVALID_VALUE;
}

size_t element_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : t == CUDA_R_32F ? 4 : 0; }

// The problem a descriptor and its layouts describe, checked as cuBLASLt checks it.
struct Problem {
  uint64_t m = 0, n = 0, k = 0;
  bool tf32 = false;
};

cublasStatus_t check_problem(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dl,
                             Problem* p) {
  const bool ta = d.transa == CUBLAS_OP_T, tb = d.transb == CUBLAS_OP_T;
  if ((d.transa != CUBLAS_OP_N && !ta) || (d.transb != CUBLAS_OP_N && !tb))
    return invalid("only CUBLAS_OP_N and CUBLAS_OP_T");
  p->m = ta ? a.cols : a.rows;
  p->k = ta ? a.rows : a.cols;
  const uint64_t kb = tb ? b.cols : b.rows;
  p->n = tb ? b.rows : b.cols;
  if (kb != p->k)
    return invalid("op(A) is " + std::to_string(p->m) + " x " + std::to_string(p->k) + " but op(B) has " +
                   std::to_string(kb) + " rows");
  if (c.rows != p->m || c.cols != p->n || dl.rows != p->m || dl.cols != p->n)
    return invalid("C / D are " + std::to_string(c.rows) + " x " + std::to_string(c.cols) + ", op(A) op(B) is " +
                   std::to_string(p->m) + " x " + std::to_string(p->n));
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (l->ld < static_cast<int64_t>(l->rows) || l->ld < 1)
      return invalid("leading dimension " + std::to_string(l->ld) + " below the rows (" + std::to_string(l->rows) + ")");
    if (!element_bytes(l->type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (d.scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (a.type != b.type || c.type != dl.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d.compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
    if (a.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->tf32 = true;
  } else if (d.compute != CUBLAS_COMPUTE_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (a.type == CUDA_R_32F && c.type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

size_t matrix_bytes(const Layout& l) {
  return l.cols == 0 || l.rows == 0 ? 0 : ((l.cols - 1) * static_cast<uint64_t>(l.ld) + l.rows) * element_bytes(l.type);
}

// The stored matrix as fp32, column-major with the same leading dimension.
std::vector<float> to_f32(const void* p, const Layout& l, bool tf32) {
  const size_t count = matrix_bytes(l) / element_bytes(l.type);
  std::vector<float> out(count);
  if (l.type == CUDA_R_32F) {
    std::memcpy(out.data(), p, count * sizeof(float));
  } else {
    const auto* h = static_cast<const uint16_t*>(p);
    for (size_t i = 0; i < count; ++i) out[i] = float_from_bf16_bits(h[i]);
  }
  if (tf32) {  // round to nearest, 10 mantissa bits
    for (float& v : out) {
      if (!std::isfinite(v)) continue;
      uint32_t u;
      std::memcpy(&u, &v, 4);
      u = (u + 0x1000u) & 0xffffe000u;
      std::memcpy(&v, &u, 4);
    }
  }
  return out;
}

}  // namespace
}  // namespace shardtrain::cuda_emulator

using namespace shardtrain::cuda_emulator;  // NOLINT: the C API below is this file's whole purpose

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  count_call("cublasLtCreate");
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  count_call("cublasLtMatmulDescCreate");
  *desc = new cublasLtMatmulDescOpaque_t{};
  as<Desc>(*desc) = Desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t bytes) {
  Desc& d = as<Desc>(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (bytes != sizeof(int32_t)) return invalid("TRANSA / TRANSB take an int32_t");
      int32_t v;
      std::memcpy(&v, buf, sizeof v);
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d.transa : d.transb) = static_cast<cublasOperation_t>(v);
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      std::fprintf(stderr,
                   "cuda emulator (cuBLASLt): matmul descriptor attribute %d is not modelled: add it to "
                   "tests/emulator/cublaslt.cpp\n",
                   static_cast<int>(attr));
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
  count_call("cublasLtMatrixLayoutCreate");
  if (ld < static_cast<int64_t>(rows) && rows > 0) return invalid("cublasLtMatrixLayoutCreate: ld below rows");
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  as<Layout>(*layout) = Layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  count_call("cublasLtMatmulPreferenceCreate");
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  as<Pref>(*pref) = Pref{0, {256, 256, 256, 256}};  // cuBLASLt's defaults: fully aligned, no workspace
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                                 size_t bytes) {
  Pref& p = as<Pref>(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (bytes != sizeof(uint64_t)) return invalid("MAX_WORKSPACE_BYTES takes a uint64_t");
      std::memcpy(&p.max_workspace, buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (bytes != sizeof(uint32_t)) return invalid("MIN_ALIGNMENT_*_BYTES take a uint32_t");
      const int i = attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES   ? 0
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES ? 1
                    : attr == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES ? 2
                                                                         : 3;
      std::memcpy(&p.align[i], buf, bytes);
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      std::fprintf(stderr, "cuda emulator (cuBLASLt): preference attribute %d is not modelled\n", static_cast<int>(attr));
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t pref, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* found) {
  count_call("cublasLtMatmulAlgoGetHeuristic");
  *found = 0;
  if (requested < 1) return invalid("requestedAlgoCount below 1");
  Problem p;
  const cublasStatus_t s = check_problem(as<Desc>(desc), as<Layout>(a), as<Layout>(b), as<Layout>(c), as<Layout>(d), &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const Pref& pr = as<Pref>(pref);
  const cudaDataType types[4] = {as<Layout>(a).type, as<Layout>(b).type, as<Layout>(c).type, as<Layout>(d).type};
  for (int i = 0; i < 4; ++i) {
    // An algorithm needs at least element alignment; none is found below it (the caller falls back).
    if (pr.align[i] < element_bytes(types[i]) || (pr.align[i] & (pr.align[i] - 1)) != 0) return CUBLAS_STATUS_SUCCESS;
  }
  results[0] = cublasLtMatmulHeuristicResult_t{};
  std::memcpy(results[0].algo.data, pr.align, sizeof pr.align);  // the alignment the algorithm may assume
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                                           cublasLtMatrixLayout_t adesc, const void* B, cublasLtMatrixLayout_t bdesc,
                                           const void* beta, const void* C, cublasLtMatrixLayout_t cdesc, void* D,
                                           cublasLtMatrixLayout_t ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
  const Desc dsc = as<Desc>(desc);
  const Layout la = as<Layout>(adesc), lb = as<Layout>(bdesc), lc = as<Layout>(cdesc), ld = as<Layout>(ddesc);
  Problem p;
  if (cublasStatus_t s = check_problem(dsc, la, lb, lc, ld, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  if (!algo) return invalid("cublasLtMatmul without an algorithm (shardtrain always passes the heuristic's)");
  uint32_t align[4];
  std::memcpy(align, algo->data, sizeof align);
  const void* ptrs[4] = {A, B, C, D};
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    if (align[i] == 0 || reinterpret_cast<uintptr_t>(ptrs[i]) % align[i] != 0)
      return invalid(std::string("cublasLtMatmul: ") + names[i] + " is less aligned than the " + std::to_string(align[i]) +
                     " bytes its algorithm was chosen for");
  }
  if (classify(alpha) == Memory::Device || classify(beta) == Memory::Device)
    return invalid("alpha / beta in device memory without CUBLASLT_POINTER_MODE_DEVICE");
  float alpha_v, beta_v;
  std::memcpy(&alpha_v, alpha, sizeof alpha_v);
  std::memcpy(&beta_v, beta, sizeof beta_v);
  require_device_range(A, matrix_bytes(la), "cublasLtMatmul A", false);
  require_device_range(B, matrix_bytes(lb), "cublasLtMatmul B", false);
  if (beta_v != 0.0f) require_device_range(C, matrix_bytes(lc), "cublasLtMatmul C", false);
  require_device_range(D, matrix_bytes(ld), "cublasLtMatmul D", false);
  if (workspace_bytes > 0) require_device_range(workspace, workspace_bytes, "cublasLtMatmul workspace", false);
  if (C == D && (lc.ld != ld.ld || lc.type != ld.type)) return invalid("in-place C = D with different layouts");
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;

  submit(
      stream,
      [=] {
        std::vector<float> fa = to_f32(A, la, p.tf32), fb = to_f32(B, lb, p.tf32);
        const size_t count = p.m == 0 ? 0 : (p.n - 1) * static_cast<uint64_t>(ld.ld) + p.m;
        std::vector<float> fc(count, 0.0f);
        if (beta_v != 0.0f) {
          const std::vector<float> c32 = to_f32(C, lc, false);
          for (uint64_t j = 0; j < p.n; ++j)
            for (uint64_t i = 0; i < p.m; ++i) fc[j * ld.ld + i] = c32[j * lc.ld + i];
        }
        if (p.k == 0) {
          for (float& v : fc) v *= beta_v;
        } else {
          cblas_sgemm(CblasColMajor, dsc.transa == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                      dsc.transb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, static_cast<int>(p.m), static_cast<int>(p.n),
                      static_cast<int>(p.k), alpha_v, fa.data(), static_cast<int>(la.ld), fb.data(), static_cast<int>(lb.ld),
                      beta_v, fc.data(), static_cast<int>(ld.ld));
        }
        for (uint64_t j = 0; j < p.n; ++j) {
          for (uint64_t i = 0; i < p.m; ++i) {
            const float v = fc[j * ld.ld + i];
            if (ld.type == CUDA_R_32F) {
              static_cast<float*>(D)[j * ld.ld + i] = v;
            } else {
              static_cast<uint16_t*>(D)[j * ld.ld + i] = shardtrain::bf16_bits_from_float(v);
            }
          }
        }
      },
      "cublasLtMatmul");
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument (see the emulator's message)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_ALLOC_FAILED: return "resource allocation failed";
    default: return "an internal operation failed (CUDA emulator)";
  }
}

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t s) { return cublasGetStatusName(s); }
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

}  // extern "C"
