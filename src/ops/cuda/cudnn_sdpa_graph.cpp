// The forward and backward SDPA graphs as plain data (cudnn_sdpa_graph.hpp). Dims are cuDNN's (b, h, s, d) with
// explicit strides over our row-major tensors: q (B, S, H, Dh) is dims (B, H, S, Dh), strides (S*H*Dh, Dh, H*Dh, 1).
// The op sequences, virtual tensor types and version workarounds follow cudnn-frontend's composite nodes, since
// the engines match these exact patterns; comments name the frontend step each block mirrors.
#include "cudnn_sdpa_graph.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

int64_t round_up_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// cudnnGetVersion()'s encoding: major * 10000 + minor * 100 + patch from 9.0, major * 1000 + minor * 100 + patch before.
std::string version_text(int64_t v) {
  if (v < 10000) return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

class Builder {
 public:
  explicit Builder(SdpaGraph& g) : g_(g) {}

  int64_t tensor(int64_t uid, std::string name, cudnnDataType_t dtype, Dims dims, Dims strides, int64_t ragged_offset = 0,
                 int64_t scratch_bytes = 0) {
    GraphTensor t;
    t.uid = uid;
    t.name = std::move(name);
    t.dtype = dtype;
    t.dims = dims;
    t.strides = strides;
    t.ragged_offset_uid = ragged_offset;
    t.scratch_bytes = scratch_bytes;
    g_.tensors.push_back(std::move(t));
    return uid;
  }
  int64_t virt(std::string name, cudnnDataType_t dtype, Dims dims, Dims strides, int64_t ragged_offset = 0) {
    const int64_t uid = next_virtual_++;
    tensor(uid, std::move(name), dtype, dims, strides, ragged_offset);
    g_.tensors.back().is_virtual = true;
    return uid;
  }
  int64_t scalar(int64_t uid, std::string name) {
    tensor(uid, std::move(name), CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1});
    g_.tensors.back().by_value = true;
    return uid;
  }
  // A virtual output shaped like `like` (dims and strides), of the given type.
  int64_t like(int64_t like_uid, std::string name, cudnnDataType_t dtype) {
    const GraphTensor& l = g_.tensor(like_uid);
    return virt(std::move(name), dtype, l.dims, l.strides);
  }

  void pointwise(std::string name, cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t t, int64_t y,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    GraphOp op;
    op.kind = GraphOpKind::Pointwise;
    op.name = std::move(name);
    op.pointwise = mode;
    op.compute = compute;
    op.axis = axis;
    op.x = x;
    op.b = b;
    op.t = t;
    op.y = y;
    g_.ops.push_back(std::move(op));
  }
  void reduction(std::string name, cudnnReduceTensorOp_t mode, int64_t x, int64_t y) {
    GraphOp op;
    op.kind = GraphOpKind::Reduction;
    op.name = std::move(name);
    op.reduction = mode;
    op.x = x;
    op.y = y;
    g_.ops.push_back(std::move(op));
  }
  void reshape(std::string name, int64_t x, int64_t y) {
    GraphOp op;
    op.kind = GraphOpKind::Reshape;
    op.name = std::move(name);
    op.x = x;
    op.y = y;
    g_.ops.push_back(std::move(op));
  }
  void matmul(std::string name, int64_t a, int64_t b, int64_t c, int64_t m = 0, int64_t n = 0, int64_t k = 0,
              bool padded = false) {
    GraphOp op;
    op.kind = GraphOpKind::Matmul;
    op.name = std::move(name);
    op.x = a;
    op.b = b;
    op.y = c;
    op.m_override = m;
    op.n_override = n;
    op.k_override = k;
    op.padded_matmul = padded;
    g_.ops.push_back(std::move(op));
  }

 private:
  SdpaGraph& g_;
  int64_t next_virtual_ = sdpa_uid::kFirstVirtual;
};

