// The cuDNN SDPA graph descriptions (src/ops/cuda/cudnn_sdpa_graph.hpp) checked as data, without cuDNN: the
// dims and strides of the BSHD tensors, the grouped-query K/V, the stats layouts, the sequence-length and ragged
// offset tensors, the workspace-backed scratch, the uids bound at execute, the per-version workarounds, the
// deterministic variant, and the reasons that rule calls out before cuDNN is asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "shardtrain/ops/tensor.hpp"
#include "shardtrain/runtime/error.hpp"
#include "src/ops/cuda/cudnn_attention.hpp"
#include "src/ops/cuda/cudnn_sdpa_graph.hpp"

namespace shardtrain::ops::cuda {
namespace {

using namespace sdpa_uid;
using Dims = std::array<int64_t, 4>;

constexpr SdpaTarget kH100{91900, 90};

SdpaCall call(SdpaDirection dir, SdpaMasking m, int64_t b, int64_t s, int64_t h, int64_t hk, int64_t d,
              int64_t max_sequences = 0, bool deterministic = false) {
  SdpaCall c;
  c.batch = b;
  c.seq = s;
  c.heads = h;
  c.kv_heads = hk;
  c.head_dim = d;
  c.direction = dir;
  c.masking = m;
  c.max_sequences = max_sequences;
  c.deterministic = deterministic;
  return c;
}

int count_mode(const SdpaGraph& g, cudnnPointwiseMode_t mode) {
  return static_cast<int>(std::count_if(g.ops.begin(), g.ops.end(), [&](const GraphOp& op) {
    return op.kind == GraphOpKind::Pointwise && op.pointwise == mode;
  }));
}

const GraphOp& op_named(const SdpaGraph& g, const std::string& name) {
  for (const GraphOp& op : g.ops)
    if (op.name == name) return op;
  throw std::runtime_error("no op " + name);
}

// Every op's tensors exist; every virtual tensor is written by exactly one op and read by at least one; the
// caller's outputs and the scratch are written once; the inputs are never written; no uid repeats.
void expect_well_formed(const SdpaGraph& g) {
  std::set<int64_t> uids;
  for (const GraphTensor& t : g.tensors) EXPECT_TRUE(uids.insert(t.uid).second) << "uid repeated: " << t.uid;
  std::map<int64_t, int> writes, reads;
  for (const GraphOp& op : g.ops) {
    for (int64_t u : {op.x, op.b, op.t, op.m_override, op.n_override, op.k_override})
      if (u != 0) {
        EXPECT_TRUE(g.has(u)) << op.name << " reads missing #" << u;
        ++reads[u];
      }
    ASSERT_TRUE(g.has(op.y)) << op.name;
    ++writes[op.y];
  }
  const bool backward = g.call.direction == SdpaDirection::Backward;
  const std::set<int64_t> outputs =
      backward ? std::set<int64_t>{dQ, dK, dV, SoftmaxSum, dQAccum, dKFull, dVFull} : std::set<int64_t>{O, Stats};
  for (const GraphTensor& t : g.tensors) {
    SCOPED_TRACE(describe_tensor(t));
    if (t.is_virtual) {
      EXPECT_EQ(writes[t.uid], 1);
      EXPECT_GE(reads[t.uid], 1);
    } else if (outputs.count(t.uid)) {
      EXPECT_EQ(writes[t.uid], 1);
    } else {
      EXPECT_EQ(writes[t.uid], 0) << "an input is written";
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_GT(t.dims[static_cast<size_t>(i)], 0);
      EXPECT_GT(t.strides[static_cast<size_t>(i)], 0);
    }
    if (t.ragged_offset_uid != 0) {
      const GraphTensor& o = g.tensor(t.ragged_offset_uid);
      EXPECT_EQ(o.dtype, CUDNN_DATA_INT64);
      EXPECT_EQ(o.dims, (Dims{g.graph_batch + 1, 1, 1, 1}));
    }
  }
}

TEST(CudnnSdpaGraph, GraphBatchAndPlanKeys) {
  EXPECT_EQ(sdpa_graph_batch(call(SdpaDirection::Forward, SdpaMasking::Causal, 3, 64, 4, 4, 64)), 3);
  for (auto [n, want] : {std::pair<int64_t, int64_t>{1, 1}, {2, 2}, {5, 8}, {8, 8}, {9, 16}, {100, 128}})
    EXPECT_EQ(sdpa_graph_batch(call(SdpaDirection::Forward, SdpaMasking::Documents, 2, 64, 4, 4, 64, n)), want) << n;
  // The forward ignores deterministic, Causal ignores max_sequences, Documents keys on the rounded bound.
  const SdpaCall f = call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 64, 7, true);
  EXPECT_EQ(sdpa_plan_key(f), sdpa_plan_key(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 64)));
  const SdpaCall b5 = call(SdpaDirection::Backward, SdpaMasking::Documents, 2, 64, 4, 4, 64, 5, true);
  const SdpaCall b7 = call(SdpaDirection::Backward, SdpaMasking::Documents, 2, 64, 4, 4, 64, 7, true);
  EXPECT_EQ(sdpa_plan_key(b5), sdpa_plan_key(b7));
  EXPECT_EQ(sdpa_plan_key(b5).max_sequences, 8);
  EXPECT_NE(sdpa_plan_key(b5), sdpa_plan_key(call(SdpaDirection::Backward, SdpaMasking::Documents, 2, 64, 4, 4, 64, 5)));
  EXPECT_EQ(describe_call(b5), "backward B=2 S=64 H=4/4 Dh=64 documents<=5 deterministic");
}

