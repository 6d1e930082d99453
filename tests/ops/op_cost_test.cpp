// Op costs: the analytic estimate's arithmetic per kind of op, the table model's hits and misses (and GEMMs priced
// like the nearest measured one), GEMM keys read back, the built-in device rates, and bad rates.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "shardtrain/ops/op_cost.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::ops {
namespace {

// matmul 1 TFLOP/s, memory 100 GB/s, attention 500 / 250 TFLOP/s, 2 us per kernel.
DeviceRates test_rates() { return {"test", 1e12, 1e11, 5e11, 2.5e11, 2e-6}; }

OpCall call(const std::string& name, const std::string& key, double flops, double bytes) {
  return {name, key, "", flops, bytes};
}

TEST(OpCost, AnalyticSecondsTakeTheSlowerOfComputeAndMemory) {
  const DeviceRates r = test_rates();
  EXPECT_DOUBLE_EQ(analytic_seconds(call("matmul", "", 2e9, 1e6), r), 2e-6 + 2e-3);      // compute-bound
  EXPECT_DOUBLE_EQ(analytic_seconds(call("matmul_add", "", 2e3, 1e6), r), 2e-6 + 1e-5);  // memory-bound GEMM
  EXPECT_DOUBLE_EQ(analytic_seconds(call("rmsnorm_forward", "", 0, 1e9), r), 2e-6 + 1e-2);
  EXPECT_DOUBLE_EQ(analytic_seconds(call("attention_forward", "", 1e9, 1e3), r), 2e-6 + 2e-3);
  EXPECT_DOUBLE_EQ(analytic_seconds(call("attention_backward", "", 1e9, 1e3), r), 2e-6 + 4e-3);
  EXPECT_DOUBLE_EQ(analytic_seconds(call("linear_cross_entropy", "", 1e12, 1e9), r), 2e-6 + 1.0);
  EXPECT_DOUBLE_EQ(analytic_seconds(call("fill", "", 0, 0), r), 2e-6);
  DeviceRates with_loss = r;
  with_loss.loss_flops_per_s = 4e11;  // the fused loss at its own rate, nothing else
  EXPECT_DOUBLE_EQ(analytic_seconds(call("linear_cross_entropy", "", 1e12, 1e9), with_loss), 2e-6 + 2.5);
  EXPECT_DOUBLE_EQ(analytic_seconds(call("matmul", "", 2e9, 1e6), with_loss), 2e-6 + 2e-3);
}

TEST(OpCost, AttentionTakesTheNearestMeasuredShapesRate) {
  DeviceRates r = test_rates();
  r.attention_points = {{64, 512, 1e11, 5e10}, {64, 2048, 2e11, 1e11}, {128, 8192, 4e11, 2e11}};
  auto attention = [](const char* name, int64_t dh, int64_t seq) {
    OpCall c{name, "", "", 1e9, 0};
    c.attention = {1, seq, 8, 8, dh};
    return c;
  };
  EXPECT_DOUBLE_EQ(analytic_seconds(attention("attention_forward", 64, 600), r), 2e-6 + 1e-2);     // nearest: 512
  EXPECT_DOUBLE_EQ(analytic_seconds(attention("attention_forward", 64, 1500), r), 2e-6 + 5e-3);    // nearest: 2048
  EXPECT_DOUBLE_EQ(analytic_seconds(attention("attention_backward", 64, 4096), r), 2e-6 + 1e-2);   // 2048's backward
  EXPECT_DOUBLE_EQ(analytic_seconds(attention("attention_forward", 128, 512), r), 2e-6 + 2.5e-3);  // the only Dh 128
  EXPECT_DOUBLE_EQ(analytic_seconds(attention("attention_forward", 96, 512), r), 2e-6 + 2e-3);     // none: the base rate
}

TEST(OpCost, MemoryBoundMissesTakeTheirOpsScale) {
  TableCostModel m({}, test_rates());
  m.set_memory_bound_scale({{"rmsnorm_forward", 1.5}, {"matmul", 3.0}});
  EXPECT_DOUBLE_EQ(m.seconds(call("rmsnorm_forward", "a", 0, 1e9)), 1.5 * (2e-6 + 1e-2));
  EXPECT_DOUBLE_EQ(m.seconds(call("swiglu_forward", "b", 0, 1e9)), 2e-6 + 1e-2);  // no scale for it
  EXPECT_DOUBLE_EQ(m.seconds(call("matmul", "c", 2e9, 1e6)), 2e-6 + 2e-3);        // FLOPs: never scaled
}

// Records each call's key, as the timing ops would see it.
class KeyRecorder final : public DescribingOps {
 public:
  std::vector<std::string> keys;
  DeviceKind device() const override { return DeviceKind::Cpu; }
  void set_stream(StreamRef) override {}
  StreamRef stream() const override { return {}; }
  std::unique_ptr<Ops> make_side_ops() const override { return nullptr; }

