// step_op_profile_json (step_profile.hpp): ops::OpTimes as `bench ops --json` rows, one per key.
#include "step_profile.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace shardtrain::cli {

double op_seconds_per_step(const ops::OpTimes& times) {
  double sum = 0;
  for (const ops::OpTimes::Summary& k : times.summary()) sum += k.seconds * k.calls_per_period;
  return sum;
}

std::string step_op_profile_json(const ops::OpTimes& times, const StepProfileSource& s) {
  nlohmann::ordered_json j;
  j["device"] = s.device;
  j["backend"] = "cpu";
  j["threads"] = s.threads;
  j["machine_cores"] = s.machine_cores;
  j["dtype"] = dtype_name(s.dtype);
  j["source"] = "bench step";
  j["seconds_per_call"] = "median over the timed steps of each step's mean per call (rank 0)";
  j["ranks"] = s.ranks;
  j["accumulation_steps"] = s.accumulation;
  j["steps"] = s.steps;
  j["warmup"] = s.warmup;
  j["step_time_median_s"] = s.step_time_s;
  j["model"] = model_json(s.shape);
  j["batch"] = s.shape.batch;
  j["seq"] = s.shape.seq;
  j["tokens"] = s.shape.batch * s.shape.seq;
  j["ceilings"] = {{"matmul_flops_per_s", s.matmul_flops_per_s},
                   {"matmul_n", s.matmul_n},
                   {"copy_bytes_per_s", s.copy_bytes_per_s},
                   {"copy_bytes", s.copy_bytes}};

  nlohmann::ordered_json rows = nlohmann::ordered_json::array(), without_work = nlohmann::ordered_json::array();
  double per_step = 0;
  // As bench ops: FLOP rows are a fraction of a ceiling, the matmul's or the fastest FLOP row where one outran it (so
  // at most 1); byte rows a ratio to the main-memory copy, no ceiling (in cache they run faster: 3.4x was printed as a
  // "fraction_of_ceiling").
  double flops_ceiling = s.matmul_flops_per_s;
  for (const ops::OpTimes::Summary& k : times.summary())
    if (k.call.flops > 0) flops_ceiling = std::max(flops_ceiling, k.call.flops / std::max(k.seconds, 1e-9));
  j["ceilings"]["flops_ceiling"] = flops_ceiling;
  for (const ops::OpTimes::Summary& k : times.summary()) {
    const bool flops = k.call.flops > 0;
    const double work = flops ? k.call.flops : k.call.bytes;
    if (!(work > 0)) {
      without_work.push_back(k.call.key);
      continue;
    }
    const double seconds = std::max(k.seconds, 1e-9);  // the loader takes positive times only; no call is faster
    const int64_t per_microbatch =
        std::max<int64_t>(1, std::llround(k.calls_per_period / static_cast<double>(std::max(1, s.accumulation))));
    per_step += seconds * k.calls_per_period;
    nlohmann::ordered_json row = {{"op", k.call.key},
                                  {"shapes", k.call.shape},
                                  {"kind", flops ? "flops" : "bytes"},
                                  {"work", work},
                                  {"seconds", seconds},
                                  {"seconds_mean", k.seconds_mean},
                                  {"cpu_seconds", k.cpu_seconds},
                                  {"rate", work / seconds}};
    if (flops) row["fraction_of_ceiling"] = flops_ceiling > 0 ? work / seconds / flops_ceiling : 0.0;
    else row["ratio_to_copy"] = s.copy_bytes_per_s > 0 ? work / seconds / s.copy_bytes_per_s : 0.0;
    row["calls_per_microbatch"] = per_microbatch;
    row["calls_per_step"] = k.calls_per_period;
    row["calls"] = nlohmann::ordered_json::array({{{"key", k.call.key}, {"flops", k.call.flops}, {"bytes", k.call.bytes}}});
    rows.push_back(row);
  }
  j["rows"] = rows;
  j["keys_without_work"] = without_work;
  j["op_seconds_per_step"] = per_step;
  j["op_seconds_per_step_by_rank"] = s.op_seconds_per_step_by_rank;
  return j.dump(2) + "\n";
}

}  // namespace shardtrain::cli
