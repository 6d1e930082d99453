// RMSNorm forward (with the residual add fused) and backward. Rows run in parallel; the weight gradient
// is reduced over rows by threads that own column ranges, so its summation order never depends on the
// thread count.
#include <algorithm>
#include <cmath>

#include "kernels.hpp"

namespace shardtrain::ops::cpu {
namespace {

template <typename T>
void forward_rows(Context& ctx, const Tensor& x, const Tensor& residual, const acc_t<T>* w, double eps, const Tensor& h_out,
                  const Tensor& y, const Tensor& rstd) {
  using A = acc_t<T>;
  const int64_t rows = x.shape.rows(), d = x.shape.cols();
  const T* xp = x.as<const T>();
  const T* rp = residual.defined() ? residual.as<const T>() : nullptr;
  T* hp = h_out.defined() ? h_out.as<T>() : nullptr;
  T* yp = y.as<T>();
  A* rs = rstd.as<A>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (rows * d > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = xp + r * d;
    const T* hr = xr;
    if (rp) {
      T* hw = hp + r * d;
      const T* rr = rp + r * d;
      for (int64_t j = 0; j < d; ++j) store(hw[j], load(xr[j]) + load(rr[j]));
      hr = hw;  // normalize the stored (rounded) sum, which is what backward sees
    }
    A ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) ss += load(hr[j]) * load(hr[j]);
    const A inv = A(1) / std::sqrt(ss / static_cast<A>(d) + static_cast<A>(eps));
    rs[r] = inv;
    T* yr = yp + r * d;
    for (int64_t j = 0; j < d; ++j) store(yr[j], load(hr[j]) * inv * w[j]);
  }
}

template <typename T>
void backward_rows(Context& ctx, const Tensor& dy, const Tensor& h, const acc_t<T>* w, const Tensor& rstd,
                   const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  using A = acc_t<T>;
  const int64_t rows = h.shape.rows(), d = h.shape.cols();
  const T* gp = dy.as<const T>();
  const T* hp = h.as<const T>();
  const A* rs = rstd.as<const A>();
  const T* ep = dh_extra.defined() ? dh_extra.as<const T>() : nullptr;
  T* op = dh.as<T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (rows * d > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const T* g = gp + r * d;
    const T* hr = hp + r * d;
    const A inv = rs[r];
    // c = mean(w * dy * xhat), xhat = h * rstd
    A dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < d; ++j) dot += w[j] * load(g[j]) * load(hr[j]);
    const A c = dot * inv / static_cast<A>(d);
    T* o = op + r * d;
    const T* e = ep ? ep + r * d : nullptr;
    for (int64_t j = 0; j < d; ++j) {
      const A v = inv * (w[j] * load(g[j]) - load(hr[j]) * inv * c);
      store(o[j], e ? v + load(e[j]) : v);
    }
  }
  // dweight[j] += sum_r dy[r, j] * h[r, j] * rstd[r]
  A* dw = ctx.scratch_for<A>(Slot::WeightGrad, d);
  constexpr int64_t kBlock = 32;
  const int64_t blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (rows * d > (1 << 14))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(d, j0 + kBlock);
    A acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* g = gp + r * d;
      const T* hr = hp + r * d;
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += load(g[j]) * load(hr[j]) * rs[r];
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] = acc[j - j0];
  }
  write_into(dw, dweight, Into::Add);
}

}  // namespace

void rmsnorm_forward(Context& ctx, const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     const Tensor& h_out, const Tensor& y, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const int64_t rows = validate_rmsnorm_forward(tensor_checks, x, residual, weight, y).rows;
  if (residual.defined()) {  // h_out: one check here, three in the CUDA backend
    require(h_out.defined() && h_out.dtype == x.dtype && h_out.numel() == x.numel(), op,
            "h_out must be bound like x when a residual is given");
  }
  require_stats(tensor_checks, rstd, x, rows, op, "rstd");
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const acc_t<T>* w = as_compute<acc_t<T>>(ctx, Slot::Weight, weight);
    forward_rows<T>(ctx, x, residual, w, eps, h_out, y, rstd);
  });
}

void rmsnorm_backward(Context& ctx, const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  const int64_t rows = validate_rmsnorm_backward(tensor_checks, h, weight, dweight).rows;
  for (const Tensor* t : {&dy, &dh, &dh_extra}) {
    if (t == &dh_extra && !t->defined()) continue;
    require(t->dtype == h.dtype && t->numel() == h.numel(), op, "{} is not shaped like h {}", t->describe(), h.describe());
  }
  require_stats(tensor_checks, rstd, h, rows, op, "rstd");
  dispatch_float(h.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const acc_t<T>* w = as_compute<acc_t<T>>(ctx, Slot::Weight, weight);
    backward_rows<T>(ctx, dy, h, w, rstd, dh_extra, dh, dweight);
  });
}

}  // namespace shardtrain::ops::cpu