 private:
  void on_call(OpCall call) override { keys.push_back(call.key); }
};

TEST(OpCost, GemmKeysReadBackAsDescribingOpsWritesThem) {
  std::vector<float> buf(4096);
  const Tensor x = make_tensor(buf.data(), DType::BF16, {16, 8}), w = make_tensor(buf.data(), DType::BF16, {24, 8});
  const Tensor y = make_tensor(buf.data(), DType::BF16, {16, 24}), dw = make_tensor(buf.data(), DType::F32, {24, 8});
  KeyRecorder r;
  r.matmul(Transpose::No, Transpose::Yes, 1.0, x, w, 0.0, y);    // y = x W^T: 16 x 24 x 8
  r.matmul(Transpose::Yes, Transpose::No, 1.0, y, x, 1.0, dw);   // dW += dy^T x: 24 x 8 x 16
  r.matmul_add(Transpose::No, Transpose::Yes, 1.0, x, w, y, y);  // y = x W^T + r
  r.fill(y, 0.0);
  ASSERT_EQ(r.keys.size(), 4u);
  const auto a = parse_gemm_key(r.keys[0]), b = parse_gemm_key(r.keys[1]), c = parse_gemm_key(r.keys[2]);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->form, "NT bf16 bf16 bf16");
  EXPECT_EQ((std::vector<int64_t>{a->m, a->n, a->k}), (std::vector<int64_t>{16, 24, 8}));
  EXPECT_EQ(b->form, "TN bf16 bf16 f32");
  EXPECT_EQ((std::vector<int64_t>{b->m, b->n, b->k}), (std::vector<int64_t>{24, 8, 16}));
  EXPECT_EQ(c->form, a->form);  // the residual in the epilogue: the same GEMM
  EXPECT_EQ((std::vector<int64_t>{c->m, c->n, c->k}), (std::vector<int64_t>{16, 24, 8}));
  EXPECT_FALSE(parse_gemm_key(r.keys[3]));
  EXPECT_FALSE(parse_gemm_key("matmul NT m 16 n x k 8 bf16 bf16 bf16"));
  EXPECT_FALSE(parse_gemm_key("matmul NT m 16 n 0 k 8 bf16 bf16 bf16"));
  EXPECT_FALSE(parse_gemm_key("matmul NT m 16 n 24"));
}

TEST(OpCost, GemmMissesTakeTheNearestMeasuredGemmsScale) {
  // analytic at 1 TFLOP/s: 2 us + 2 M N K / 1e12 (these GEMMs are compute-bound at 100 GB/s)
  auto gemm = [](int64_t m, int64_t n, int64_t k, const char* form = "NT bf16 bf16 bf16") {
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const std::string key =
        fmt::format("matmul {} m {} n {} k {} {}", std::string(form).substr(0, 2), m, n, k, std::string(form).substr(3));
    return OpCall{"matmul", key, "", flops, 1e3};
  };
  TableCostModel m({}, test_rates());
  m.set_gemm_points({{"small", GemmKey{"NT bf16 bf16 bf16", 4096, 768, 768}, 1.25},
                     {"wide", GemmKey{"NT bf16 bf16 bf16", 4096, 3072, 768}, 1.1},
                     {"dW", GemmKey{"TN bf16 bf16 f32", 768, 768, 4096}, 1.5}});
  auto analytic = [&](const OpCall& c) { return analytic_seconds(c, test_rates()); };
  const OpCall qkv = gemm(4096, 1152, 768), gate_up = gemm(4096, 6144, 768), big = gemm(4096, 4096, 4096);
  const OpCall dw = gemm(1152, 768, 4096, "TN bf16 bf16 f32"), other_form = gemm(4096, 1152, 768, "NN bf16 bf16 bf16");
  const OpCall tiny = gemm(256, 768, 768), tiny_but_long = gemm(256, 768, 2048);
  EXPECT_DOUBLE_EQ(m.seconds(qkv), 1.25 * analytic(qkv));         // n 1152: nearer 768 than 3072
  EXPECT_DOUBLE_EQ(m.seconds(gate_up), 1.1 * analytic(gate_up));  // n 6144: 2x of 3072, the limit
  EXPECT_DOUBLE_EQ(m.seconds(big), analytic(big));                // k 4096: over 2x of every point's
  EXPECT_DOUBLE_EQ(m.seconds(dw), 1.5 * analytic(dw));            // its own form's point
  OpCall dw_accumulating = dw;  // the same GEMM adding into its output (beta 1): the same point, its own bytes
  dw_accumulating.key += " +=";
  dw_accumulating.bytes += 1152.0 * 768 * 4;
  EXPECT_DOUBLE_EQ(m.seconds(dw_accumulating), 1.5 * analytic(dw_accumulating));
  EXPECT_DOUBLE_EQ(m.seconds(other_form), analytic(other_form));        // no point of its form
  EXPECT_DOUBLE_EQ(m.seconds(tiny), 1.25 * analytic(tiny));             // m 16x smaller: bounded by a larger GEMM
  EXPECT_DOUBLE_EQ(m.seconds(tiny_but_long), analytic(tiny_but_long));  // k larger than every point's
  EXPECT_EQ(m.missed().at(qkv.key).like, "small");
  EXPECT_EQ(m.missed().at(gate_up.key).like, "wide");
  EXPECT_EQ(m.missed().at(big.key).like, "");
  // A call the table has keeps its measured seconds.
  const TableCostModel measured({{qkv.key, 9e-6}}, test_rates());
  EXPECT_DOUBLE_EQ(measured.seconds(qkv), 9e-6);
}