TEST(CudnnSdpaGraph, ForwardCausalIsBshdWithGroupedKvAndDenseStats) {
  const int64_t B = 2, S = 512, H = 8, Hk = 2, D = 64;
  const SdpaGraph g = describe_sdpa(call(SdpaDirection::Forward, SdpaMasking::Causal, B, S, H, Hk, D), kH100);
  expect_well_formed(g);
  EXPECT_EQ(g.graph_batch, B);
  EXPECT_FALSE(g.padding_mask);
  EXPECT_FALSE(g.ragged);
  EXPECT_FLOAT_EQ(g.scale, 0.125f);
  EXPECT_EQ(g.mask_fill, -std::numeric_limits<float>::infinity());
  const GraphTensor& q = g.tensor(Q);
  EXPECT_EQ(q.dtype, CUDNN_DATA_BFLOAT16);
  EXPECT_EQ(q.dims, (Dims{B, H, S, D}));
  EXPECT_EQ(q.strides, (Dims{S * H * D, D, H * D, 1}));  // (B, S, H, Dh) row-major
  EXPECT_EQ(q.ragged_offset_uid, 0);
  const GraphTensor& kt = g.tensor(K);  // K as bmm1's transposed operand
  EXPECT_EQ(kt.dims, (Dims{B, Hk, D, S}));
  EXPECT_EQ(kt.strides, (Dims{S * Hk * D, D, 1, Hk * D}));
  const GraphTensor& v = g.tensor(V);
  EXPECT_EQ(v.dims, (Dims{B, Hk, S, D}));
  EXPECT_EQ(v.strides, (Dims{S * Hk * D, D, Hk * D, 1}));
  EXPECT_EQ(g.tensor(O).dims, q.dims);
  EXPECT_EQ(g.tensor(O).strides, q.strides);
  const GraphTensor& stats = g.tensor(Stats);  // our lse (B, H, S), fp32, bound as it is
  EXPECT_EQ(stats.dtype, CUDNN_DATA_FLOAT);
  EXPECT_EQ(stats.dims, (Dims{B, H, S, 1}));
  EXPECT_EQ(stats.strides, (Dims{H * S, S, 1, 1}));
  EXPECT_EQ(stats.scratch_bytes, 0);
  EXPECT_TRUE(g.tensor(Scale).by_value);
  EXPECT_TRUE(g.tensor(MaskFill).by_value);
  EXPECT_EQ(g.bound_uids(), (std::vector<int64_t>{Q, K, V, O, Stats, Scale, MaskFill}));

  const GraphOp& bmm1 = g.ops.front();
  EXPECT_EQ(bmm1.kind, GraphOpKind::Matmul);
  EXPECT_EQ(bmm1.x, Q);
  EXPECT_EQ(bmm1.b, K);
  EXPECT_EQ(g.tensor(bmm1.y).dims, (Dims{B, H, S, S}));
  EXPECT_EQ(bmm1.m_override, 0);
  const GraphOp& bmm2 = g.ops.back();
  EXPECT_EQ(bmm2.kind, GraphOpKind::Matmul);
  EXPECT_EQ(bmm2.b, V);
  EXPECT_EQ(bmm2.y, O);
  EXPECT_EQ(g.tensor(bmm2.x).dtype, CUDNN_DATA_BFLOAT16);  // the probabilities enter bmm2 in bf16
  // Stats = max + log(sum(exp(s - max))): the natural-log LSE of the scaled, masked scores.
  EXPECT_EQ(op_named(g, "attn_scale").b, Scale);
  const GraphOp& add = op_named(g, "add");
  EXPECT_EQ(add.y, Stats);
  EXPECT_EQ(op_named(g, "Max").reduction, CUDNN_REDUCE_TENSOR_MAX);
  EXPECT_EQ(g.tensor(op_named(g, "Max").y).dims, (Dims{B, H, S, 1}));
  EXPECT_EQ(count_mode(g, CUDNN_POINTWISE_LOG), 1);
  // Top-left causal: keep where row >= col.
  const GraphOp& causal = op_named(g, "row_ge_col");
  EXPECT_EQ(causal.pointwise, CUDNN_POINTWISE_CMP_GE);
  EXPECT_EQ(op_named(g, "gen_row_idx_causal").axis, 2);
  EXPECT_EQ(op_named(g, "gen_col_idx_causal").axis, 3);
  EXPECT_EQ(count_mode(g, CUDNN_POINTWISE_BINARY_SELECT), 1);
  EXPECT_EQ(op_named(g, "select_causal").b, MaskFill);
  EXPECT_EQ(op_named(g, "select_causal").t, causal.y);
}

