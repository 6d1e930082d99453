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
  for (const ops::OpTimes::Summary& k : times.summary()) {
    const bool flops = k.call.flops > 0;
    const double work = flops ? k.call.flops : k.call.bytes;
    if (!(work > 0)) {
      without_work.push_back(k.call.key);
      continue;
    }
    const double seconds = std::max(k.seconds, 1e-9);  // the loader takes positive times only; no call is faster
    const double ceiling = flops ? s.matmul_flops_per_s : s.copy_bytes_per_s;
    const int64_t per_microbatch =
        std::max<int64_t>(1, std::llround(k.calls_per_period / static_cast<double>(std::max(1, s.accumulation))));
    per_step += seconds * k.calls_per_period;
    rows.push_back({{"op", k.call.key},
                    {"shapes", k.call.shape},
                    {"kind", flops ? "flops" : "bytes"},
                    {"work", work},
                    {"seconds", seconds},
                    {"seconds_mean", k.seconds_mean},
                    {"cpu_seconds", k.cpu_seconds},
                    {"rate", work / seconds},
                    {"fraction_of_ceiling", ceiling > 0 ? work / seconds / ceiling : 0.0},
                    {"calls_per_microbatch", per_microbatch},
                    {"calls_per_step", k.calls_per_period},
                    {"calls", nlohmann::ordered_json::array(
                                  {{{"key", k.call.key}, {"flops", k.call.flops}, {"bytes", k.call.bytes}}})}});
  }
  j["rows"] = rows;
  j["keys_without_work"] = without_work;
  j["op_seconds_per_step"] = per_step;
  j["op_seconds_per_step_by_rank"] = s.op_seconds_per_step_by_rank;
  return j.dump(2) + "\n";
}

}  // namespace shardtrain::cli