// The masks on a (B', H, S, S) score tensor, as the frontend's padding_mask score modifier (twice on the backward
// of cuDNN 9.0-9.9, which needs the padding value put again after the stats are subtracted) and its top-left
// causal diagonal band (right bound 0): y = mask ? x : fill.
int64_t apply_masks(Builder& bld, const SdpaGraph& g, int64_t s, bool backward) {
  using namespace sdpa_uid;
  if (g.padding_mask) {
    const int passes = backward && g.target.cudnn_version < 91000 ? 2 : 1;
    for (int p = 0; p < passes; ++p) {
      const std::string sfx = p == 0 ? "_padding" : "_2nd_padding";
      const int64_t row = bld.like(s, "row_idx" + sfx, CUDNN_DATA_INT32);
      bld.pointwise("gen_row_idx" + sfx, CUDNN_POINTWISE_GEN_INDEX, s, 0, 0, row, CUDNN_DATA_INT32, 2);
      const int64_t col = bld.like(s, "col_idx" + sfx, CUDNN_DATA_INT32);
      bld.pointwise("gen_col_idx" + sfx, CUDNN_POINTWISE_GEN_INDEX, s, 0, 0, col, CUDNN_DATA_INT32, 3);
      const int64_t row_ok = bld.like(s, "row_mask" + sfx, CUDNN_DATA_BOOLEAN);
      bld.pointwise("lt_row_sq" + sfx, CUDNN_POINTWISE_CMP_LT, row, SeqLenQ, 0, row_ok, CUDNN_DATA_BOOLEAN);
      const int64_t col_ok = bld.like(s, "col_mask" + sfx, CUDNN_DATA_BOOLEAN);
      bld.pointwise("lt_col_skv" + sfx, CUDNN_POINTWISE_CMP_LT, col, SeqLenKV, 0, col_ok, CUDNN_DATA_BOOLEAN);
      const int64_t keep = bld.like(s, "padding_mask" + sfx, CUDNN_DATA_BOOLEAN);
      bld.pointwise("and_row_col" + sfx, CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, 0, keep, CUDNN_DATA_BOOLEAN);
      const int64_t out = bld.like(s, "s_padded" + sfx, CUDNN_DATA_FLOAT);
      bld.pointwise("select" + sfx, CUDNN_POINTWISE_BINARY_SELECT, s, MaskFill, keep, out);
      s = out;
    }
  }
  const int64_t row = bld.like(s, "row_idx_causal", CUDNN_DATA_INT32);
  bld.pointwise("gen_row_idx_causal", CUDNN_POINTWISE_GEN_INDEX, s, 0, 0, row, CUDNN_DATA_INT32, 2);
  const int64_t col = bld.like(s, "col_idx_causal", CUDNN_DATA_INT32);
  bld.pointwise("gen_col_idx_causal", CUDNN_POINTWISE_GEN_INDEX, s, 0, 0, col, CUDNN_DATA_INT32, 3);
  const int64_t keep = bld.like(s, "causal_mask", CUDNN_DATA_BOOLEAN);
  bld.pointwise("row_ge_col", CUDNN_POINTWISE_CMP_GE, row, col, 0, keep, CUDNN_DATA_BOOLEAN);
  const int64_t out = bld.like(s, "s_causal", CUDNN_DATA_FLOAT);
  bld.pointwise("select_causal", CUDNN_POINTWISE_BINARY_SELECT, s, MaskFill, keep, out);
  return out;
}

}  // namespace

int64_t sdpa_graph_batch(const SdpaCall& call) {
  if (call.masking == SdpaMasking::Causal) return call.batch;
  return round_up_pow2(call.max_sequences > 0 ? call.max_sequences : 1);
}

SdpaCall sdpa_plan_key(const SdpaCall& call) {
  SdpaCall k = call;
  k.max_sequences = call.masking == SdpaMasking::Documents ? sdpa_graph_batch(call) : 0;
  if (call.direction == SdpaDirection::Forward) k.deterministic = false;
  return k;
}

std::string describe_call(const SdpaCall& c) {
  std::string s = fmt::format("{} B={} S={} H={}/{} Dh={}", c.direction == SdpaDirection::Forward ? "forward" : "backward",
                              c.batch, c.seq, c.heads, c.kv_heads, c.head_dim);
  if (c.masking == SdpaMasking::Documents) s += fmt::format(" documents<={}", c.max_sequences);
  else s += " causal";
  if (c.direction == SdpaDirection::Backward && c.deterministic) s += " deterministic";
  return s;
}