TEST(CudnnSdpaGraph, VersionWorkarounds) {
  // Before 9.10: the lowest float fills masked scores, and the backward applies the padding mask twice.
  const SdpaGraph old_fwd =
      describe_sdpa(call(SdpaDirection::Forward, SdpaMasking::Causal, 1, 64, 2, 2, 64), SdpaTarget{90900, 90});
  EXPECT_EQ(old_fwd.mask_fill, std::numeric_limits<float>::lowest());
  // cuDNN <= 9.15's backward with S % 128 != 0: a padding mask with full lengths (the frontend's workaround).
  const SdpaCall odd = call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 45, 4, 2, 64);
  const SdpaGraph w = describe_sdpa(odd, SdpaTarget{91500, 90});
  expect_well_formed(w);
  EXPECT_TRUE(w.padding_mask);
  EXPECT_EQ(w.tensor(SeqLenQ).dims, (Dims{2, 1, 1, 1}));
  EXPECT_EQ(w.tensor(SeqLenQ).dtype, CUDNN_DATA_INT32);
  EXPECT_EQ(op_named(w, "matmul_Q_KT").m_override, SeqLenQ);
  EXPECT_EQ(op_named(w, "matmul_Q_KT").n_override, SeqLenKV);
  EXPECT_EQ(op_named(w, "matmul_pT_dO").m_override, SeqLenKV);
  EXPECT_EQ(op_named(w, "matmul_pT_dO").k_override, SeqLenQ);
  EXPECT_EQ(count_mode(w, CUDNN_POINTWISE_BINARY_SELECT), 2);  // padding + causal
  EXPECT_FALSE(describe_sdpa(odd, SdpaTarget{91600, 90}).padding_mask);
  EXPECT_FALSE(describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 512, 4, 2, 64), SdpaTarget{91500, 90})
                   .padding_mask);
  const SdpaGraph twice = describe_sdpa(odd, SdpaTarget{90900, 90});
  expect_well_formed(twice);
  EXPECT_EQ(count_mode(twice, CUDNN_POINTWISE_BINARY_SELECT), 3);
  // Before 9.6 the dQ accumulator must start at zero.
  EXPECT_TRUE(describe_sdpa(odd, SdpaTarget{90501, 90}).tensor(dQAccum).zero_before_execute);
  EXPECT_FALSE(twice.tensor(dQAccum).zero_before_execute);
}

