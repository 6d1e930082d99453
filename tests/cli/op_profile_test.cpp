// load_op_profile: the checked-in H200 profile (no "calls": keyed through today's rows), a profile with "calls" (a row
// of several calls split by analytic time), and bad files (each error names the file and what was expected).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardtrain/runtime/error.hpp"
#include "src/cli/op_profile.hpp"

namespace shardtrain::cli {
namespace {

const std::string kH200 = std::string(SHARDTRAIN_SOURCE_DIR) + "/profiles/h200/seed-b64-s512.json";

bool contains(const std::vector<std::string>& v, const std::string& prefix) {
  for (const std::string& s : v)
    if (s.rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(OpProfile, H200SeedProfileMapsKeysToRowMedians) {
  const OpTimeTable t = load_op_profile(kH200);
  EXPECT_EQ(t.device, "cuda:0 (NVIDIA H200, 139.8 GiB)");
  EXPECT_EQ(t.backend, "cuda");
  EXPECT_EQ(t.dtype, "bf16");
  EXPECT_TRUE(t.keys_reconstructed);
  EXPECT_DOUBLE_EQ(t.matmul_flops_per_s, 801159748732350.4);
  EXPECT_DOUBLE_EQ(t.copy_bytes_per_s, 4260339059929.9385);
  // o_proj's forward: x (32768, 768) W^T (768, 768), the file's median.
  const std::string o_proj = "matmul NT m 32768 n 768 k 768 bf16 bf16 bf16";
  ASSERT_TRUE(t.seconds.count(o_proj));
  EXPECT_DOUBLE_EQ(t.seconds.at(o_proj), 5.9407999739050865e-05);
  EXPECT_EQ(t.row_of.at(o_proj), "o_proj fwd");
  EXPECT_DOUBLE_EQ(t.seconds.at("matmul TN m 768 n 768 k 32768 bf16 bf16 f32 +="), 6.235199980437755e-05);
  // Attention: the step's row, not the FMA kernels' row of the same call (calls_per_microbatch 0).
  const std::string attention =
      "attention_forward B 64 S 512 H 12 Hkv 3 Dh 64 bf16[25165824] bf16[6291456] bf16[6291456] bf16[25165824] "
      "f32[393216]";
  ASSERT_TRUE(t.seconds.count(attention));
  EXPECT_DOUBLE_EQ(t.seconds.at(attention), 0.0002546560019254685);
  EXPECT_EQ(t.row_of.at(attention), "attention fwd");
  EXPECT_DOUBLE_EQ(t.seconds.at("rmsnorm_backward bf16[25165824] bf16[25165824] bf16[768] f32[32768] bf16[25165824] "
                                "bf16[25165824] f32[768]"),
                   8.179199695587158e-05);
  EXPECT_DOUBLE_EQ(t.seconds.at("linear_cross_entropy bf16[25165824] bf16[38400000] i32[32768] chunk 0 bf16[25165824] "
                                "f32[38400000]"),
                   0.01500830364227295);
  // Rows today's bench does not have, or has changed, give no keys.
  EXPECT_TRUE(contains(t.rows_without_keys, "q_proj fwd: not a row of today's bench ops"));
  EXPECT_TRUE(contains(t.rows_without_keys, "rope k: not a row of today's bench ops"));
  EXPECT_TRUE(contains(t.rows_without_keys, "swiglu fwd: shapes '(32768, 3072)' in the file"));
  EXPECT_TRUE(contains(t.rows_without_keys, "down_proj fwd: shapes"));
  // Rates at the profile's own: the ceilings, attention from its rows, the overhead from its copy row.
  EXPECT_DOUBLE_EQ(t.rates.matmul_flops_per_s, 801159748732350.4);
  EXPECT_DOUBLE_EQ(t.rates.memory_bytes_per_s, 4260339059929.9385);
  EXPECT_DOUBLE_EQ(t.rates.attention_forward_flops_per_s, 25769803776.0 / 0.0002546560019254685);
  EXPECT_DOUBLE_EQ(t.rates.attention_backward_flops_per_s, 51539607552.0 / 0.0007273760139942169);
  EXPECT_DOUBLE_EQ(t.rates.kernel_overhead_s, 2.768000029027462e-05 - 100663296.0 / 4260339059929.9385);
}

const ops::GemmPoint* point_from(const OpTimeTable& t, const std::string& from) {
  for (const ops::GemmPoint& p : t.gemm_points)
    if (p.key == from) return &p;
  return nullptr;
}

// Every GEMM the profile measured is a point: the keyed rows by their keys, the rows today's bench no longer has
// (q, k/v and gate/up apart, down_proj without its residual) by their shapes, with the form of today's row of the
// same pass. Each point's scale is its measured seconds over the analytic seconds at the profile's rates.
TEST(OpProfile, H200SeedProfileGivesAGemmPointPerMeasuredGemm) {
  const OpTimeTable t = load_op_profile(kH200);
  EXPECT_EQ(t.gemm_points.size(), 15u);  // q, k/v, o, gate/up: 3 each; down_proj: fwd (shapes), dx and dW (keys)
  auto analytic = [&](double flops, double bytes) {
    ops::OpCall c{"matmul", "", "", flops, bytes};
    return ops::analytic_seconds(c, t.rates);
  };
  const ops::GemmPoint* gate_up_dw = point_from(t, "gate_proj, up_proj bwd dW: dy^T (3072, 32768) x (32768, 768) += f32");
  ASSERT_NE(gate_up_dw, nullptr);
  EXPECT_EQ(gate_up_dw->gemm.form, "TN bf16 bf16 f32");
  EXPECT_EQ((std::vector<int64_t>{gate_up_dw->gemm.m, gate_up_dw->gemm.n, gate_up_dw->gemm.k}),
            (std::vector<int64_t>{3072, 768, 32768}));
  // a: dy (32768, 3072) bf16, b: x (32768, 768) bf16, c: dW (3072, 768) f32 read and written
  const double dw_bytes = 32768.0 * 3072 * 2 + 32768.0 * 768 * 2 + 3072.0 * 768 * 4 * 2;
  EXPECT_DOUBLE_EQ(gate_up_dw->scale, 0.00020060800015926362 / analytic(154618822656.0, dw_bytes));
  const ops::GemmPoint* kv_dx = point_from(t, "k_proj, v_proj bwd dx: dy (32768, 192) W (192, 768)");
  ASSERT_NE(kv_dx, nullptr);
  EXPECT_EQ(kv_dx->gemm.form, "NN bf16 bf16 bf16");
  EXPECT_EQ((std::vector<int64_t>{kv_dx->gemm.m, kv_dx->gemm.n, kv_dx->gemm.k}), (std::vector<int64_t>{32768, 768, 192}));
  // memory-bound at the profile's rates (dy, W and dx: 63 MB), yet 1.4x that: at 45 % of the GEMM ceiling
  const double kv_dx_bytes = 32768.0 * 192 * 2 + 192.0 * 768 * 2 + 32768.0 * 768 * 2;
  EXPECT_DOUBLE_EQ(kv_dx->scale, 2.6544000022113325e-05 / analytic(9663676416.0, kv_dx_bytes));
  EXPECT_GT(kv_dx->scale, 1.4);
  const std::string o_proj = "matmul NT m 32768 n 768 k 768 bf16 bf16 bf16";
  const ops::GemmPoint* keyed = point_from(t, o_proj);
  ASSERT_NE(keyed, nullptr);
  EXPECT_EQ(keyed->gemm.form, "NT bf16 bf16 bf16");
  const double o_bytes = 32768.0 * 768 * 2 * 2 + 768.0 * 768 * 2;
  EXPECT_DOUBLE_EQ(keyed->scale, t.seconds.at(o_proj) / analytic(38654705664.0, o_bytes));
  ASSERT_NE(point_from(t, "down_proj fwd: x (32768, 3072) W^T (768, 3072)"), nullptr);
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             ("op_profile_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".json"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::string profile_with_rows(const std::string& rows) {
  return R"({"device": "cpu", "backend": "cpu", "threads": 2, "dtype": "f32",
  "model": {"layers": 1, "hidden": 8, "heads": 2, "kv_heads": 1, "head_dim": 4, "intermediate": 16, "vocab": 32},
  "batch": 1, "seq": 4, "tokens": 4,
  "ceilings": {"matmul_flops_per_s": 1e9, "copy_bytes_per_s": 1e8},
  "rows": [)" +
         rows + "]}";
}

// A row of three calls: its seconds split by their analytic times at the profile's rates (matmul 1 GFLOP/s, memory
// 100 MB/s, overhead from the copy row: 30 us - 2000 B / 100 MB/s = 10 us).
TEST(OpProfile, RowOfSeveralCallsSplitByAnalyticTime) {
  const TempFile f(profile_with_rows(R"(
    {"op": "copy", "shapes": "-", "kind": "bytes", "work": 2000, "seconds": 3e-5, "calls_per_microbatch": 0,
     "calls": [{"key": "copy f32[250] f32[250]", "flops": 0, "bytes": 2000}]},
    {"op": "pair", "shapes": "-", "kind": "flops", "work": 3e6, "seconds": 1e-3, "calls_per_microbatch": 2,
     "calls": [{"key": "a", "flops": 1e6, "bytes": 0}, {"key": "b", "flops": 2e6, "bytes": 0},
               {"key": "b", "flops": 2e6, "bytes": 0}]},
    {"op": "other b", "shapes": "-", "kind": "flops", "work": 2e6, "seconds": 5e-3, "calls_per_microbatch": 0,
     "calls": [{"key": "b", "flops": 2e6, "bytes": 0}]}
  )"));
  const OpTimeTable t = load_op_profile(f.path());
  EXPECT_FALSE(t.keys_reconstructed);
  EXPECT_DOUBLE_EQ(t.rates.kernel_overhead_s, 1e-5);
  // analytic: a 10 us + 1 ms, b 10 us + 2 ms (twice): a's share 1.01 / 5.03 of 1 ms, b's 2.01 / 5.03 per call.
  EXPECT_DOUBLE_EQ(t.seconds.at("a"), 1e-3 * 1.01e-3 / 5.03e-3);
  EXPECT_DOUBLE_EQ(t.seconds.at("b"), 1e-3 * 2.01e-3 / 5.03e-3);  // the step's row, not "other b"
  EXPECT_EQ(t.row_of.at("b"), "pair");
  EXPECT_DOUBLE_EQ(t.seconds.at("copy f32[250] f32[250]"), 3e-5);
  EXPECT_TRUE(t.rows_without_keys.empty());
}

void expect_config_error(const std::string& text, const std::string& what) {
  const TempFile f(text);
  try {
    load_op_profile(f.path());
    ADD_FAILURE() << "no error for: " << what;
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(f.path()), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

TEST(OpProfile, BadFilesNameTheFileAndWhatWasExpected) {
  try {
    load_op_profile("/nonexistent/ops.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/ops.json: cannot open for reading"), std::string::npos) << e.what();
  }
  expect_config_error("{\"rows\": [", "not valid JSON");
  expect_config_error("[1, 2]", "expected a JSON object");
  expect_config_error(R"({"device": "x", "backend": "tpu", "dtype": "bf16"})", "backend: expected \"cuda\" or \"cpu\"");
  expect_config_error(R"({"device": "x", "backend": "cpu", "dtype": "f32", "ceilings": {"copy_bytes_per_s": 1}})",
                      "ceilings.matmul_flops_per_s: expected a number (missing)");
  expect_config_error(profile_with_rows(R"({"op": "x", "shapes": "-", "work": 1, "seconds": -1,
                                            "calls_per_microbatch": 1, "calls": [{"key": "x", "flops": 1, "bytes": 0}]})"),
                      "rows[0].seconds: expected a positive number");
  expect_config_error(profile_with_rows(R"({"op": "x", "shapes": "-", "work": 1, "seconds": 1,
                                            "calls_per_microbatch": 1, "calls": [{"flops": 1, "bytes": 0}]})"),
                      "rows[0].calls[0].key: expected a string (missing)");
  // Without "calls": the model is needed to key the rows.
  expect_config_error(R"({"device": "x", "backend": "cpu", "dtype": "f32",
                          "ceilings": {"matmul_flops_per_s": 1, "copy_bytes_per_s": 1},
                          "rows": [{"op": "copy", "shapes": "-", "work": 1, "seconds": 1, "calls_per_microbatch": 0}]})",
                      "model: expected an object (missing)");
}

}  // namespace
}  // namespace shardtrain::cli
