// A profile of op times (`shardtrain bench ops --json`) read as a table: op call key (ops/op_calls.hpp) -> measured
// seconds per call, with what it was measured on. `shardtrain predict` prices op calls with it (ops::TableCostModel).
//
// A row's keys are the calls its timed function made ("calls", written since the keys existed). An older profile has
// none: its rows are matched by op name to today's `bench ops` rows, recorded at the profile's model, micro-batch,
// dtype and backend; a row whose name or shapes today's rows lack (a row that has changed) gives no keys. A row whose
// function makes several calls has its seconds split among them in proportion to their analytic times (at the
// profile's rates). Where rows share a key, the rows the model's step runs decide it (the mean of their seconds);
// rows for the record only (calls_per_microbatch 0: other kernels of the same call) count only for keys no step row
// has.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "shardtrain/ops/op_cost.hpp"

namespace shardtrain::cli {

struct OpTimeTable {
  std::string path;
  std::string device;   // as the profile names it: "cuda:0 (NVIDIA H200, 139.8 GiB)"
  std::string backend;  // "cuda" | "cpu"
  std::string dtype;    // "bf16" | "f32"
  // What was measured: the model, micro-batch, sequence length and dtype ("layers 12, hidden 768, heads 12/3,
  // intermediate 3072, vocab 50000; batch 64 x seq 512, bf16");
  // "" when the file lacks them. Two profiles of one shape time the same calls (predict refuses the pair).
  std::string shape;
  // "bench ops" (each op timed alone; several processes at once share the cores inside each op's time) or
  // "bench step" (each op timed inside a real step: ranks that share cores take turns between ops, at collectives,
  // so the sharing is not in the ops' times).
  std::string source = "bench ops";
  double matmul_flops_per_s = 0;  // the profile's ceilings
  double copy_bytes_per_s = 0;
  std::map<std::string, double> seconds;  // seconds per call, by key
  // `bench step` profiles: the calling thread's CPU seconds per call, by key (with one thread a rank, the op's work
  // without the time other processes held the core)
  std::map<std::string, double> cpu_seconds;
  std::map<std::string, std::string> row_of;   // the row each key's seconds came from, by key
  bool keys_reconstructed = false;             // no "calls" in the file: keys recorded from today's rows
  std::vector<std::string> rows_without_keys;  // "rope q: not a row of today's bench ops", ...
  // The analytic fallback at the profile's own rates: the ceilings; attention from its "attention fwd" and
  // "attention bwd" rows (the matmul ceiling without them); the kernel overhead from its "copy" row (what the copy
  // took beyond the copy ceiling's time; 0 without one).
  ops::DeviceRates rates;
  // Memory-bound ops (no FLOPs) by name: the median over the step's calls of measured / analytic seconds at the
  // profile's rates. How far each kernel falls short of the copy ceiling, carried to shapes the profile lacks
  // (ops::TableCostModel::set_memory_bound_scale).
  std::map<std::string, double> memory_bound_scale;
  // Every GEMM key of the step's rows with its measured / analytic seconds at the profile's rates: how far that GEMM
  // fell short of the ceiling, carried to GEMMs of nearby shapes the profile lacks (ops::TableCostModel::set_gemm_points).
  std::vector<ops::GemmPoint> gemm_points;
  // The keys whose calls do no FLOPs: their measured time follows the memory bandwidth of the device measured on.
  std::set<std::string> memory_bound_keys;
};

// ConfigError naming the file (and the field, and what was expected) for a missing file, bad JSON or a bad field.
OpTimeTable load_op_profile(const std::string& path);

}  // namespace shardtrain::cli
