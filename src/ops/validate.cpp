// The argument checks both op backends share (validate.hpp). The order of the checks is part of the
// behaviour: with several faults, the first one checked is the one reported.
#include "validate.hpp"

#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::ops {
namespace {

bool overlaps(const Tensor& x, const Tensor& y) {
  const auto* x0 = static_cast<const char*>(x.data);
  const auto* y0 = static_cast<const char*>(y.data);
  return x0 < y0 + y.bytes() && y0 < x0 + x.bytes();
}

}  // namespace

void require_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  require(t.numel() == n, op, "{} {} has {} elements, expected {}", name, t.shape.str(), t.numel(), n);
}

void require_i32(const TensorChecks& checks, const Tensor& t, const char* op, const char* name) {
  checks.require_resident(t, op, name);
  require(t.dtype == DType::I32, op, "{} has dtype {}, expected i32", name, dtype_name(t.dtype));
}

void require_same_family(const Tensor& main, const Tensor& other, const char* op, const char* name) {
  if (!other.defined()) return;
  require((main.dtype == DType::F64) == (other.dtype == DType::F64), op, "{} is {} but the activations are {}", name,
          dtype_name(other.dtype), dtype_name(main.dtype));
}

void require_stats(const TensorChecks& checks, const Tensor& stats, const Tensor& activations, int64_t n, const char* op,
                   const char* name) {
  checks.require_resident(stats, op, name);
  const DType want = activations.dtype == DType::F64 ? DType::F64 : DType::F32;
  require(stats.dtype == want, op, "{} is {}, expected {}", name, dtype_name(stats.dtype), dtype_name(want));
  require_numel(stats, n, op, name);
}

MatmulDims validate_matmul(const TensorChecks& checks, Transpose ta, Transpose tb, const Tensor& a, const Tensor& b,
                           const Tensor& c) {
  const char* op = "matmul";
  checks.require_float(a, op, "a");
  checks.require_float(b, op, "b");
  checks.require_float(c, op, "c");
  require_same_family(c, a, op, "a");
  require_same_family(c, b, op, "b");
  // Stored matrices are (rows x cols); op() swaps them when transposed.
  const int64_t a_rows = a.shape.rows(), a_cols = a.shape.cols();
  const int64_t b_rows = b.shape.rows(), b_cols = b.shape.cols();
  const int64_t m = ta == Transpose::No ? a_rows : a_cols, k = ta == Transpose::No ? a_cols : a_rows;
  const int64_t kb = tb == Transpose::No ? b_rows : b_cols, n = tb == Transpose::No ? b_cols : b_rows;
  require(k == kb, op, "inner dims differ: op(a) is {}x{}, op(b) is {}x{}", m, k, kb, n);
  require(c.numel() == m * n && c.shape.cols() == n, op, "c is {}, expected ({}, {})", c.shape.str(), m, n);
  return MatmulDims{m, n, k};
}

MatmulDims validate_matmul_add(const TensorChecks& checks, Transpose ta, Transpose tb, const Tensor& a, const Tensor& b,
                               const Tensor& c, const Tensor& out) {
  const char* op = "matmul_add";
  const MatmulDims dims = validate_matmul(checks, ta, tb, a, b, out);
  checks.require_float(c, op, "c");
  require(c.dtype == out.dtype && c.shape == out.shape, op, "c is {} {}, expected out's {} {}", dtype_name(c.dtype),
          c.shape.str(), dtype_name(out.dtype), out.shape.str());
  require(c.data == out.data || !overlaps(c, out), op, "c overlaps out without being it");
  require(!overlaps(a, out) && !overlaps(b, out), op, "out overlaps an operand");
  return dims;
}

void validate_copy(const TensorChecks& checks, const Tensor& src, const Tensor& dst) {
  checks.require_float(src, "copy", "src");
  checks.require_float(dst, "copy", "dst");
  require_numel(dst, src.numel(), "copy", "dst");
}

