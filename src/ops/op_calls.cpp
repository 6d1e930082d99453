// DescribingOps: each op call as an OpCall (op_calls.hpp), its key exactly as `bench ops` has always recorded it
// (profiles written before this file existed are keyed the same way).
#include "shardtrain/ops/op_calls.hpp"

#include <fmt/format.h>

#include <charconv>
#include <utility>
#include <vector>

namespace shardtrain::ops {
namespace {

// "bf16[4096]": the dtype and element count that set a tensor's cost; "-" when undefined.
std::string t(const Tensor& x) {
  return x.defined() ? fmt::format("{}[{}]", dtype_name(x.dtype), x.numel()) : std::string("-");
}

double bytes_of(const Tensor& x) { return x.defined() ? static_cast<double>(x.bytes()) : 0.0; }

// "4096x768": a tensor's dims, for labels.
std::string dims(const Tensor& x) {
  std::string s;
  for (int i = 0; i < x.shape.rank; ++i) {
    if (i) s += 'x';
    s += std::to_string(x.shape[i]);
  }
  return s.empty() ? std::string("1") : s;
}

std::string attention_shape(const AttentionShape& s) {
  return fmt::format("B {} S {} H {} Hkv {} Dh {}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
}

// 2 * B * H * S^2 * Dh: q k^T and p v over the causal half of the S x S scores.
double attention_forward_flops(const AttentionShape& s) {
  return 2.0 * static_cast<double>(s.batch * s.heads) * static_cast<double>(s.seq) * static_cast<double>(s.seq) *
         static_cast<double>(s.head_dim);
}

const char* layout_name(GateUpLayout l) { return l == GateUpLayout::Rows ? "rows" : "halves"; }

struct Gemm {
  int64_t m = 0, n = 0, k = 0;
  std::string key;  // "NT m 4096 n 768 k 768 bf16 bf16 f32"
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string shape() const { return fmt::format("{}x{}x{}", m, n, k); }
};

Gemm gemm(Transpose ta, Transpose tb, const Tensor& a, const Tensor& b, const Tensor& c) {
  Gemm g;
  g.m = ta == Transpose::No ? a.shape.rows() : a.shape.cols();
  g.k = ta == Transpose::No ? a.shape.cols() : a.shape.rows();
  g.n = tb == Transpose::No ? b.shape.cols() : b.shape.rows();
  g.key = fmt::format("{}{} m {} n {} k {} {} {} {}", ta == Transpose::Yes ? "T" : "N", tb == Transpose::Yes ? "T" : "N",
                      g.m, g.n, g.k, dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(c.dtype));
  return g;
}

}  // namespace

std::optional<GemmKey> parse_gemm_key(std::string_view key) {
  // "matmul NT m 4096 n 768 k 768 bf16 bf16 f32 +=" or "matmul_add NT m 4096 n 768 k 3072 bf16 bf16 bf16 c bf16[N]"
  std::vector<std::string_view> w;
  for (size_t i = 0; i < key.size();) {
    const size_t end = std::min(key.find(' ', i), key.size());
    if (end > i) w.push_back(key.substr(i, end - i));
    i = end + 1;
  }
  if (w.size() < 11 || (w[0] != "matmul" && w[0] != "matmul_add") || w[2] != "m" || w[4] != "n" || w[6] != "k")
    return std::nullopt;
  GemmKey g;
  for (auto [text, dim] : {std::pair{w[3], &g.m}, std::pair{w[5], &g.n}, std::pair{w[7], &g.k}}) {
    const auto r = std::from_chars(text.data(), text.data() + text.size(), *dim);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size() || *dim <= 0) return std::nullopt;
  }
  // matmul_add's residual and an accumulating matmul's C ("+=") are read by the epilogue: the same GEMM as a plain
  // matmul's, with one more tensor's bytes (which the analytic estimate counts).
  g.form = fmt::format("{} {} {} {}", w[1], w[8], w[9], w[10]);
  return g;
}

void DescribingOps::matmul(Transpose ta, Transpose tb, double, const Tensor& a, const Tensor& b, double beta,
                           const Tensor& c) {
  const Gemm g = gemm(ta, tb, a, b, c);
  on_call({"matmul", "matmul " + g.key + (beta != 0.0 ? " +=" : ""), g.shape(), g.flops(),
           bytes_of(a) + bytes_of(b) + bytes_of(c) * (beta != 0.0 ? 2 : 1)});
}

void DescribingOps::matmul_add(Transpose ta, Transpose tb, double, const Tensor& a, const Tensor& b, const Tensor& c,
                               const Tensor& out) {
  const Gemm g = gemm(ta, tb, a, b, out);
  on_call({"matmul_add", "matmul_add " + g.key + " c " + t(c), g.shape(), g.flops(),
           bytes_of(a) + bytes_of(b) + bytes_of(c) + bytes_of(out)});
}

void DescribingOps::fill(const Tensor& out, double) { on_call({"fill", "fill " + t(out), dims(out), 0, bytes_of(out)}); }

void DescribingOps::copy(const Tensor& src, const Tensor& dst) {
  on_call({"copy", "copy " + t(src) + " " + t(dst), dims(dst), 0, bytes_of(src) + bytes_of(dst)});
}

void DescribingOps::add(const Tensor& x, const Tensor& y) {
  on_call({"add", "add " + t(x) + " " + t(y), dims(y), 0, bytes_of(x) + 2 * bytes_of(y)});
}

// The N rows of the table an embedding gathers (forward) or scatters into (backward, accumulated).
void DescribingOps::embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const double rows = static_cast<double>(ids.numel() * table.shape.cols()) * static_cast<double>(dtype_size(table.dtype));
  on_call({"embedding_forward", "embedding_forward " + t(ids) + " " + t(table) + " " + t(out), dims(out), 0,
           bytes_of(ids) + rows + bytes_of(out)});
}

