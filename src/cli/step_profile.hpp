// The op times of real training steps (ops::OpTimes, from `bench step --ops-profile`) as a profile in the
// `bench ops --json` format that load_op_profile (op_profile.hpp) reads, so that `shardtrain predict` prices each call
// at what it took inside the step rather than timed alone: one row per op call key, with that one call as the row's
// "calls", its seconds per call, and how often a step made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "op_rows.hpp"
#include "shardtrain/ops/timed_ops.hpp"

namespace shardtrain::cli {

struct StepProfileSource {
  std::string device;  // as `bench ops` names it: the runtime device's describe()
  int threads = 0;     // the rank's CPU backend threads
  // The machine's cores (hardware_concurrency): with ranks x threads above them the ranks took turns on the cores,
  // and each op's time is its time while its rank ran.
  int machine_cores = 0;
  DType dtype = DType::F32;
  BenchShape shape;  // the model, the micro-batch (shape.batch) and seq
  int ranks = 1, accumulation = 1, steps = 0, warmup = 0;
  double step_time_s = 0;  // the timed steps' median
  // The ceilings, measured as `bench ops` measures them.
  double matmul_flops_per_s = 0, copy_bytes_per_s = 0;
  int64_t matmul_n = 0;
  size_t copy_bytes = 0;
  std::vector<double> op_seconds_per_step_by_rank;  // every rank's op_seconds_per_step, for the record (may be empty)
};

// The ops' time in a step: each key's seconds per call x calls per step, summed.
double op_seconds_per_step(const ops::OpTimes& times);

// The profile's JSON text. Each row's "seconds" is OpTimes::Summary::seconds (per call: the median over the timed
// steps of each step's mean), "calls_per_step" the calls per step, and "calls_per_microbatch" those over the
// accumulation steps, rounded, at least 1 (every row is a call the step makes). Keys whose call has no work (no FLOPs
// and no bytes: nothing to price) are left out and listed under "keys_without_work". "op_seconds_per_step" is rank 0's
// op_seconds_per_step; "op_seconds_per_step_by_rank" every rank's.
std::string step_op_profile_json(const ops::OpTimes& times, const StepProfileSource& source);

}  // namespace shardtrain::cli