TEST(OpCost, TableScaleMultipliesTableHitsOnly) {
  TableCostModel m({{"k", 3e-3}}, test_rates());
  m.set_table_scale(2.0);
  EXPECT_DOUBLE_EQ(m.seconds(call("matmul", "k", 2e9, 1e6)), 6e-3);
  EXPECT_DOUBLE_EQ(m.seconds(call("matmul", "other", 2e9, 1e6)), 2e-6 + 2e-3);
}

TEST(OpCost, TableHitsAndFallbackMisses) {
  const TableCostModel m({{"matmul NT m 8 n 8 k 8 f32 f32 f32", 7e-6}}, test_rates());
  const OpCall hit = call("matmul", "matmul NT m 8 n 8 k 8 f32 f32 f32", 1024, 768);
  const OpCall miss = call("matmul", "matmul NT m 16 n 8 k 8 f32 f32 f32", 2e9, 1e6);
  const TableCostModel::Lookup a = m.lookup(hit);
  EXPECT_TRUE(a.from_table);
  EXPECT_DOUBLE_EQ(a.seconds, 7e-6);  // the table's, not the analytic 2 us + 7.68 ns
  const TableCostModel::Lookup b = m.lookup(miss);
  EXPECT_FALSE(b.from_table);
  EXPECT_DOUBLE_EQ(b.seconds, 2e-6 + 2e-3);
  EXPECT_DOUBLE_EQ(m.seconds(miss), 2e-6 + 2e-3);
  EXPECT_EQ(m.hits(), 1);
  EXPECT_EQ(m.hit().at(hit.key), 1);
  EXPECT_EQ(m.misses(), 2);
  const auto missed = m.missed();
  ASSERT_EQ(missed.size(), 1u);
  EXPECT_EQ(missed.at(miss.key).calls, 2);
  EXPECT_DOUBLE_EQ(missed.at(miss.key).seconds_per_call, 2e-6 + 2e-3);
  const_cast<TableCostModel&>(m).reset_counts();
  EXPECT_EQ(m.hits(), 0);
  EXPECT_EQ(m.misses(), 0);
}

TEST(OpCost, BuiltInRates) {
  const DeviceRates h200 = device_rates("h200"), h100 = device_rates("h100-sxm");
  EXPECT_EQ(h200.name, "h200");
  EXPECT_DOUBLE_EQ(h200.matmul_flops_per_s, 806.06e12);
  EXPECT_DOUBLE_EQ(h200.memory_bytes_per_s, 4.232e12);
  EXPECT_DOUBLE_EQ(h200.attention_forward_flops_per_s, 627.2e12);
  EXPECT_DOUBLE_EQ(h200.attention_backward_flops_per_s, 426.56e12);  // 533.2 counted at 2.5x, at 2x
  EXPECT_DOUBLE_EQ(h200.kernel_overhead_s, 4e-6);
  EXPECT_EQ(h100.name, "h100-sxm");
  EXPECT_DOUBLE_EQ(h100.matmul_flops_per_s, h200.matmul_flops_per_s);
  EXPECT_DOUBLE_EQ(h100.attention_forward_flops_per_s, h200.attention_forward_flops_per_s);
  EXPECT_DOUBLE_EQ(h100.attention_backward_flops_per_s, h200.attention_backward_flops_per_s);
  EXPECT_DOUBLE_EQ(h100.memory_bytes_per_s, 4.232e12 * 3.35 / 4.8);
  EXPECT_NEAR(h200.update_bytes_per_s, 4.015e12, 0.001e12);  // the seed's fused AdamW in the step, 1.2515 ms
  EXPECT_DOUBLE_EQ(h100.update_bytes_per_s, h200.update_bytes_per_s * 3.35 / 4.8);
  EXPECT_EQ(device_rates_names(), (std::vector<std::string>{"h100-sxm", "h200"}));
  try {
    device_rates("a100");
    ADD_FAILURE() << "no error for an unknown device";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "device rates 'a100': expected one of h100-sxm, h200");
  }
}

TEST(OpCost, BadRatesAndTablesAreConfigErrors) {
  DeviceRates r = test_rates();
  r.memory_bytes_per_s = 0;
  try {
    TableCostModel m({}, r);
    ADD_FAILURE() << "no error for a zero bandwidth";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "device rates 'test': memory_bytes_per_s = 0: expected a positive number");
  }
  r = test_rates();
  r.kernel_overhead_s = -1;
  EXPECT_THROW(TableCostModel({}, r), ConfigError);
  EXPECT_THROW(TableCostModel({{"k", -1.0}}, test_rates()), ConfigError);
}

}  // namespace
}  // namespace shardtrain::ops
