// GEMM through OpenBLAS: sgemm for the fp32 family (bf16 operands are widened to fp32 scratch first),
// dgemm for f64. OpenBLAS runs single-threaded inside each call and the backend splits C into row or column
// blocks over its OpenMP threads: one thread pool for every op, since OpenBLAS's own pthreads and idle OpenMP
// threads spinning next to them slow both down by orders of magnitude on a small machine.
#include <cblas.h>

#include <algorithm>

#include "kernels.hpp"

namespace shardtrain::ops::cpu {
namespace {

CBLAS_TRANSPOSE to_cblas(Transpose t) { return t == Transpose::Yes ? CblasTrans : CblasNoTrans; }

void scale_in_place(Context& ctx, const Tensor& c, double beta) {
  if (beta == 1.0) return;
  if (beta == 0.0) {
    fill(ctx, c, 0.0);
    return;
  }
  dispatch_float(c.dtype, "matmul", [&](auto tag) {
    using T = decltype(tag);
    T* p = c.as<T>();
    for (int64_t i = 0; i < c.numel(); ++i) store(p[i], load(p[i]) * static_cast<acc_t<T>>(beta));
  });
}

template <typename A>
void gemm_block(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda, const A* b,
                int64_t ldb, A beta, A* c, int64_t ldc) {
  const auto bm = static_cast<blasint>(m), bn = static_cast<blasint>(n), bk = static_cast<blasint>(k);
  if constexpr (std::is_same_v<A, float>) {
    cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), bm, bn, bk, alpha, a, static_cast<blasint>(lda), b,
                static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), bm, bn, bk, alpha, a, static_cast<blasint>(lda), b,
                static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
  }
}

}  // namespace

template <typename A>
void gemm_raw(int threads, Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda,
              const A* b, int64_t ldb, A beta, A* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // Split the larger of M and N into blocks of whole 16-row/column panels, one per thread.
  constexpr int64_t kPanel = 16;
  const bool split_rows = m >= n;
  const int64_t extent = split_rows ? m : n;
  const int64_t parts = std::min<int64_t>(threads, extent / (2 * kPanel));
  if (parts <= 1 || m * n * k < (int64_t{1} << 18)) {
    gemm_block(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t panels = (extent + kPanel - 1) / kPanel;
  const int team = static_cast<int>(parts);  // a name: clang-format mangles a cast inside the pragma
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t lo = std::min(extent, panels * p / parts * kPanel),
                  hi = std::min(extent, panels * (p + 1) / parts * kPanel);
    if (hi <= lo) continue;
    if (split_rows) {  // rows [lo, hi) of C = rows of op(A)
      const A* ap = ta == Transpose::No ? a + lo * lda : a + lo;
      gemm_block(ta, tb, hi - lo, n, k, alpha, ap, lda, b, ldb, beta, c + lo * ldc, ldc);
    } else {  // columns [lo, hi) of C = columns of op(B)
      const A* bp = tb == Transpose::No ? b + lo : b + lo * ldb;
      gemm_block(ta, tb, m, hi - lo, k, alpha, a, lda, bp, ldb, beta, c + lo, ldc);
    }
  }
}
template void gemm_raw<float>(int, Transpose, Transpose, int64_t, int64_t, int64_t, float, const float*, int64_t,
                              const float*, int64_t, float, float*, int64_t);
template void gemm_raw<double>(int, Transpose, Transpose, int64_t, int64_t, int64_t, double, const double*, int64_t,
                               const double*, int64_t, double, double*, int64_t);

void matmul(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, double beta,
            const Tensor& c) {
  const auto [m, n, k] = validate_matmul(tensor_checks, ta, tb, a, b, c);
  const int64_t a_cols = a.shape.cols(), b_cols = b.shape.cols();  // leading dims of the stored matrices
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_in_place(ctx, c, beta);
    return;
  }
  if (c.dtype == DType::F64) {
    gemm_raw<double>(ctx.threads, ta, tb, m, n, k, alpha, a.as<const double>(), a_cols, b.as<const double>(), b_cols, beta,
                     c.as<double>(), n);
    return;
  }
  const float* pa = as_compute<float>(ctx, Slot::GemmA, a);
  const float* pb = as_compute<float>(ctx, Slot::GemmB, b);
  if (c.dtype == DType::F32) {
    gemm_raw<float>(ctx.threads, ta, tb, m, n, k, static_cast<float>(alpha), pa, a_cols, pb, b_cols,
                    static_cast<float>(beta), c.as<float>(), n);
    return;
  }
  // bf16 output: compute in an fp32 copy of c, then round once.
  float* pc = ctx.scratch_for<float>(Slot::GemmC, m * n);
  bf16* out = c.as<bf16>();
  if (beta != 0.0) convert_bf16_to_f32(out, pc, static_cast<size_t>(m * n));
  gemm_raw<float>(ctx.threads, ta, tb, m, n, k, static_cast<float>(alpha), pa, a_cols, pb, b_cols, static_cast<float>(beta),
                  pc, n);
  convert_f32_to_bf16(pc, out, static_cast<size_t>(m * n));
}

void matmul_add(Context& ctx, Transpose ta, Transpose tb, double alpha, const Tensor& a, const Tensor& b, const Tensor& c,
                const Tensor& out) {
  validate_matmul_add(tensor_checks, ta, tb, a, b, c, out);
  if (c.data != out.data) copy(ctx, c, out);
  matmul(ctx, ta, tb, alpha, a, b, 1.0, out);
}

}  // namespace shardtrain::ops::cpu