void DescribingOps::embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const double rows = static_cast<double>(ids.numel() * dtable.shape.cols()) * static_cast<double>(dtype_size(dtable.dtype));
  on_call({"embedding_backward", "embedding_backward " + t(ids) + " " + t(dout) + " " + t(dtable), dims(dout), 0,
           bytes_of(ids) + bytes_of(dout) + 2 * rows});
}

void DescribingOps::rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, double,
                                    const Tensor& h_out, const Tensor& y, const Tensor& rstd) {
  on_call({"rmsnorm_forward",
           "rmsnorm_forward " + t(x) + " " + t(residual) + " " + t(weight) + " " + t(h_out) + " " + t(y) + " " + t(rstd),
           dims(x), 0,
           bytes_of(x) + bytes_of(residual) + bytes_of(weight) + bytes_of(h_out) + bytes_of(y) + bytes_of(rstd)});
}

void DescribingOps::rmsnorm_backward(const Tensor& dy, const Tensor& h, const Tensor& weight, const Tensor& rstd,
                                     const Tensor& dh_extra, const Tensor& dh, const Tensor& dweight) {
  on_call({"rmsnorm_backward",
           "rmsnorm_backward " + t(dy) + " " + t(h) + " " + t(weight) + " " + t(rstd) + " " + t(dh_extra) + " " + t(dh) +
               " " + t(dweight),
           dims(dy), 0,
           bytes_of(dy) + bytes_of(h) + bytes_of(weight) + bytes_of(rstd) + bytes_of(dh_extra) + bytes_of(dh) +
               2 * bytes_of(dweight)});
}

void DescribingOps::rope(const Tensor& x, const Tensor& positions, const RopeFrequencies&, RopeDirection) {
  on_call({"rope", "rope " + t(x) + " " + t(positions), dims(x), 0, 2 * bytes_of(x) + bytes_of(positions)});
}

void DescribingOps::rope_qkv_forward(const Tensor& qkv, const Tensor& positions, const RopeFrequencies&, const Tensor& q,
                                     const Tensor& k, const Tensor& v) {
  on_call({"rope_qkv_forward", "rope_qkv_forward " + t(qkv) + " " + t(positions) + " " + t(q) + " " + t(k) + " " + t(v),
           dims(qkv), 0, bytes_of(qkv) + bytes_of(positions) + bytes_of(q) + bytes_of(k) + bytes_of(v)});
}

void DescribingOps::rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& positions,
                                      const RopeFrequencies&, const Tensor& dqkv) {
  on_call({"rope_qkv_backward",
           "rope_qkv_backward " + t(dq) + " " + t(dk) + " " + t(dv) + " " + t(positions) + " " + t(dqkv), dims(dqkv), 0,
           bytes_of(dq) + bytes_of(dk) + bytes_of(dv) + bytes_of(positions) + bytes_of(dqkv)});
}

