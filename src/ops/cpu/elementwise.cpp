// Fill, copy/cast, add, the sum of squares, embedding and SwiGLU on the CPU: flat OpenMP loops over elements or rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels.hpp"
#include "rows.hpp"

namespace shardtrain::ops::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;  // below this many elements a loop runs on one thread

}  // namespace

void fill(Context& ctx, const Tensor& out, double value) {
  require_float(out, "fill", "out");
  const int64_t n = out.numel();
  dispatch_float(out.dtype, "fill", [&](auto tag) {
    using T = decltype(tag);
    T* p = out.as<T>();
    T v;
    store(v, static_cast<acc_t<T>>(value));
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
}

void copy(Context& ctx, const Tensor& src, const Tensor& dst) {
  validate_copy(tensor_checks, src, dst);
  const int64_t n = src.numel();
  dispatch_float(src.dtype, "copy", [&](auto stag) {
    using S = decltype(stag);
    dispatch_float(dst.dtype, "copy", [&](auto dtag) {
      using T = decltype(dtag);
      const S* in = src.as<const S>();
      T* out = dst.as<T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<S, T>) out[i] = in[i];
        else store(out[i], static_cast<double>(load(in[i])));
      }
    });
  });
}

void add(Context& ctx, const Tensor& x, const Tensor& y) {
  validate_add(tensor_checks, x, y);
  const int64_t n = x.numel();
  dispatch_float(y.dtype, "add", [&](auto ytag) {
    using T = decltype(ytag);
    using A = acc_t<T>;
    const A* in = as_compute<A>(ctx, Slot::GemmA, x);
    T* out = y.as<T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) store(out[i], load(out[i]) + in[i]);
  });
}

// Each element squared in fp32 and added in double, as kernels/sum_squares.cu does; fixed blocks summed in
// parallel into a list, the list added in order: the same double at any thread count.
void sum_squares(Context& ctx, const Tensor& x, const Tensor& out, SumInto mode) {
  const char* op = "sum_squares";
  require_float(x, op, "x");
  require_cpu(out, op, "out");
  require(out.dtype == DType::F64 && out.numel() == 1, op, "out is {}, expected one f64 element", out.describe());
  constexpr int64_t kBlock = 16384;
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  dispatch_float(x.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.as<const T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (blocks > 2)
    for (int64_t b = 0; b < blocks; ++b) {
      double s = 0;
      for (int64_t k = b * kBlock, end = std::min(n, k + kBlock); k < end; ++k) {
        const float v = static_cast<float>(load(p[k]));
        s += static_cast<double>(v * v);
      }
      partial[static_cast<size_t>(b)] = s;
    }
  });
  double total = 0;
  for (const double s : partial) total += s;
  double* o = out.as<double>();
  *o = mode == SumInto::Accumulate ? *o + total : total;
}

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& table, const Tensor& out) {
  const char* op = "embedding_forward";
  const EmbeddingDims dims = validate_embedding_forward(tensor_checks, ids, table, out);
  const int64_t n = dims.tokens, vocab = dims.vocab, d = dims.dim;
  const int32_t* id = ids.as<const int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= vocab)
      throw DataError(fmt::format("token id {} at position {} is outside the vocabulary [0, {})", id[i], i, vocab));
  }
  dispatch_float(table.dtype, op, [&](auto ttag) {
    using S = decltype(ttag);
    dispatch_float(out.dtype, op, [&](auto otag) {
      using T = decltype(otag);
      const S* tab = table.as<const S>();
      T* o = out.as<T>();
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n * d > kParallelMin)
      for (int64_t i = 0; i < n; ++i) {
        const S* row = tab + id[i] * d;
        T* dst = o + i * d;
        for (int64_t j = 0; j < d; ++j) {
          if constexpr (std::is_same_v<S, T>) dst[j] = row[j];
          else store(dst[j], static_cast<double>(load(row[j])));
        }
      }
    });
  });
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const char* op = "embedding_backward";
  const EmbeddingDims dims = validate_embedding_backward(tensor_checks, ids, dout, dtable);
  const int64_t n = dims.tokens, vocab = dims.vocab, d = dims.dim;
  const int32_t* id = ids.as<const int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= vocab)
      throw DataError(fmt::format("token id {} at position {} is outside the vocabulary [0, {})", id[i], i, vocab));
  }
  // Threads own column ranges, and each walks the tokens in order: no races, and the same sums at any
  // thread count.
  dispatch_float(dout.dtype, op, [&](auto gtag) {
    using G = decltype(gtag);
    dispatch_float(dtable.dtype, op, [&](auto ttag) {
      using T = decltype(ttag);
      const G* g = dout.as<const G>();
      T* tab = dtable.as<T>();
      constexpr int64_t kBlock = 64;
      const int64_t blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(ctx.threads) schedule(static) if (n * d > kParallelMin)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t j0 = blk * kBlock, j1 = std::min(d, j0 + kBlock);
        for (int64_t i = 0; i < n; ++i) {
          T* row = tab + id[i] * d;
          const G* src = g + i * d;
          for (int64_t j = j0; j < j1; ++j) store(row[j], load(row[j]) + load(src[j]));
        }
      }
    });
  });
}

