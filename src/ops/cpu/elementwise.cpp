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

// SwiGLU runs in blocks of up to kSwigluBlock elements of one row over the threads: the fp32 loops of rows.hpp
// (vectorized for the CPU at hand) straight on f32 tensors, through a few blocks of fp32 scratch per thread
// otherwise. Gate and up are read from gate_up in either layout (ops.hpp, GateUpLayout) as rows of `cols`
// elements `stride` apart, up at `up_offset` from gate: Rows (N rows of F, stride 2F, up at F) and Halves (one row
// of N F, up at N F).
constexpr int64_t kSwigluBlock = 4096;
template <typename A, int Buffers>
using BlockScratch = A[Buffers][kSwigluBlock];

struct GateUpRows {
  int64_t rows, cols, stride, up_offset;
  GateUpRows(int64_t n, int64_t f, GateUpLayout layout)
      : rows(layout == GateUpLayout::Rows ? n : 1),
        cols(layout == GateUpLayout::Rows ? f : n * f),
        stride(layout == GateUpLayout::Rows ? 2 * f : n * f),
        up_offset(layout == GateUpLayout::Rows ? f : n * f) {}
};

// f(gate_at, out_at, len, scratch) for the blocks of every row, spread over the threads: gate_at is the block's
// first element in gate_up (up's is gate_at + up_offset), out_at in the (rows x cols) output; scratch is the
// thread's own.
template <typename A, int Buffers, typename F>
void for_each_block(Context& ctx, const GateUpRows& g, F&& f) {
  const int64_t per_row = (g.cols + kSwigluBlock - 1) / kSwigluBlock, blocks = g.rows * per_row;
#pragma omp parallel num_threads(ctx.threads) if (g.rows * g.cols > kParallelMin)
  {
    BlockScratch<A, Buffers> scratch;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r = b / per_row, lo = b % per_row * kSwigluBlock;
      f(r * g.stride + lo, r * g.cols + lo, std::min(kSwigluBlock, g.cols - lo), scratch);
    }
  }
}

void swiglu_forward(Context& ctx, const Tensor& gate_up, GateUpLayout layout, const Tensor& out) {
  const char* op = "swiglu_forward";
  const auto [n, f] = validate_swiglu(tensor_checks, op, gate_up, layout, out, "out", Tensor{});
  const GateUpRows rows(n, f, layout);
  dispatch_float(gate_up.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* g = gate_up.as<const T>();
    const T* u = g + rows.up_offset;
    T* o = out.as<T>();
    for_each_block<A, 3>(ctx, rows, [&](int64_t gi, int64_t oi, int64_t len, BlockScratch<A, 3>& buf) {
      if constexpr (std::is_same_v<T, A>) {
        rows::swiglu_forward(g + gi, u + gi, o + oi, len);
      } else {
        for (int64_t i = 0; i < len; ++i) buf[0][i] = load(g[gi + i]), buf[1][i] = load(u[gi + i]);
        rows::swiglu_forward(buf[0], buf[1], buf[2], len);
        for (int64_t i = 0; i < len; ++i) store(o[oi + i], buf[2][i]);
      }
    });
  });
}

void swiglu_backward(Context& ctx, const Tensor& dout, const Tensor& gate_up, GateUpLayout layout, const Tensor& dgate_up) {
  const char* op = "swiglu_backward";
  const auto [n, f] = validate_swiglu(tensor_checks, op, gate_up, layout, dout, "dout", dgate_up);
  const GateUpRows rows(n, f, layout);
  dispatch_float(gate_up.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* go = dout.as<const T>();
    const T* g = gate_up.as<const T>();
    const T* u = g + rows.up_offset;
    T* dg = dgate_up.as<T>();
    T* du = dg + rows.up_offset;
    for_each_block<A, 5>(ctx, rows, [&](int64_t gi, int64_t oi, int64_t len, BlockScratch<A, 5>& buf) {
      if constexpr (std::is_same_v<T, A>) {
        rows::swiglu_backward(go + oi, g + gi, u + gi, dg + gi, du + gi, len);
      } else {
        for (int64_t i = 0; i < len; ++i)
          buf[0][i] = load(go[oi + i]), buf[1][i] = load(g[gi + i]), buf[2][i] = load(u[gi + i]);
        rows::swiglu_backward(buf[0], buf[1], buf[2], buf[3], buf[4], len);
        for (int64_t i = 0; i < len; ++i) store(dg[gi + i], buf[3][i]), store(du[gi + i], buf[4][i]);
      }
    });
  });
}

}  // namespace shardtrain::ops::cpu