TEST(CudnnSdpaGraph, BackwardCausalAccumulatesDqInDenseScratch) {
  const int64_t B = 2, S = 256, H = 12, Hk = 3, D = 128;
  const SdpaGraph g = describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Causal, B, S, H, Hk, D), kH100);
  expect_well_formed(g);
  EXPECT_TRUE(g.dq_accumulated);
  EXPECT_EQ(g.tensor(K).dims, (Dims{B, Hk, D, S}));  // KT and VT
  EXPECT_EQ(g.tensor(V).dims, (Dims{B, Hk, D, S}));
  EXPECT_EQ(g.tensor(V).strides, (Dims{S * Hk * D, D, 1, Hk * D}));
  EXPECT_EQ(g.tensor(dK).dims, (Dims{B, Hk, S, D}));
  EXPECT_EQ(g.tensor(dK).strides, (Dims{S * Hk * D, D, Hk * D, 1}));
  EXPECT_EQ(g.tensor(dQ).strides, (Dims{S * H * D, D, H * D, 1}));
  const GraphTensor& acc = g.tensor(dQAccum);
  EXPECT_EQ(acc.dtype, CUDNN_DATA_FLOAT);
  EXPECT_EQ(acc.strides, (Dims{H * S * D, S * D, D, 1}));  // dense BHSD fp32
  EXPECT_EQ(acc.scratch_bytes, B * H * S * D * 4);
  EXPECT_EQ(g.tensor(SoftmaxSum).strides, (Dims{H * S, S, 1, 1}));
  EXPECT_EQ(g.tensor(SoftmaxSum).scratch_bytes, B * H * S * 4);
  EXPECT_EQ(op_named(g, "matmul_dS_K").y, dQAccum);
  EXPECT_EQ(op_named(g, "identity_dQ").y, dQ);
  // Grouped queries: per-query-head dK and dV (virtual), reduced over each group.
  EXPECT_TRUE(g.tensor(op_named(g, "matmul_dST_Q").y).is_virtual);
  EXPECT_EQ(g.tensor(op_named(g, "matmul_dST_Q").y).dims, (Dims{B, H, S, D}));
  EXPECT_EQ(op_named(g, "red_dK_head").y, dK);
  EXPECT_EQ(op_named(g, "red_dV_head").y, dV);
  // P^T and dS^T enter their matmuls in bf16; K is seen untransposed for dQ.
  EXPECT_EQ(g.tensor(op_named(g, "reshape_p").y).strides, (Dims{H * S * S, S * S, 1, S}));
  EXPECT_EQ(g.tensor(op_named(g, "reshape_p").y).dtype, CUDNN_DATA_BFLOAT16);
  EXPECT_EQ(g.tensor(op_named(g, "reshape_k").y).dims, (Dims{B, Hk, S, D}));
  EXPECT_EQ(op_named(g, "sub_s_m").b, Stats);
  EXPECT_EQ(op_named(g, "scale_dropout_inv").b, One);
  EXPECT_EQ(g.bound_uids(),
            (std::vector<int64_t>{Q, K, V, O, dO, Stats, dQ, dK, dV, Scale, MaskFill, SoftmaxSum, One, dQAccum}));
  // Heads of equal count: dK and dV straight from their matmuls.
  const SdpaGraph mha = describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Causal, B, S, 4, 4, 64), kH100);
  expect_well_formed(mha);
  EXPECT_EQ(op_named(mha, "matmul_dST_Q").y, dK);
  EXPECT_EQ(op_named(mha, "matmul_pT_dO").y, dV);
}

TEST(CudnnSdpaGraph, DeterministicBackwardHasNoAccumulator) {
  const SdpaGraph g = describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 512, 8, 2, 64, 0, true), kH100);
  expect_well_formed(g);
  EXPECT_FALSE(g.dq_accumulated);
  EXPECT_FALSE(g.has(dQAccum));
  EXPECT_EQ(op_named(g, "matmul_dS_K").y, dQ);
  EXPECT_EQ(count_mode(g, CUDNN_POINTWISE_IDENTITY), 0);
}