void validate_add(const TensorChecks& checks, const Tensor& x, const Tensor& y) {
  checks.require_float(x, "add", "x");
  checks.require_float(y, "add", "y");
  require_numel(y, x.numel(), "add", "y");
  require_same_family(y, x, "add", "x");
}

EmbeddingDims validate_embedding_forward(const TensorChecks& checks, const Tensor& ids, const Tensor& table,
                                         const Tensor& out) {
  const char* op = "embedding_forward";
  require_i32(checks, ids, op, "ids");
  checks.require_float(table, op, "table");
  checks.require_float(out, op, "out");
  require_same_family(out, table, op, "table");
  const int64_t n = ids.numel(), vocab = table.shape.rows(), d = table.shape.cols();
  require(out.numel() == n * d && out.shape.cols() == d, op, "out is {}, expected ({}, {})", out.shape.str(), n, d);
  return EmbeddingDims{n, vocab, d};
}

EmbeddingDims validate_embedding_backward(const TensorChecks& checks, const Tensor& ids, const Tensor& dout,
                                          const Tensor& dtable) {
  const char* op = "embedding_backward";
  require_i32(checks, ids, op, "ids");
  checks.require_float(dout, op, "dout");
  checks.require_float(dtable, op, "dtable");
  require_same_family(dout, dtable, op, "dtable");
  const int64_t n = ids.numel(), vocab = dtable.shape.rows(), d = dtable.shape.cols();
  require(dout.numel() == n * d, op, "dout is {}, expected ({}, {})", dout.shape.str(), n, d);
  return EmbeddingDims{n, vocab, d};
}

RowDims validate_swiglu(const TensorChecks& checks, const char* op, const Tensor& gate_up, GateUpLayout layout,
                        const Tensor& out, const char* out_name, const Tensor& dgate_up) {
  checks.require_float(gate_up, op, "gate_up");
  checks.require_peer(out, op, out_name);
  require(out.dtype == gate_up.dtype, op, "gate_up and {} must share a dtype", out_name);
  const int64_t rows = out.shape.rows(), f = out.shape.cols();
  require_numel(gate_up, 2 * rows * f, op, "gate_up");
  if (layout == GateUpLayout::Rows)
    require(gate_up.shape.cols() == 2 * f, op, "gate_up {} in rows of gate and up: expected ({}, {})", gate_up.shape.str(),
            rows, 2 * f);
  if (dgate_up.defined()) {
    checks.require_peer(dgate_up, op, "dgate_up");
    require(dgate_up.dtype == gate_up.dtype && dgate_up.shape == gate_up.shape, op,
            "dgate_up is {}, expected like gate_up {}", dgate_up.describe(), gate_up.describe());
    require(dgate_up.data == gate_up.data || !overlaps(dgate_up, gate_up), op, "dgate_up overlaps gate_up without being it");
  }
  return RowDims{rows, f};
}

RowDims validate_rmsnorm_forward(const TensorChecks& checks, const Tensor& x, const Tensor& residual, const Tensor& weight,
                                 const Tensor& y) {
  const char* op = "rmsnorm_forward";
  checks.require_float(x, op, "x");
  checks.require_float(weight, op, "weight");
  require_same_family(x, weight, op, "weight");
  checks.require_peer(y, op, "y");
  const int64_t rows = x.shape.rows(), d = x.shape.cols();
  require_numel(weight, d, op, "weight");
  require(y.dtype == x.dtype && y.numel() == x.numel(), op, "y is {}, expected like x {}", y.describe(), x.describe());
  if (residual.defined()) {
    checks.require_peer(residual, op, "residual");
    require(residual.dtype == x.dtype && residual.numel() == x.numel(), op, "residual is {}, expected like x {}",
            residual.describe(), x.describe());
  }
  return RowDims{rows, d};
}