std::string sdpa_static_reason(const SdpaCall& c, const std::string& dtype_name, const SdpaTarget& t) {
  const int64_t v = t.cudnn_version;
  const bool backward = c.direction == SdpaDirection::Backward;
  if (dtype_name != "bf16")
    return fmt::format("{} (cuDNN's flash attention takes bf16/fp16; shardtrain uses bf16)", dtype_name);
  if (c.batch <= 0 || c.seq <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0)
    return fmt::format("empty shape ({})", describe_call(c));
  if (c.heads % c.kv_heads != 0) return fmt::format("H = {} is not a multiple of Hkv = {}", c.heads, c.kv_heads);
  if (v < 90000) return fmt::format("cuDNN {} older than 9.0.0 needed for its fused attention graphs", version_text(v));
  if (v == 91000 || v == 91001)
    return fmt::format("cuDNN {} has known SDPA bugs (9.10.2 and later are fine)", version_text(v));
  if (t.sm < 80)
    return fmt::format("compute capability {}.{}: cuDNN's flash attention needs 8.0 or newer", t.sm / 10, t.sm % 10);
  // Hopper runs head dims up to 256 both ways; the others' backward stops at 128 (Blackwell's 192 and 256 only with
  // engine pins shardtrain does not make).
  const int64_t max_dh = t.sm / 10 == 9 ? 256 : 128;
  if (c.head_dim % 8 != 0 || c.head_dim > max_dh)
    return fmt::format("head dim {} (multiple of 8 up to {} needed)", c.head_dim, max_dh);
  if (backward && c.seq == 1) return "S = 1 (cuDNN's backward refuses s_q = s_kv = 1)";
  if (c.masking == SdpaMasking::Documents) {
    if (c.max_sequences <= 0) return "packed documents without a bound on their runs (max_sequences = 0)";
    if (v < 90600)
      return fmt::format(
          "cuDNN {} older than 9.6.0 needed for packed documents (token-major statistics, "
          "grouped-query ragged tensors)",
          version_text(v));
    if (t.sm < 90 && v < 91801)
      return fmt::format(
          "compute capability {}.{}: cuDNN {} runs packed documents on 9.0 and newer only (8.x from "
          "9.18.1)",
          t.sm / 10, t.sm % 10, version_text(v));
    if (backward && c.deterministic && (t.sm / 10 == 8 || t.sm / 10 == 12))
      return fmt::format("compute capability {}.{}: cuDNN has no deterministic backward for packed documents", t.sm / 10,
                         t.sm % 10);
  }
  if (backward && c.deterministic && t.sm / 10 == 10 && v < 91800)
    return fmt::format("cuDNN {} older than 9.18.0 needed for a deterministic backward on compute capability {}.{}",
                       version_text(v), t.sm / 10, t.sm % 10);
  return "";
}

const GraphTensor& SdpaGraph::tensor(int64_t uid) const {
  for (const GraphTensor& t : tensors)
    if (t.uid == uid) return t;
  throw InternalError(fmt::format("cuDNN SDPA graph: no tensor with uid {}", uid));
}

bool SdpaGraph::has(int64_t uid) const {
  for (const GraphTensor& t : tensors)
    if (t.uid == uid) return true;
  return false;
}

std::vector<int64_t> SdpaGraph::bound_uids() const {
  std::vector<int64_t> uids;
  for (const GraphTensor& t : tensors)
    if (!t.is_virtual) uids.push_back(t.uid);
  return uids;
}