TEST(CudnnSdpaGraph, DocumentsArePackedSequences) {
  const int64_t B = 2, S = 130, H = 6, Hk = 2, D = 64, runs = 5, Bp = 8, T = B * S;
  const SdpaGraph f = describe_sdpa(call(SdpaDirection::Forward, SdpaMasking::Documents, B, S, H, Hk, D, runs), kH100);
  expect_well_formed(f);
  EXPECT_EQ(f.graph_batch, Bp);
  EXPECT_TRUE(f.padding_mask);
  EXPECT_TRUE(f.ragged);
  const GraphTensor& q = f.tensor(Q);
  EXPECT_EQ(q.dims, (Dims{Bp, H, S, D}));
  EXPECT_EQ(q.strides, (Dims{S * H * D, D, H * D, 1}));
  EXPECT_EQ(q.ragged_offset_uid, OffsetsQO);
  EXPECT_EQ(f.tensor(O).ragged_offset_uid, OffsetsQO);
  EXPECT_EQ(f.tensor(K).ragged_offset_uid, OffsetsKV);
  EXPECT_EQ(f.tensor(V).ragged_offset_uid, OffsetsKV);
  for (int64_t u : {SeqLenQ, SeqLenKV}) {
    EXPECT_EQ(f.tensor(u).dims, (Dims{Bp, 1, 1, 1}));
    EXPECT_EQ(f.tensor(u).dtype, CUDNN_DATA_INT32);
  }
  // Stats token-major (B * S, H) in scratch, by its own offsets (start * H); converted to lse after.
  const GraphTensor& stats = f.tensor(Stats);
  EXPECT_EQ(stats.dims, (Dims{Bp, H, S, 1}));
  EXPECT_EQ(stats.strides, (Dims{H * S, 1, H, 1}));
  EXPECT_EQ(stats.ragged_offset_uid, OffsetsStats);
  EXPECT_EQ(stats.scratch_bytes, T * H * 4);
  EXPECT_EQ(f.ops.front().m_override, SeqLenQ);
  EXPECT_EQ(f.ops.front().n_override, SeqLenKV);
  EXPECT_TRUE(f.ops.front().padded_matmul);
  EXPECT_EQ(f.ops.back().m_override, SeqLenQ);
  EXPECT_EQ(f.ops.back().k_override, SeqLenKV);
  EXPECT_EQ(count_mode(f, CUDNN_POINTWISE_BINARY_SELECT), 2);
  EXPECT_EQ(op_named(f, "lt_row_sq_padding").b, SeqLenQ);
  EXPECT_EQ(op_named(f, "lt_col_skv_padding").b, SeqLenKV);

  const SdpaGraph b = describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Documents, B, S, H, Hk, D, runs), kH100);
  expect_well_formed(b);
  EXPECT_TRUE(b.ragged_intermediates);
  const GraphTensor& acc = b.tensor(dQAccum);  // token-sized, laid out like dq, by its offsets
  EXPECT_EQ(acc.strides, (Dims{S * H * D, D, H * D, 1}));
  EXPECT_EQ(acc.ragged_offset_uid, OffsetsQO);
  EXPECT_EQ(acc.scratch_bytes, T * H * D * 4);
  const GraphTensor& sum = b.tensor(SoftmaxSum);
  EXPECT_EQ(sum.strides, (Dims{H * S, 1, H, 1}));
  EXPECT_EQ(sum.ragged_offset_uid, OffsetsStats);
  EXPECT_EQ(sum.scratch_bytes, T * H * 4);
  for (int64_t u : {dKFull, dVFull}) {  // materialized per query head, by dK's offsets (scaled by H / Hkv in cuDNN)
    const GraphTensor& full = b.tensor(u);
    EXPECT_FALSE(full.is_virtual);
    EXPECT_EQ(full.dims, (Dims{Bp, H, S, D}));
    EXPECT_EQ(full.strides, (Dims{S * H * D, D, H * D, 1}));
    EXPECT_EQ(full.ragged_offset_uid, OffsetsKV);
    EXPECT_EQ(full.scratch_bytes, T * H * D * 4);
  }
  EXPECT_EQ(b.tensor(op_named(b, "reshape_k").y).ragged_offset_uid, OffsetsKV);
  for (int64_t u : {dO, dQ}) EXPECT_EQ(b.tensor(u).ragged_offset_uid, OffsetsQO);
  for (int64_t u : {dK, dV}) EXPECT_EQ(b.tensor(u).ragged_offset_uid, OffsetsKV);

  // Ampere: the fp32 scratch sized by the graph's batch (the frontend drops token sizing there).
  const SdpaGraph a =
      describe_sdpa(call(SdpaDirection::Backward, SdpaMasking::Documents, B, S, H, Hk, D, runs), SdpaTarget{91900, 80});
  expect_well_formed(a);
  EXPECT_FALSE(a.ragged_intermediates);
  EXPECT_EQ(a.tensor(dQAccum).strides, (Dims{H * S * D, S * D, D, 1}));
  EXPECT_EQ(a.tensor(dQAccum).scratch_bytes, Bp * H * S * D * 4);
  EXPECT_EQ(a.tensor(dQAccum).ragged_offset_uid, 0);
  EXPECT_FALSE(a.has(dKFull));
}

