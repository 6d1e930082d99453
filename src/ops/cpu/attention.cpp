// Causal grouped-query attention on the CPU, forward and backward, never materializing repeated K/V or
// the (S, S) probability matrix: each query row is scored, normalized and consumed in one pass, and the
// backward recomputes probabilities from the saved log-sum-exp. Forward runs one task per (batch, query
// head); backward one task per (batch, key/value head), so each task owns its dk/dv rows and the sums are
// race-free and in a fixed order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels.hpp"

namespace shardtrain::ops::cpu {
namespace {

struct Layout {
  int64_t b, s, h, hkv, dh, group;
  int64_t q_row() const { return h * dh; }    // stride between tokens in q, out, dq
  int64_t kv_row() const { return hkv * dh; }  // stride between tokens in k, v, dk, dv
};

Layout layout_of(const AttentionShape& sh) {
  return Layout{sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim, sh.heads / sh.kv_heads};
}

template <typename A, typename T> inline A dot(const A* a, const T* b, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * load(b[i]);
  return s;
}

template <typename T>
void forward_impl(Context& ctx, const Layout& L, const T* q, const T* k, const T* v, const int32_t* seg, T* out,
                  acc_t<T>* lse) {
  using A = acc_t<T>;
  const A scale = A(1) / std::sqrt(static_cast<A>(L.dh));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const int64_t tasks = L.b * L.h;
#pragma omp parallel num_threads(ctx.threads) if (tasks * L.s * L.s * L.dh > (1 << 16))
  {
    std::vector<A> scores(static_cast<size_t>(L.s)), qi(static_cast<size_t>(L.dh)), acc(static_cast<size_t>(L.dh));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / L.h, h = task % L.h, g = h / L.group;
      const int32_t* sg = seg ? seg + b * L.s : nullptr;
      for (int64_t i = 0; i < L.s; ++i) {
        T* o = out + (b * L.s + i) * L.q_row() + h * L.dh;
        A* row_lse = lse + (b * L.h + h) * L.s + i;
        if (sg && sg[i] < 0) {  // padding query: attends to nothing
          for (int64_t d = 0; d < L.dh; ++d) store(o[d], A(0));
          *row_lse = neg_inf;
          continue;
        }
        const T* qrow = q + (b * L.s + i) * L.q_row() + h * L.dh;
        for (int64_t d = 0; d < L.dh; ++d) qi[static_cast<size_t>(d)] = load(qrow[d]) * scale;
        A m = neg_inf;
        for (int64_t j = 0; j <= i; ++j) {
          if (sg && sg[j] != sg[i]) {
            scores[static_cast<size_t>(j)] = neg_inf;
            continue;
          }
          const A sc = dot(qi.data(), k + (b * L.s + j) * L.kv_row() + g * L.dh, L.dh);
          scores[static_cast<size_t>(j)] = sc;
          m = std::max(m, sc);
        }
        std::fill(acc.begin(), acc.end(), A(0));
        A l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const A sc = scores[static_cast<size_t>(j)];
          if (sc == neg_inf) continue;
          const A p = std::exp(sc - m);
          l += p;
          const T* vrow = v + (b * L.s + j) * L.kv_row() + g * L.dh;
          A* ap = acc.data();
#pragma omp simd
          for (int64_t d = 0; d < L.dh; ++d) ap[d] += p * load(vrow[d]);
        }
        const A inv_l = A(1) / l;
        for (int64_t d = 0; d < L.dh; ++d) store(o[d], acc[static_cast<size_t>(d)] * inv_l);
        *row_lse = m + std::log(l);
      }
    }
  }
}