RowDims validate_rmsnorm_backward(const TensorChecks& checks, const Tensor& h, const Tensor& weight, const Tensor& dweight) {
  const char* op = "rmsnorm_backward";
  checks.require_float(h, op, "h");
  checks.require_float(weight, op, "weight");
  checks.require_float(dweight, op, "dweight");
  require_same_family(h, weight, op, "weight");
  require_same_family(h, dweight, op, "dweight");
  const int64_t rows = h.shape.rows(), d = h.shape.cols();
  require_numel(weight, d, op, "weight");
  require_numel(dweight, d, op, "dweight");
  return RowDims{rows, d};
}

void validate_rope(const TensorChecks& checks, const Tensor& x, const Tensor& positions) {
  const char* op = "rope";
  checks.require_float(x, op, "x");
  require_i32(checks, positions, op, "positions");
  require(x.shape.rank == 3, op, "x must be (tokens, heads, head_dim), got {}", x.shape.str());
  require(x.shape[2] % 2 == 0, op, "head_dim {} is odd", x.shape[2]);
  require_numel(positions, x.shape[0], op, "positions");
}

QkvDims validate_rope_qkv(const TensorChecks& checks, const char* op, const Tensor& qkv, const Tensor& positions,
                          const Tensor& q, const Tensor& k, const Tensor& v, const char* const names[4]) {
  checks.require_float(qkv, op, names[0]);
  require_i32(checks, positions, op, "positions");
  const Tensor* parts[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    checks.require_peer(*parts[i], op, names[i + 1]);
    require(parts[i]->dtype == qkv.dtype, op, "{} is {}, expected {}'s dtype {}", names[i + 1], dtype_name(parts[i]->dtype),
            names[0], dtype_name(qkv.dtype));
    require(parts[i]->shape.rank == 3, op, "{} must be (tokens, heads, head_dim), got {}", names[i + 1],
            parts[i]->shape.str());
    require(!overlaps(*parts[i], qkv), op, "{} overlaps {}", names[i + 1], names[0]);
  }
  require(!overlaps(q, k) && !overlaps(q, v) && !overlaps(k, v), op, "{}, {} and {} overlap", names[1], names[2], names[3]);
  const int64_t n = q.shape[0], heads = q.shape[1], dh = q.shape[2], kv_heads = k.shape[1];
  require(dh % 2 == 0, op, "head_dim {} is odd", dh);
  require(k.shape[0] == n && k.shape[2] == dh, op, "{} is {}, expected ({}, kv_heads, {})", names[2], k.shape.str(), n, dh);
  require(v.shape == k.shape, op, "{} is {}, expected like {} {}", names[3], v.shape.str(), names[2], k.shape.str());
  const int64_t width = (heads + 2 * kv_heads) * dh;
  require(qkv.numel() == n * width && qkv.shape.cols() == width, op, "{} is {}, expected ({}, {})", names[0],
          qkv.shape.str(), n, width);
  require_numel(positions, n, op, "positions");
  return QkvDims{n, heads, kv_heads, dh};
}

void validate_attention(const TensorChecks& checks, const char* op, const AttentionShape& sh, const Tensor& q,
                        const Tensor& k, const Tensor& v, const AttentionMask& mask, const Tensor& lse) {
  require(sh.batch > 0 && sh.seq > 0 && sh.heads > 0 && sh.kv_heads > 0 && sh.head_dim > 0, op,
          "empty shape B={} S={} H={} Hkv={} Dh={}", sh.batch, sh.seq, sh.heads, sh.kv_heads, sh.head_dim);
  require(sh.heads % sh.kv_heads == 0, op, "kv_heads {} does not divide heads {}", sh.kv_heads, sh.heads);
  checks.require_float(q, op, "q");
  checks.require_peer(k, op, "k");
  checks.require_peer(v, op, "v");
  require(k.dtype == q.dtype && v.dtype == q.dtype, op, "q, k, v must share a dtype");
  require_numel(q, sh.batch * sh.seq * sh.heads * sh.head_dim, op, "q");
  require_numel(k, sh.batch * sh.seq * sh.kv_heads * sh.head_dim, op, "k");
  require_numel(v, sh.batch * sh.seq * sh.kv_heads * sh.head_dim, op, "v");
  if (mask.segments.defined()) {
    require_i32(checks, mask.segments, op, "segments");
    require_numel(mask.segments, sh.batch * sh.seq, op, "segments");
  }
  require_stats(checks, lse, q, sh.batch * sh.heads * sh.seq, op, "lse");
}