SdpaGraph describe_sdpa(const SdpaCall& call_in, const SdpaTarget& target) {
  using namespace sdpa_uid;
  if (std::string why = sdpa_static_reason(call_in, "bf16", target); !why.empty())
    throw InternalError("describe_sdpa: " + describe_call(call_in) + ": " + why);
  SdpaGraph g;
  g.call = sdpa_plan_key(call_in);
  g.target = target;
  const SdpaCall& c = g.call;
  const bool backward = c.direction == SdpaDirection::Backward;
  const int64_t v = target.cudnn_version;
  const int64_t B = g.graph_batch = sdpa_graph_batch(c);
  const int64_t S = c.seq, H = c.heads, Hk = c.kv_heads, D = c.head_dim;
  const int64_t tokens = c.batch * S;  // of the caller's tensors, which packed sequences index
  const bool gqa = H != Hk;
  g.ragged = c.masking == SdpaMasking::Documents;
  // The frontend's backward workaround for cuDNN <= 9.15: a padding mask with full lengths when S_kv % 128 != 0.
  g.padding_mask = g.ragged || (backward && v <= 91500 && S % 128 != 0);
  // Token-sized backward scratch (the frontend's max_total_seq_len sizing): not on 8.x / 12.x (a known issue from
  // 9.18.1; ragged needs 9.18.1 there), not for head dims that are not multiples of 16 (another).
  g.ragged_intermediates = g.ragged && backward && target.sm / 10 != 8 && target.sm / 10 != 12 && D % 16 == 0;
  g.dq_accumulated = backward && !c.deterministic;
  g.scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Older cuDNN prefers the lowest float for masked scores, 9.10 and later -inf (the frontend's get_negative_inf_value).
  g.mask_fill = v < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();

  Builder bld(g);
  const int64_t qo_offsets = g.ragged ? OffsetsQO : 0, kv_offsets = g.ragged ? OffsetsKV : 0;
  const int64_t stats_offsets = g.ragged ? OffsetsStats : 0;
  const Dims q_dims{B, H, S, D}, q_strides{S * H * D, D, H * D, 1};
  const Dims kv_dims{B, Hk, S, D}, kv_strides{S * Hk * D, D, Hk * D, 1};
  // K (and the backward's V) as the transposed operand (B', Hkv, Dh, S): the frontend's K -> KT mapping.
  const Dims kvt_dims{B, Hk, D, S}, kvt_strides{S * Hk * D, D, 1, Hk * D};
  const Dims score_dims{B, H, S, S}, score_strides{H * S * S, S * S, S, 1}, score_t_strides{H * S * S, S * S, 1, S};
  const Dims row_dims{B, H, S, 1}, row_strides{H * S, S, 1, 1};
  // Stats: our lse layout (B, H, S) as it is for Causal; token-major (B * S, H) scratch for the packed layout.
  const Dims stats_strides = g.ragged ? Dims{H * S, 1, H, 1} : row_strides;
  const int64_t stats_scratch = g.ragged ? tokens * H * 4 : 0;

  bld.tensor(Q, "Q", CUDNN_DATA_BFLOAT16, q_dims, q_strides, qo_offsets);
  if (backward) {
    bld.tensor(K, "KT", CUDNN_DATA_BFLOAT16, kvt_dims, kvt_strides, kv_offsets);
    bld.tensor(V, "VT", CUDNN_DATA_BFLOAT16, kvt_dims, kvt_strides, kv_offsets);
    bld.tensor(O, "O", CUDNN_DATA_BFLOAT16, q_dims, q_strides, qo_offsets);
    bld.tensor(dO, "dO", CUDNN_DATA_BFLOAT16, q_dims, q_strides, qo_offsets);
    bld.tensor(Stats, "Stats", CUDNN_DATA_FLOAT, row_dims, stats_strides, stats_offsets, stats_scratch);
    bld.tensor(dQ, "dQ", CUDNN_DATA_BFLOAT16, q_dims, q_strides, qo_offsets);
    bld.tensor(dK, "dK", CUDNN_DATA_BFLOAT16, kv_dims, kv_strides, kv_offsets);
    bld.tensor(dV, "dV", CUDNN_DATA_BFLOAT16, kv_dims, kv_strides, kv_offsets);
  } else {
    bld.tensor(K, "KT", CUDNN_DATA_BFLOAT16, kvt_dims, kvt_strides, kv_offsets);
    bld.tensor(V, "V", CUDNN_DATA_BFLOAT16, kv_dims, kv_strides, kv_offsets);
    bld.tensor(O, "O", CUDNN_DATA_BFLOAT16, q_dims, q_strides, qo_offsets);
    bld.tensor(Stats, "Stats", CUDNN_DATA_FLOAT, row_dims, stats_strides, stats_offsets, stats_scratch);
  }
  bld.scalar(Scale, "attn_scale");
  bld.scalar(MaskFill, "mask_fill");
  if (g.padding_mask) {
    bld.tensor(SeqLenQ, "seq_len_q", CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1});
    bld.tensor(SeqLenKV, "seq_len_kv", CUDNN_DATA_INT32, {B, 1, 1, 1}, {1, 1, 1, 1});
  }
  if (g.ragged) {
    bld.tensor(OffsetsQO, "ragged_offsets_qo", CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
    bld.tensor(OffsetsKV, "ragged_offsets_kv", CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
    bld.tensor(OffsetsStats, "ragged_offsets_stats", CUDNN_DATA_INT64, {B + 1, 1, 1, 1}, {1, 1, 1, 1});
  }
  const int64_t seq_q = g.padding_mask ? SeqLenQ : 0, seq_kv = g.padding_mask ? SeqLenKV : 0;

  if (!backward) {
    // CompositeSDPANode: bmm1, attention scale, padding mask, causal mask, softmax with stats, bmm2.
    const int64_t s = bld.virt("bmm1", CUDNN_DATA_FLOAT, score_dims, score_strides);
    bld.matmul("bmm1", Q, K, s, seq_q, seq_kv, 0, g.padding_mask);
    const int64_t scaled = bld.like(s, "attn_scale_out", CUDNN_DATA_FLOAT);
    bld.pointwise("attn_scale", CUDNN_POINTWISE_MUL, s, Scale, 0, scaled);
    const int64_t masked = apply_masks(bld, g, scaled, false);
    // CompositeSoftmaxNode: stats = max + log(sum(exp(x - max))), p = exp(x - max) / sum.
    const int64_t mx = bld.virt("Max", CUDNN_DATA_FLOAT, row_dims, row_strides);
    bld.reduction("Max", CUDNN_REDUCE_TENSOR_MAX, masked, mx);
    const int64_t sub = bld.like(masked, "sub_M", CUDNN_DATA_FLOAT);
    bld.pointwise("sub", CUDNN_POINTWISE_SUB, masked, mx, 0, sub);
    const int64_t ex = bld.like(masked, "exp_sub_M", CUDNN_DATA_FLOAT);
    bld.pointwise("exp", CUDNN_POINTWISE_EXP, sub, 0, 0, ex);
    const int64_t sum = bld.virt("SumExp", CUDNN_DATA_FLOAT, row_dims, row_strides);
    bld.reduction("sum", CUDNN_REDUCE_TENSOR_ADD, ex, sum);
    const int64_t lg = bld.virt("log_SumExp", CUDNN_DATA_FLOAT, row_dims, row_strides);
    bld.pointwise("log", CUDNN_POINTWISE_LOG, sum, 0, 0, lg);
    bld.pointwise("add", CUDNN_POINTWISE_ADD, mx, lg, 0, Stats);
    // The probabilities enter bmm2 in the io type (the frontend's "bmm2 aType" requirement).
    const int64_t p = bld.like(masked, "softmax_out", CUDNN_DATA_BFLOAT16);
    bld.pointwise("div", CUDNN_POINTWISE_DIV, ex, sum, 0, p);
    bld.matmul("bmm2", p, V, O, seq_q, 0, seq_kv);
    return g;
  }

  // CompositeSDPABackwardNode. softmax_sum = rowsum(dO * O) * 1 (the 1 is the dropout-scale slot).
  const int64_t rs_scratch = g.ragged_intermediates ? tokens * H * 4 : B * H * S * 4;
  bld.tensor(SoftmaxSum, "softmax_sum", CUDNN_DATA_FLOAT, row_dims, g.ragged_intermediates ? stats_strides : row_strides,
             g.ragged_intermediates ? stats_offsets : 0, rs_scratch);
  bld.scalar(One, "one");
  const int64_t doo = bld.virt("mul_dO_O", CUDNN_DATA_FLOAT, q_dims, {H * S * D, S * D, H * D, 1});
  bld.pointwise("mul_dO_O", CUDNN_POINTWISE_MUL, dO, O, 0, doo);
  const int64_t rowsum = bld.virt("reduce_dO_o", CUDNN_DATA_FLOAT, row_dims, row_strides);
  bld.reduction("reduce_dO_o", CUDNN_REDUCE_TENSOR_ADD, doo, rowsum);
  bld.pointwise("scale_dropout_inv", CUDNN_POINTWISE_MUL, rowsum, One, 0, SoftmaxSum);

  // P = exp(scale * Q K^T - stats), masked.
  const int64_t s = bld.virt("matmul_Q_KT", CUDNN_DATA_FLOAT, score_dims, score_strides);
  bld.matmul("matmul_Q_KT", Q, K, s, seq_q, seq_kv);
  const int64_t scaled = bld.like(s, "mul_s_attn_scale", CUDNN_DATA_FLOAT);
  bld.pointwise("mul_s_attn_scale", CUDNN_POINTWISE_MUL, s, Scale, 0, scaled);
  const int64_t centred = bld.like(s, "sub_s_m", CUDNN_DATA_FLOAT);
  bld.pointwise("sub_s_m", CUDNN_POINTWISE_SUB, scaled, Stats, 0, centred);
  const int64_t masked = apply_masks(bld, g, centred, true);
  const int64_t p = bld.like(s, "exp_s", CUDNN_DATA_FLOAT);
  bld.pointwise("exp_s", CUDNN_POINTWISE_EXP, masked, 0, 0, p);

  // Grouped queries: dK and dV per query head ("full head"), then summed over each group by a reduction. With
  // token-sized scratch they are materialized with dK's ragged offsets (the engine scales those by H / Hkv).
  const Dims full_strides_dense{H * S * D, S * D, D, 1}, full_strides_ragged{S * H * D, D, H * D, 1};
  auto full_head = [&](int64_t uid, const char* name) {
    if (g.ragged_intermediates)
      return bld.tensor(uid, name, CUDNN_DATA_BFLOAT16, q_dims, full_strides_ragged, kv_offsets, tokens * H * D * 4);
    return bld.virt(name, CUDNN_DATA_BFLOAT16, q_dims, full_strides_dense);
  };

  // dV = P^T dO.
  const int64_t pt = bld.virt("reshape_p", CUDNN_DATA_BFLOAT16, score_dims, score_t_strides);
  bld.reshape("reshape_p", p, pt);
  if (!gqa) {
    bld.matmul("matmul_pT_dO", pt, dO, dV, seq_kv, 0, seq_q);
  } else {
    const int64_t full = full_head(dVFull, "dV_fullhead");
    bld.matmul("matmul_pT_dO", pt, dO, full, seq_kv, 0, seq_q);
    bld.reduction("red_dV_head", CUDNN_REDUCE_TENSOR_ADD, full, dV);
  }

  // dS = scale * P * (dO V^T - softmax_sum).
  const int64_t dp = bld.virt("matmul_dO_VT", CUDNN_DATA_FLOAT, score_dims, score_strides);
  bld.matmul("matmul_dO_VT", dO, V, dp, seq_q, seq_kv);
  const int64_t dps = bld.like(s, "sub_dP_softmax_sum", CUDNN_DATA_FLOAT);
  bld.pointwise("sub_dP_softmax_sum", CUDNN_POINTWISE_SUB, dp, SoftmaxSum, 0, dps);
  const int64_t ds0 = bld.like(s, "mul_dP_exp_s", CUDNN_DATA_FLOAT);
  bld.pointwise("mul_dP_exp_s", CUDNN_POINTWISE_MUL, dps, p, 0, ds0);
  const int64_t ds = bld.like(s, "mul_dS_attn_scale", CUDNN_DATA_FLOAT);
  bld.pointwise("mul_dS_attn_scale", CUDNN_POINTWISE_MUL, ds0, Scale, 0, ds);

  // dK = dS^T Q.
  const int64_t dst = bld.virt("reshape_dS", CUDNN_DATA_BFLOAT16, score_dims, score_t_strides);
  bld.reshape("reshape_dS", ds, dst);
  if (!gqa) {
    bld.matmul("matmul_dST_Q", dst, Q, dK, seq_kv, 0, seq_q);
  } else {
    const int64_t full = full_head(dKFull, "dK_fullhead");
    bld.matmul("matmul_dST_Q", dst, Q, full, seq_kv, 0, seq_q);
    bld.reduction("red_dK_head", CUDNN_REDUCE_TENSOR_ADD, full, dK);
  }

  // dQ = dS K: K seen untransposed again (a virtual reshape of KT, in the intermediate type, with K's offsets).
  const int64_t kview = bld.virt("reshape_k", CUDNN_DATA_FLOAT, kv_dims, kv_strides, kv_offsets);
  bld.reshape("reshape_k", K, kview);
  if (g.dq_accumulated) {
    const Dims acc_strides = g.ragged_intermediates ? q_strides : Dims{H * S * D, S * D, D, 1};
    bld.tensor(dQAccum, "dQ_accum", CUDNN_DATA_FLOAT, q_dims, acc_strides, g.ragged_intermediates ? qo_offsets : 0,
               g.ragged_intermediates ? tokens * H * D * 4 : B * H * S * D * 4);
    // Before cuDNN 9.6.0 the accumulator had to start at zero (the frontend memset it).
    g.tensors.back().zero_before_execute = v < 90600;
    bld.matmul("matmul_dS_K", ds, kview, dQAccum, seq_q, 0, seq_kv);
    bld.pointwise("identity_dQ", CUDNN_POINTWISE_IDENTITY, dQAccum, 0, 0, dQ);
  } else {
    bld.matmul("matmul_dS_K", ds, kview, dQ, seq_q, 0, seq_kv);
  }
  return g;
}

const char* data_type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "f32";
    case CUDNN_DATA_HALF: return "f16";
    case CUDNN_DATA_BFLOAT16: return "bf16";
    case CUDNN_DATA_INT32: return "i32";
    case CUDNN_DATA_INT64: return "i64";
    case CUDNN_DATA_BOOLEAN: return "bool";
    default: return "?";
  }
}