template <typename T>
void backward_impl(Context& ctx, const Layout& L, const T* q, const T* k, const T* v, const T* out,
                   const acc_t<T>* lse, const T* dout, const int32_t* seg, T* dq, T* dk, T* dv) {
  using A = acc_t<T>;
  const A scale = A(1) / std::sqrt(static_cast<A>(L.dh));
  const A neg_inf = -std::numeric_limits<A>::infinity();
  const int64_t tasks = L.b * L.hkv;
  const size_t dh = static_cast<size_t>(L.dh);
#pragma omp parallel num_threads(ctx.threads) if (tasks * L.s * L.s * L.dh > (1 << 16))
  {
    std::vector<A> dk_acc(static_cast<size_t>(L.s) * dh), dv_acc(static_cast<size_t>(L.s) * dh);
    std::vector<A> qi(dh), doi(dh), dqi(dh);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / L.hkv, g = task % L.hkv;
      const int32_t* sg = seg ? seg + b * L.s : nullptr;
      std::fill(dk_acc.begin(), dk_acc.end(), A(0));
      std::fill(dv_acc.begin(), dv_acc.end(), A(0));
      for (int64_t h = g * L.group; h < (g + 1) * L.group; ++h) {
        for (int64_t i = 0; i < L.s; ++i) {
          const int64_t qoff = (b * L.s + i) * L.q_row() + h * L.dh;
          T* dqrow = dq + qoff;
          const A row_lse = lse[(b * L.h + h) * L.s + i];
          if ((sg && sg[i] < 0) || row_lse == neg_inf) {
            for (int64_t d = 0; d < L.dh; ++d) store(dqrow[d], A(0));
            continue;
          }
          A di = 0;  // D_i = dout_i . out_i
          for (int64_t d = 0; d < L.dh; ++d) {
            qi[static_cast<size_t>(d)] = load(q[qoff + d]) * scale;
            doi[static_cast<size_t>(d)] = load(dout[qoff + d]);
            di += doi[static_cast<size_t>(d)] * load(out[qoff + d]);
          }
          std::fill(dqi.begin(), dqi.end(), A(0));
          for (int64_t j = 0; j <= i; ++j) {
            if (sg && sg[j] != sg[i]) continue;
            const T* krow = k + (b * L.s + j) * L.kv_row() + g * L.dh;
            const T* vrow = v + (b * L.s + j) * L.kv_row() + g * L.dh;
            const A p = std::exp(dot(qi.data(), krow, L.dh) - row_lse);
            const A dp = dot(doi.data(), vrow, L.dh);
            const A ds = p * (dp - di);
            A* dkj = dk_acc.data() + static_cast<size_t>(j) * dh;
            A* dvj = dv_acc.data() + static_cast<size_t>(j) * dh;
            const A* qp = qi.data();
            const A* dop = doi.data();
            A* dqp = dqi.data();
#pragma omp simd
            for (int64_t d = 0; d < L.dh; ++d) {
              dqp[d] += ds * load(krow[d]);
              dkj[d] += ds * qp[d];  // qp already carries the 1/sqrt(Dh) scale
              dvj[d] += p * dop[d];
            }
          }
          for (int64_t d = 0; d < L.dh; ++d) store(dqrow[d], dqi[static_cast<size_t>(d)] * scale);
        }
      }
      for (int64_t j = 0; j < L.s; ++j) {
        const int64_t off = (b * L.s + j) * L.kv_row() + g * L.dh;
        for (int64_t d = 0; d < L.dh; ++d) {
          store(dk[off + d], dk_acc[static_cast<size_t>(j) * dh + static_cast<size_t>(d)]);
          store(dv[off + d], dv_acc[static_cast<size_t>(j) * dh + static_cast<size_t>(d)]);
        }
      }
    }
  }
}

const int32_t* segments_of(const AttentionMask& mask) {
  return mask.segments.defined() ? mask.segments.as<const int32_t>() : nullptr;
}

}  // namespace

void attention_forward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                       const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  validate_attention_forward(tensor_checks, shape, q, k, v, mask, out, lse);
  dispatch_float(q.dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_impl<T>(ctx, layout_of(shape), q.as<const T>(), k.as<const T>(), v.as<const T>(), segments_of(mask),
                    out.as<T>(), lse.as<acc_t<T>>());
  });
}

void attention_backward(Context& ctx, const AttentionShape& shape, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  validate_attention(tensor_checks, op, shape, q, k, v, mask, lse);
  for (const Tensor* t : {&out, &dout, &dq})
    require(t->dtype == q.dtype && t->numel() == q.numel(), op, "{} is not shaped like q", t->describe());
  for (const Tensor* t : {&dk, &dv})
    require(t->dtype == q.dtype && t->numel() == k.numel(), op, "{} is not shaped like k", t->describe());
  dispatch_float(q.dtype, op, [&](auto tag) {
    using T = decltype(tag);
    backward_impl<T>(ctx, layout_of(shape), q.as<const T>(), k.as<const T>(), v.as<const T>(), out.as<const T>(),
                     lse.as<const acc_t<T>>(), dout.as<const T>(), segments_of(mask), dq.as<T>(), dk.as<T>(),
                     dv.as<T>());
  });
}

void attention_segments(Context& ctx, const Tensor& input_ids, int32_t pad_token_id, const Tensor& document_ids,
                        const Tensor& segments, const Tensor& positions) {
  const BatchDims dims = validate_attention_segments(tensor_checks, input_ids, document_ids, segments, positions);
  const int64_t b = dims.batch, s = dims.seq;
  const int32_t* ids = input_ids.as<const int32_t>();
  const int32_t* docs = document_ids.defined() ? document_ids.as<const int32_t>() : nullptr;
  int32_t* seg = segments.as<int32_t>();
  int32_t* pos = positions.as<int32_t>();
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t t = 0; t < s; ++t) {
      const int64_t i = r * s + t;
      int32_t doc = 0;
      if (docs) {
        doc = docs[i];
        if (doc < 0) throw DataError(fmt::format("document id {} at (row {}, position {}) is negative", doc, r, t));
      }
      pos[i] = docs && t > 0 && docs[i - 1] == doc ? pos[i - 1] + 1 : static_cast<int32_t>(docs ? 0 : t);
      seg[i] = pad_token_id >= 0 && ids[i] == pad_token_id ? -1 : doc;
    }
  }
}

}  // namespace shardtrain::ops::cpu