void validate_attention_forward(const TensorChecks& checks, const AttentionShape& shape, const Tensor& q, const Tensor& k,
                                const Tensor& v, const AttentionMask& mask, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  validate_attention(checks, op, shape, q, k, v, mask, lse);
  checks.require_peer(out, op, "out");
  require(out.dtype == q.dtype && out.numel() == q.numel(), op, "out {} is not shaped like q", out.describe());
}

BatchDims validate_attention_segments(const TensorChecks& checks, const Tensor& input_ids, const Tensor& document_ids,
                                      const Tensor& segments, const Tensor& positions) {
  const char* op = "attention_segments";
  require_i32(checks, input_ids, op, "input_ids");
  require_i32(checks, segments, op, "segments");
  require_i32(checks, positions, op, "positions");
  require(input_ids.shape.rank == 2, op, "input_ids must be (batch, seq), got {}", input_ids.shape.str());
  const int64_t b = input_ids.shape[0], s = input_ids.shape[1];
  require_numel(segments, b * s, op, "segments");
  require_numel(positions, b * s, op, "positions");
  if (document_ids.defined()) {
    require_i32(checks, document_ids, op, "document_ids");
    require_numel(document_ids, b * s, op, "document_ids");
  }
  return BatchDims{b, s};
}

RowDims validate_cross_entropy(const TensorChecks& checks, const Tensor& logits, const Tensor& targets,
                               const Tensor& dlogits) {
  const char* op = "cross_entropy";
  checks.require_float(logits, op, "logits");
  require_i32(checks, targets, op, "targets");
  const int64_t n = logits.shape.rows(), vocab = logits.shape.cols();
  require_numel(targets, n, op, "targets");
  if (dlogits.defined()) {
    checks.require_peer(dlogits, op, "dlogits");
    require(dlogits.dtype == logits.dtype && dlogits.numel() == logits.numel(), op, "dlogits {} is not like logits",
            dlogits.describe());
  }
  return RowDims{n, vocab};
}

LinearLossDims validate_linear_cross_entropy(const TensorChecks& checks, const Tensor& h, const Tensor& weight,
                                             const Tensor& targets, const Tensor& dh, const Tensor& dweight,
                                             double dweight_beta) {
  const char* op = "linear_cross_entropy";
  checks.require_float(h, op, "h");
  checks.require_float(weight, op, "weight");
  require_i32(checks, targets, op, "targets");
  require_same_family(h, weight, op, "weight");
  const int64_t n = h.shape.rows(), d = h.shape.cols(), vocab = weight.shape.rows();
  require(weight.shape.cols() == d, op, "weight {} does not match hidden size {}", weight.shape.str(), d);
  require_numel(targets, n, op, "targets");
  if (dh.defined()) {
    checks.require_peer(dh, op, "dh");
    require(dh.dtype == h.dtype && dh.numel() == h.numel(), op, "dh {} is not shaped like h", dh.describe());
    checks.require_float(dweight, op, "dweight");
    require_same_family(h, dweight, op, "dweight");
    require_numel(dweight, vocab * d, op, "dweight");
    require(dweight_beta == 0.0 || dweight_beta == 1.0, op, "dweight_beta {}: expected 0 (overwrite) or 1 (accumulate)",
            dweight_beta);
  }
  return LinearLossDims{n, d, vocab};
}

}  // namespace shardtrain::ops
