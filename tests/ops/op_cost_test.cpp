// Op costs: the analytic estimate's arithmetic per kind of op, the table model's hits and misses, the built-in
// device rates, and bad rates.
#include <gtest/gtest.h>

#include <string>

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