void DescribingOps::attention_forward(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                      const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  on_call({"attention_forward",
           "attention_forward " + attention_shape(s) + " " + t(q) + " " + t(k) + " " + t(v) + " " + t(out) + " " + t(lse),
           fmt::format("B {} S {} H {}/{} Dh {}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim),
           attention_forward_flops(s),
           bytes_of(q) + bytes_of(k) + bytes_of(v) + bytes_of(mask.segments) + bytes_of(out) + bytes_of(lse), s});
}

void DescribingOps::attention_backward(const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout, const AttentionMask& mask,
                                       const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  on_call({"attention_backward",
           "attention_backward " + attention_shape(s) + " " + t(q) + " " + t(k) + " " + t(v) + " " + t(out) + " " + t(lse) +
               " " + t(dout) + " " + t(dq) + " " + t(dk) + " " + t(dv),
           fmt::format("B {} S {} H {}/{} Dh {}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim),
           2 * attention_forward_flops(s),
           bytes_of(q) + bytes_of(k) + bytes_of(v) + bytes_of(out) + bytes_of(lse) + bytes_of(dout) +
               bytes_of(mask.segments) + bytes_of(dq) + bytes_of(dk) + bytes_of(dv),
           s});
}

void DescribingOps::attention_segments(const Tensor& input_ids, int32_t, const Tensor& document_ids, const Tensor& segments,
                                       const Tensor& positions) {
  on_call({"attention_segments",
           "attention_segments " + t(input_ids) + " " + t(document_ids) + " " + t(segments) + " " + t(positions),
           dims(input_ids), 0, bytes_of(input_ids) + bytes_of(document_ids) + bytes_of(segments) + bytes_of(positions)});
}

void DescribingOps::swiglu_forward(const Tensor& gate_up, GateUpLayout layout, const Tensor& out) {
  on_call({"swiglu_forward", "swiglu_forward " + t(gate_up) + " " + layout_name(layout) + " " + t(out), dims(out), 0,
           bytes_of(gate_up) + bytes_of(out)});
}

// In place (dgate_up is gate_up), gate and up are read and their gradients written over them: the same bytes.
void DescribingOps::swiglu_backward(const Tensor& dout, const Tensor& gate_up, GateUpLayout layout, const Tensor& dgate_up) {
  on_call({"swiglu_backward",
           "swiglu_backward " + t(dout) + " " + t(gate_up) + " " + layout_name(layout) + " " + t(dgate_up) +
               (dgate_up.data == gate_up.data ? " in place" : ""),
           dims(dout), 0, bytes_of(dout) + bytes_of(gate_up) + bytes_of(dgate_up)});
}

LossSums DescribingOps::cross_entropy(const Tensor& logits, const Tensor& targets, int32_t, double, const Tensor& dlogits) {
  on_call({"cross_entropy", "cross_entropy " + t(logits) + " " + t(targets) + " " + t(dlogits), dims(logits), 0,
           bytes_of(logits) + bytes_of(targets) + bytes_of(dlogits)});
  return {};
}

LossSums DescribingOps::linear_cross_entropy(const Tensor& h, const Tensor& weight, const Tensor& targets, int32_t, double,
                                             int64_t chunk_tokens, const Tensor& dh, const Tensor& dweight, double) {
  const double logits = 2.0 * static_cast<double>(h.shape.rows()) * static_cast<double>(h.shape.cols()) *
                        static_cast<double>(weight.shape.rows());
  on_call({"linear_cross_entropy",
           fmt::format("linear_cross_entropy {} {} {} chunk {} {} {}", t(h), t(weight), t(targets), chunk_tokens, t(dh),
                       t(dweight)),
           fmt::format("{}x{}x{}", h.shape.rows(), h.shape.cols(), weight.shape.rows()), dh.defined() ? 3 * logits : logits,
           bytes_of(h) + bytes_of(weight) + bytes_of(targets) + bytes_of(dh) + 2 * bytes_of(dweight)});
  return {};
}

void DescribingOps::sum_squares(const Tensor& x, const Tensor& out, SumInto mode) {
  on_call({"sum_squares", "sum_squares " + t(x) + " " + t(out), dims(x), 0,
           bytes_of(x) + bytes_of(out) * (mode == SumInto::Accumulate ? 2 : 1)});
}

}  // namespace shardtrain::ops