TEST(CudnnSdpaGraph, StaticReasons) {
  const SdpaCall ok = call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 512, 8, 2, 64);
  EXPECT_EQ(sdpa_static_reason(ok, "bf16", kH100), "");
  EXPECT_EQ(sdpa_static_reason(ok, "f32", kH100), "f32 (cuDNN's flash attention takes bf16/fp16; shardtrain uses bf16)");
  EXPECT_EQ(sdpa_static_reason(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 60), "bf16", kH100),
            "head dim 60 (multiple of 8 up to 256 needed)");
  EXPECT_EQ(sdpa_static_reason(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 264), "bf16", kH100),
            "head dim 264 (multiple of 8 up to 256 needed)");
  EXPECT_EQ(sdpa_static_reason(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 72), "bf16", kH100), "");
  EXPECT_EQ(
      sdpa_static_reason(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 192), "bf16", SdpaTarget{91900, 80}),
      "head dim 192 (multiple of 8 up to 128 needed)");
  EXPECT_EQ(sdpa_static_reason(ok, "bf16", SdpaTarget{91900, 75}),
            "compute capability 7.5: cuDNN's flash attention needs 8.0 or newer");
  EXPECT_EQ(sdpa_static_reason(ok, "bf16", SdpaTarget{91001, 90}),
            "cuDNN 9.10.1 has known SDPA bugs (9.10.2 and later are fine)");
  EXPECT_EQ(sdpa_static_reason(ok, "bf16", SdpaTarget{8907, 90}),
            "cuDNN 8.9.7 older than 9.0.0 needed for its fused attention graphs");
  const SdpaCall docs = call(SdpaDirection::Forward, SdpaMasking::Documents, 2, 512, 8, 2, 64, 6);
  EXPECT_EQ(sdpa_static_reason(docs, "bf16", kH100), "");
  EXPECT_EQ(sdpa_static_reason(docs, "bf16", SdpaTarget{90501, 90}),
            "cuDNN 9.5.1 older than 9.6.0 needed for packed documents (token-major statistics, grouped-query ragged "
            "tensors)");
  EXPECT_EQ(sdpa_static_reason(docs, "bf16", SdpaTarget{91700, 80}),
            "compute capability 8.0: cuDNN 9.17.0 runs packed documents on 9.0 and newer only (8.x from 9.18.1)");
  EXPECT_EQ(sdpa_static_reason(docs, "bf16", SdpaTarget{91900, 80}), "");
  SdpaCall unbounded = docs;
  unbounded.max_sequences = 0;
  EXPECT_EQ(sdpa_static_reason(unbounded, "bf16", kH100),
            "packed documents without a bound on their runs (max_sequences = 0)");
  EXPECT_EQ(sdpa_static_reason(call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 1, 4, 4, 64), "bf16", kH100),
            "S = 1 (cuDNN's backward refuses s_q = s_kv = 1)");
  EXPECT_EQ(sdpa_static_reason(call(SdpaDirection::Backward, SdpaMasking::Documents, 2, 64, 4, 4, 64, 3, true), "bf16",
                               SdpaTarget{91900, 86}),
            "compute capability 8.6: cuDNN has no deterministic backward for packed documents");
  EXPECT_THROW(describe_sdpa(call(SdpaDirection::Forward, SdpaMasking::Causal, 2, 64, 4, 4, 60), kH100), InternalError);
}

// The Ops-level call (shape, mask and its hint) as an SdpaCall.
TEST(CudnnSdpaGraph, CallsFromTheOpsInterface) {
  const AttentionShape shape{2, 64, 8, 2, 64};
  int32_t segments[2 * 64] = {};
  SdpaCall c;
  EXPECT_EQ(sdpa_call_of(shape, AttentionMask{}, SdpaDirection::Backward, true, &c), "");
  EXPECT_EQ(c, call(SdpaDirection::Backward, SdpaMasking::Causal, 2, 64, 8, 2, 64, 0, true));
  AttentionMask mask{make_tensor(segments, DType::I32, Shape{2, 64})};
  mask.hint = SegmentsHint::Causal;
  EXPECT_EQ(sdpa_call_of(shape, mask, SdpaDirection::Forward, false, &c), "");
  EXPECT_EQ(c.masking, SdpaMasking::Causal);
  mask.hint = SegmentsHint::Documents;
  mask.runs = 9;
  EXPECT_EQ(sdpa_call_of(shape, mask, SdpaDirection::Forward, false, &c), "");
  EXPECT_EQ(c, call(SdpaDirection::Forward, SdpaMasking::Documents, 2, 64, 8, 2, 64, 9));
  mask.runs = 0;
  EXPECT_EQ(sdpa_call_of(shape, mask, SdpaDirection::Forward, false, &c), "packed documents without a bound on their runs");
  mask.hint = SegmentsHint::Unknown;
  EXPECT_EQ(sdpa_call_of(shape, mask, SdpaDirection::Forward, false, &c),
            "segments the batch does not describe (padding or documents without a hint)");
}

}  // namespace
}  // namespace shardtrain::ops::cuda