// SwiGLU runs in blocks of kSwigluBlock elements over the threads: the fp32 loops of rows.hpp (vectorized for
// the CPU at hand) straight on f32 tensors, through a few blocks of fp32 scratch per thread otherwise.
constexpr int64_t kSwigluBlock = 4096;
template <typename A, int Buffers> using BlockScratch = A[Buffers][kSwigluBlock];

// f(lo, len, scratch) for the blocks of [0, n), spread over the threads; scratch is the thread's own.
template <typename A, int Buffers, typename F> void for_each_block(Context& ctx, int64_t n, F&& f) {
  const int64_t blocks = (n + kSwigluBlock - 1) / kSwigluBlock;
#pragma omp parallel num_threads(ctx.threads) if (n > kParallelMin)
  {
    BlockScratch<A, Buffers> scratch;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) f(b * kSwigluBlock, std::min(kSwigluBlock, n - b * kSwigluBlock), scratch);
  }
}

void swiglu_forward(Context& ctx, const Tensor& gate, const Tensor& up, const Tensor& out) {
  const char* op = "swiglu_forward";
  validate_swiglu_forward(tensor_checks, gate, up, out);
  dispatch_float(gate.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* g = gate.as<const T>();
    const T* u = up.as<const T>();
    T* o = out.as<T>();
    for_each_block<A, 3>(ctx, gate.numel(), [&](int64_t lo, int64_t len, BlockScratch<A, 3>& buf) {
      if constexpr (std::is_same_v<T, A>) {
        rows::swiglu_forward(g + lo, u + lo, o + lo, len);
      } else {
        for (int64_t i = 0; i < len; ++i) buf[0][i] = load(g[lo + i]), buf[1][i] = load(u[lo + i]);
        rows::swiglu_forward(buf[0], buf[1], buf[2], len);
        for (int64_t i = 0; i < len; ++i) store(o[lo + i], buf[2][i]);
      }
    });
  });
}

void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                     const Tensor& dup) {
  const char* op = "swiglu_backward";
  require_float(gate, op, "gate");
  for (const Tensor* t : {&dout, &up, &dgate, &dup}) {
    require(t->dtype == gate.dtype, op, "all tensors must share the dtype of gate ({})", dtype_name(gate.dtype));
    require_numel(*t, gate.numel(), op, "tensor");
  }
  dispatch_float(gate.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* go = dout.as<const T>();
    const T* g = gate.as<const T>();
    const T* u = up.as<const T>();
    T* dg = dgate.as<T>();
    T* du = dup.as<T>();
    for_each_block<A, 5>(ctx, gate.numel(), [&](int64_t lo, int64_t len, BlockScratch<A, 5>& buf) {
      if constexpr (std::is_same_v<T, A>) {
        rows::swiglu_backward(go + lo, g + lo, u + lo, dg + lo, du + lo, len);
      } else {
        for (int64_t i = 0; i < len; ++i) buf[0][i] = load(go[lo + i]), buf[1][i] = load(g[lo + i]), buf[2][i] = load(u[lo + i]);
        rows::swiglu_backward(buf[0], buf[1], buf[2], buf[3], buf[4], len);
        for (int64_t i = 0; i < len; ++i) store(dg[lo + i], buf[3][i]), store(du[lo + i], buf[4][i]);
      }
    });
  });
}

}  // namespace shardtrain::ops::cpu