std::string describe_tensor(const GraphTensor& t) {
  std::string s = fmt::format("{} #{} {} dims ({}) strides ({})", t.name, t.uid, data_type_name(t.dtype),
                              fmt::join(t.dims, ", "), fmt::join(t.strides, ", "));
  if (t.is_virtual) s += " virtual";
  if (t.by_value) s += " by-value";
  if (t.ragged_offset_uid != 0) s += fmt::format(" ragged by #{}", t.ragged_offset_uid);
  if (t.scratch_bytes != 0) s += fmt::format(" scratch {} B", t.scratch_bytes);
  return s;
}

std::string describe_op(const SdpaGraph& g, const GraphOp& op) {
  auto name = [&](int64_t uid) { return uid == 0 ? std::string("-") : g.tensor(uid).name; };
  switch (op.kind) {
    case GraphOpKind::Matmul:
      return fmt::format("matmul {}: {} @ {} -> {} (m {}, n {}, k {})", op.name, name(op.x), name(op.b), name(op.y),
                         name(op.m_override), name(op.n_override), name(op.k_override));
    case GraphOpKind::Pointwise:
      return fmt::format("pointwise {} (mode {}): {}, {}, {} -> {}", op.name, static_cast<int>(op.pointwise), name(op.x),
                         name(op.b), name(op.t), name(op.y));
    case GraphOpKind::Reduction:
      return fmt::format("reduction {} (op {}): {} -> {}", op.name, static_cast<int>(op.reduction), name(op.x), name(op.y));
    case GraphOpKind::Reshape: return fmt::format("reshape {}: {} -> {}", op.name, name(op.x), name(op.y));
  }
  return op.name;
}

}  // namespace shardtrain::ops::cuda
