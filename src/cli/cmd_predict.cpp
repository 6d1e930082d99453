// `shardtrain predict`: the step time, tokens/s per GPU, MFU, peak memory and exposed communication of a training
// config on N nodes x G GPUs, by running the real step against a timing device (train/predict.hpp,
// docs/predict.md). Offline: no MPI, no GPU. Op times come from a `bench ops` profile where it has the call, and
// from the device's rates otherwise; links from a preset or a `bench comm` measurement.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <omp.h>
#include <memory>
#include <string>
#include <string_view>

#include "../data/thread_pool.hpp"
#include "command.hpp"
#include "config_args.hpp"
#include "op_profile.hpp"
#include "shardtrain/ops/op_cost.hpp"
#include "shardtrain/ops/peak_spec.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "shardtrain/train/predict.hpp"

namespace shardtrain::cli {
namespace {

struct PredictOptions {
  ConfigArgs args;
  int nodes = 1;
  int gpus_per_node = 8;
  std::string gpu = "h100";  // h100 | h200 | cpu
  std::vector<std::string> ops_profiles;
  std::vector<std::string> profile_excludes;  // ops whose profile rows are stale (their kernels changed since)
  std::string links = "h100-dgx";             // a preset, or a `bench comm --json` file
  bool links_given = false;                   // --links on the command line (else the preset, said so for CPU ranks)
  int steps = 3;
  int cpu_threads = 0;  // --gpu cpu: host threads per rank, 1 to data::kMaxThreads (0: not given: the cores over the
                        // ranks of a node, at least 1)
  std::string json, trace;
};

struct GpuChoice {
  std::string rates;        // ops::device_rates preset
  std::string device_name;  // as CUDA names it: the datasheet peak's key
  double memory_bytes = 0;  // what CUDA reports as the device's total memory
};
GpuChoice gpu_choice(const std::string& gpu) {
  if (gpu == "h100") return {"h100-sxm", "NVIDIA H100 80GB HBM3", 79.1 * (1ull << 30)};
  if (gpu == "h200") return {"h200", "NVIDIA H200", 139.8 * (1ull << 30)};
  if (gpu == "cpu") return {"", "", 0};
  throw UsageError(fmt::format("--gpu {}: expected h100, h200 or cpu", gpu));
}

// `bench comm --json`: {"axes": {"world"|"shard"|"replicate": {"all_gather": {"latency_s", "busbw_bytes_per_s"}, ...}},
// "ranks": N, "ranks_per_node": R}. The measurement holds for that many ranks only.
struct MeasuredLinks {
  std::string path;
  int ranks = 0, ranks_per_node = 0;
  nlohmann::json axes, axis_ranks;
};
// Every fit the file holds, whether or not this prediction uses it: a bandwidth of 0 or below, or a negative
// latency, is no measurement (bench comm writes neither) and priced collectives at negative or NaN times; nor is one
// outside what any link does (1e-300 B/s printed a step of inf ms, a latency of 1e300 s a 300-digit step). The bounds
// are wide: 1 KB/s is below any network, 100 TB/s above any GPU's; no collective waits a second before its bytes.
constexpr double kMinBusbw = 1e3, kMaxBusbw = 1e14, kMaxLatency = 1.0;
void check_link_figures(const MeasuredLinks& m) {
  auto fail = [&](const std::string& field, const std::string& expected, const nlohmann::json& v) {
    throw ConfigError(
        fmt::format("--links {}: {}: expected {}, not {} (a `bench comm --json` file)", m.path, field, expected, v.dump()));
  };
  if (!m.axes.is_object()) fail("axes", "an object", m.axes);
  for (const auto& [axis, kinds] : m.axes.items()) {
    if (!kinds.is_object()) fail(fmt::format("axes.{}", axis), "an object", kinds);
    for (const auto& [kind, fit] : kinds.items()) {
      const std::string at = fmt::format("axes.{}.{}", axis, kind);
      if (!fit.is_object()) fail(at, "an object", fit);
      const nlohmann::json latency = fit.value("latency_s", nlohmann::json()),
                           busbw = fit.value("busbw_bytes_per_s", nlohmann::json());
      if (!latency.is_number() || !(latency.get<double>() >= 0 && latency.get<double>() <= kMaxLatency))
        fail(at + ".latency_s", fmt::format("a latency from 0 to {:g} s", kMaxLatency), latency);
      // host_all_reduce is measured at one size: no bandwidth (null).
      if (busbw.is_null() && kind == "host_all_reduce") continue;
      if (!busbw.is_number() || !(busbw.get<double>() >= kMinBusbw && busbw.get<double>() <= kMaxBusbw))
        fail(at + ".busbw_bytes_per_s", fmt::format("a bus bandwidth from {:g} to {:g} bytes/s", kMinBusbw, kMaxBusbw),
             busbw);
    }
  }
}
MeasuredLinks load_links(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(
        fmt::format("--links {}: cannot be read (expected a preset, h100-dgx, or a `bench comm --json` file)", path));
  MeasuredLinks m;
  m.path = path;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    m.ranks = j.at("ranks").get<int>();
    m.ranks_per_node = j.at("ranks_per_node").get<int>();
    m.axes = j.at("axes");
    m.axis_ranks = j.at("axis_ranks");
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("--links {}: not a `bench comm --json` file ({})", path, e.what()));
  }
  check_link_figures(m);
  return m;
}
CollectiveCost measured_cost(const MeasuredLinks& m, const std::string& axis, const char* kind) {
  try {
    const nlohmann::json& k = m.axes.at(axis).at(kind);
    const nlohmann::json& busbw = k.at("busbw_bytes_per_s");
    // host_all_reduce is measured at one size (a few doubles): its latency is all there is to it.
    if (busbw.is_null() && std::string_view(kind) == "host_all_reduce") return {k.at("latency_s").get<double>(), 1e12};
    return {k.at("latency_s").get<double>(), busbw.get<double>()};
  } catch (const nlohmann::json::exception&) {
    throw ConfigError(fmt::format("--links {}: no measured {} on the {} axis (run `bench comm` with this config's strategy)",
                                  m.path, kind, axis));
  }
}

// Below this many tokens a second a rank (a token every ~17 minutes) a step is no prediction: a 400B model's token on
// one slow core takes minutes, not hours.
constexpr double kMinTokensPerS = 1e-3;

std::string ms(double s) { return fmt::format("{:.2f} ms", s * 1e3); }

// The largest idle time among the causes a group stands for ("model.layers.* all_gather shard").
double max_of(const std::vector<train::IdleCause>& idle, const std::string& group) {
  const size_t star = group.find('*');
  double most = 0;
  for (const train::IdleCause& c : idle) {
    if (c.what.compare(0, star, group, 0, star) != 0) continue;
    const size_t end = c.what.find_first_not_of("0123456789", star);
    if (end != std::string::npos && c.what.substr(end) == group.substr(star + 1)) most = std::max(most, c.seconds);
  }
  return most;
}

// The built-in rates (ops::device_rates) of the GPU a profile was measured on, from its device's name; empty when
// none matches.
std::string rates_of_device(const std::string& device) {
  if (device.find("H200") != std::string::npos) return "h200";
  if (device.find("H100") != std::string::npos) return "h100-sxm";
  return "";
}

// How each kind of work's calls were priced, over every step run (by the key's first word: the op's name).
struct Priced {
  int64_t profile = 0, nearest_gemm = 0, rates = 0;
};
std::map<std::string, Priced> priced_by_op(const ops::TableCostModel& costs) {
  std::map<std::string, Priced> by_op;
  auto op_of = [](const std::string& key) { return key.substr(0, key.find(' ')); };
  for (const auto& [key, calls] : costs.hit()) by_op[op_of(key)].profile += calls;
  for (const auto& [key, miss] : costs.missed())
    (miss.like.empty() ? by_op[op_of(key)].rates : by_op[op_of(key)].nearest_gemm) += miss.calls;
  return by_op;
}

std::string priced_from(const Priced& o, bool cpu) {
  const int64_t n = o.profile + o.nearest_gemm + o.rates;
  // AdamW, the gradient norm's sums, copies: no op call
  if (n == 0) return cpu ? "the host's own work, timed here" : "the update's memory rate (AdamW's, measured)";
  std::string s;
  for (auto [count, what] :
       {std::pair{o.profile, "profile"}, std::pair{o.nearest_gemm, "nearest GEMM"}, std::pair{o.rates, "rates"}})
    if (count > 0) s += fmt::format("{}{} {:.0f} %", s.empty() ? "" : ", ", what, 100.0 * count / n);
  return s;
}

void write_trace(const std::string& path, const train::Prediction& p) {
  nlohmann::json events = nlohmann::json::array();
  for (const timing::Task& t : p.tasks) {
    events.push_back({{"name", t.label},
                      {"cat", timing::work_kind_name(t.kind)},
                      {"ph", "X"},
                      {"ts", t.start * 1e6},
                      {"dur", (t.end - t.start) * 1e6},
                      {"pid", 0},
                      {"tid", t.stream < 0    ? std::string("host")
                              : t.stream == 0 ? std::string("compute")
                                              : fmt::format("stream {}", t.stream)}});
  }
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (!out) throw Error(ExitCode::Io, fmt::format("--trace {}: cannot be written", path));
}

int run_predict(const PredictOptions& o) {
  world_size_of(o.nodes, o.gpus_per_node);  // the timing device's ranks are ints
  std::vector<std::string> notes;
  std::string source;
  const train::TrainConfig config = o.args.resolve(notes, source);
  const GpuChoice choice = gpu_choice(o.gpu);
  const bool cpu = o.gpu == "cpu";
  // The host threads are the CPU backend's: a GPU's prediction never starts them, and the option was ignored.
  if (o.cpu_threads > 0 && !cpu)
    throw UsageError(
        fmt::format("--cpu-threads {}: only with --gpu cpu (the CPU backend's threads per rank); --gpu {} "
                    "predicts GPUs, whose ops the profiles price",
                    o.cpu_threads, o.gpu));

  // Op times: each profile's calls, then the rates.
  ops::DeviceRates rates;
  std::map<std::string, double> table, memory_bound_scale;
  std::vector<ops::GemmPoint> gemm_points;
  std::string profiles_described;
  bool timed_in_step = !o.ops_profiles.empty();  // every profile from `bench step --ops-profile`
  // The CPU backend: a rank's share of this machine, as its ranks get it (runtime.cpp: host_threads), and how many
  // times over the ranks' threads ask for the cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.cpu_threads > 0 ? o.cpu_threads : std::max(1, cores / o.gpus_per_node);
  const double contention = cpu ? core_oversubscription(o.gpus_per_node, threads, cores) : 1.0;
  std::set<std::string> profiled_ops;  // for --ops-profile-exclude: a name no row has is a typo that excludes nothing
  std::map<std::string, std::string> profile_of_shape;  // what each profile measured -> its file
  for (const std::string& path : o.ops_profiles) {
    const OpTimeTable profile = load_op_profile(path);
    // A profile prices the kind of device it was measured on: a GPU's kernels say nothing of the CPU backend's ops (the
    // H200 seed profile priced CPU ranks at a GPU's speed), nor the other way round.
    if ((profile.backend == "cpu") != cpu)
      throw ConfigError(
          fmt::format("--ops-profile {}: measured on {} (backend {}), but --gpu {} predicts {}: expected a profile of {}",
                      path, profile.device, profile.backend, o.gpu, cpu ? "CPU ranks" : "GPUs",
                      cpu ? "this machine's CPU backend (`bench ops --json` or `bench step --ops-profile` without a GPU)"
                          : "a GPU (`bench ops --json` on one; profiles/h200/)"));
    // Several profiles are for several shapes (a config's own beside the seed's); two of one shape time the same
    // calls twice, and which of them prices the step would be the order of the options.
    if (!profile.shape.empty()) {
      const auto [it, first] = profile_of_shape.emplace(profile.shape, path);
      if (!first)
        throw UsageError(fmt::format(
            "--ops-profile {} and --ops-profile {}: both measured {}: give one profile of a shape (they time the same "
            "calls)",
            it->second, path, profile.shape));
    }
    for (const auto& [key, seconds] : profile.seconds) profiled_ops.insert(key.substr(0, key.find(' ')));
    // Ranks that share the cores: a `bench step` profile's CPU time per call (each op's work, whatever else held
    // the core while it ran), priced below at the share (the wall time where a call has none).
    std::map<std::string, double> seconds_of = profile.seconds;
    if (contention > 1 && profile.source == "bench step")
      for (const auto& [key, cpu_s] : profile.cpu_seconds) seconds_of[key] = cpu_s;
    // Measured on another GPU than the one predicted: the same compute rates (the H100 and H200 are one chip, as
    // ops::device_rates takes them), memory-bound calls at the ratio of the two memories' bandwidths.
    const std::string measured_on = cpu ? "" : rates_of_device(profile.device);
    // A GPU predict has no rates for (an A100, a consumer card): its times are not an H100's or an H200's, and priced
    // as one without a word they made the prediction that GPU's, not the one asked for.
    if (!cpu && measured_on.empty())
      throw ConfigError(fmt::format(
          "--ops-profile {}: measured on {}, a GPU predict has no rates for (it knows the H100 and the H200): its times "
          "would price --gpu {} as that GPU; give a profile measured on an H100 or H200 (`bench ops --json` on one)",
          path, profile.device, o.gpu));
    const double memory_scale =
        measured_on.empty() || measured_on == choice.rates
            ? 1.0
            : ops::device_rates(measured_on).memory_bytes_per_s / ops::device_rates(choice.rates).memory_bytes_per_s;
    int64_t earlier = 0;  // call kinds an earlier profile (another shape's) also timed: the first given prices them
    for (const auto& [key, seconds] : seconds_of) {
      const std::string op = key.substr(0, key.find(' '));
      if (std::find(o.profile_excludes.begin(), o.profile_excludes.end(), op) == o.profile_excludes.end())
        earlier += table.emplace(key, seconds * (profile.memory_bound_keys.count(key) ? memory_scale : 1.0)).second ? 0 : 1;
    }
    profiles_described += fmt::format(
        "{}{} ({} call kinds, {}{}{})", profiles_described.empty() ? "" : "; ", path, profile.seconds.size(), profile.device,
        memory_scale == 1.0 ? std::string()
                            : fmt::format("; memory-bound calls x {:.3f} for {}'s bandwidth", memory_scale, choice.rates),
        earlier == 0 ? std::string() : fmt::format("; {} of them priced by an earlier --ops-profile, given first", earlier));
    memory_bound_scale.insert(profile.memory_bound_scale.begin(), profile.memory_bound_scale.end());
    for (const ops::GemmPoint& point : profile.gemm_points) {
      const std::string op = point.key.substr(0, point.key.find(' '));
      if (std::find(o.profile_excludes.begin(), o.profile_excludes.end(), op) == o.profile_excludes.end())
        gemm_points.push_back(point);
    }
    timed_in_step = timed_in_step && profile.source == "bench step";
    if (cpu && rates.name.empty()) rates = profile.rates;  // the CPU's rates are its profile's ceilings
  }
  for (const std::string& op : o.profile_excludes)
    if (!profiled_ops.count(op))
      throw UsageError(fmt::format("--ops-profile-exclude {}: no row of the profiles is that op (theirs: {})", op,
                                   fmt::join(profiled_ops, ", ")));
  if (!cpu) rates = ops::device_rates(choice.rates);
  if (cpu && rates.name.empty())
    throw UsageError("--gpu cpu needs --ops-profile (a `bench ops --json` of this machine's CPU backend)");
  ops::TableCostModel costs(table, rates);
  costs.set_memory_bound_scale(memory_bound_scale);
  costs.set_gemm_points(gemm_points);

  train::PredictSetup s;
  s.nodes = o.nodes;
  s.ranks_per_node = o.gpus_per_node;
  s.device = cpu ? DeviceKind::Cpu : DeviceKind::Cuda;
  s.device_name = choice.device_name;
  s.op_costs = &costs;
  s.steps = o.steps;
  if (rates.update_bytes_per_s > 0) s.host.memory_bytes_per_s = rates.update_bytes_per_s;
  // The CPU backend's host is its device: offloaded shards' host loops at its measured update rate too.
  if (cpu && rates.update_bytes_per_s > 0) s.host.host_memory_bytes_per_s = rates.update_bytes_per_s;
  if (cpu) {
    // OpenMP's threads, which the host work below starts: the system's refusal is a usage error naming the option, as
    // prepare-data's (libgomp ended the process: --cpu-threads 100000 was a segmentation fault).
    require_threads_start(threads, "--cpu-threads");
    omp_set_num_threads(threads);
    s.host_contention = contention;
    // Ops timed inside a step: their work (the thread's CPU time) at the rank's share of the cores.
    if (timed_in_step && contention > 1) costs.set_table_scale(contention);
  }
  // CPU ranks on the preset: NVLink and InfiniBand figures for what is MPI between processes, said beside the links.
  const bool cpu_on_preset = cpu && !o.links_given;
  if (o.links == "h100-dgx") {
    const LinkPreset preset = h100_dgx_links();
    s.links = [preset](MeshAxis, int ranks, int nodes) { return preset_group_links(preset, ranks, nodes); };
  } else {
    const MeasuredLinks m = load_links(o.links);
    if (m.ranks != o.nodes * o.gpus_per_node || m.ranks_per_node != o.gpus_per_node)
      throw UsageError(fmt::format("--links {}: measured on {} ranks, {} per node; this prediction is for {} x {}", o.links,
                                   m.ranks, m.ranks_per_node, o.nodes, o.gpus_per_node));
    s.links = [m](MeshAxis axis, int ranks, int) {
      // The measured axis of this group's size: the same axis when its size matches (FULL_SHARD's shard axis is
      // HYBRID_SHARD's world on the same machine), else any axis of that size.
      std::string name = mesh_axis_name(axis);
      auto size_of = [&](const std::string& a) { return m.axis_ranks.value(a, 0); };
      if (size_of(name) != ranks)
        for (const char* a : {"world", "shard", "replicate"})
          if (size_of(a) == ranks) name = a;
      GroupLinks g;
      if (ranks > 1) {
        if (size_of(name) != ranks)
          throw UsageError(
              fmt::format("--links {}: no axis of {} ranks measured (has {})", m.path, ranks, m.axis_ranks.dump()));
        g.all_gather = measured_cost(m, name, "all_gather");
        g.reduce_scatter = measured_cost(m, name, "reduce_scatter");
        g.all_reduce = measured_cost(m, name, "all_reduce");
      }
      g.host = measured_cost(m, "world", "host_all_reduce");
      g.source = fmt::format("measured ({} {})", m.path, name);
      return g;
    };
  }

  const train::Prediction p = train::predict_step(config, s);
  // What the inputs were, for an error that refuses the result they gave.
  const std::string inputs =
      fmt::format("{}; --links {}",
                  o.ops_profiles.empty() ? std::string("the built-in rates")
                                         : "--ops-profile " + fmt::format("{}", fmt::join(o.ops_profiles, ", ")),
                  o.links);
  // A step of inf or NaN, or one so long that no token a second is left to print (a profile of 1e300 s a call), is no
  // prediction: the op times or links that made it are no device's.
  if (!std::isfinite(p.step_s) || !(p.step_s > 0) || !std::isfinite(p.tokens_per_s_per_rank) ||
      !(p.tokens_per_s_per_rank >= kMinTokensPerS))
    throw ConfigError(fmt::format(
        "{}: the predicted step is {} s ({} tokens/s a rank, below {:g}): the op times or links are no device's (a "
        "corrupt profile or links file)",
        inputs, p.step_s, p.tokens_per_s_per_rank, kMinTokensPerS));
  // Above the device's peak no step runs: the op times that made it are not this device's, whatever the report would
  // print (it printed 100.0 % beside tokens/s of 400 %). A GPU: its datasheet's dense bf16 peak. CPU ranks: the
  // fp32 FLOP ceiling of the cores a rank has (MfuMeter's ceiling: cores x FMA lanes x the highest clock), at the
  // rank's share of them where ranks x threads exceed the cores (a profile of 1e-300 s a call gave 87k tokens/s).
  double fraction = p.mfu, peak = p.spec_peak_flops;
  std::string peak_of = fmt::format("the {}'s spec peak ({:.0f} TFLOP/s dense bf16)", choice.device_name, peak / 1e12);
  if (cpu) {
    const ops::CpuCeiling ceiling = ops::cpu_fp32_ceiling(threads);
    peak = ceiling.flops_per_s / contention;
    fraction = peak > 0 ? p.flops_per_token * p.tokens_per_s_per_rank / peak : 0;
    peak_of = fmt::format("this CPU's fp32 ceiling for a rank ({:.1f} GFLOP/s: {}{})", peak / 1e9, ceiling.how,
                          contention > 1 ? fmt::format(", over {:.2f} for the ranks sharing the cores", contention) : "");
  }
  if (fraction > 1) {
    if (o.ops_profiles.empty())
      throw InternalError(
          fmt::format("predict: {:.1f} % of {} from the built-in {} rates", 100 * fraction, peak_of, rates.name));
    throw ConfigError(fmt::format(
        "--ops-profile {}: the predicted step would run at {:.1f} % of {}: the profile's op times are faster than the "
        "device's {} allows, so it is not this device's profile or it is corrupt",
        fmt::join(o.ops_profiles, ", "), 100 * fraction, peak_of, cpu ? "ceiling" : "spec peak"));
  }
  const double memory_bytes = choice.memory_bytes;
  const double step = p.step_s;
  const std::string what = cpu ? "CPU ranks" : fmt::format("{} GPUs", o.gpu == "h100" ? "H100" : "H200");
  fmt::print("predict ({}): {} node(s) x {} {}, {} mesh {}, micro-batch {} x seq {}, {} accumulation step(s)\n", source,
             o.nodes, o.gpus_per_node, what, sharding_strategy_name(config.fsdp.engine.strategy), p.layout.describe(),
             p.micro_batch, p.seq, p.accumulation);
  int64_t nearest_gemm = 0;
  for (const auto& [key, miss] : costs.missed()) nearest_gemm += miss.like.empty() ? 0 : miss.calls;
  fmt::print(
      "  op times: {}; {} of {} calls from profiles, {} GEMMs at the nearest profiled GEMM's share of the "
      "ceiling, the rest from {} rates\n",
      profiles_described.empty() ? "no profile" : profiles_described, costs.hits(), costs.hits() + costs.misses(),
      nearest_gemm, rates.name);
  fmt::print("  links: {}\n", p.links_described);
  if (cpu_on_preset)
    fmt::print(
        "  links: no --links given: the CPU ranks' collectives are priced at the h100-dgx preset (NVLink, InfiniBand), "
        "not this machine's MPI; give --links FILE, a `bench comm --json` on these ranks (docs/predict.md)\n");
  fmt::print("  PREDICTION, not a measurement (docs/predict.md says what it leaves out)\n");
  fmt::print("  step              {}\n", ms(step));
  fmt::print("  tokens/s per {}  {}\n", cpu ? "rank" : "GPU ",
             p.tokens_per_s_per_rank >= 10 ? fmt::format("{:.0f}", p.tokens_per_s_per_rank)
                                           : fmt::format("{:.3g}", p.tokens_per_s_per_rank));
  if (p.spec_peak_flops > 0)
    fmt::print("  MFU               {:.1f} % of {:.0f} TFLOP/s (datasheet dense bf16)\n", 100 * p.mfu,
               p.spec_peak_flops / 1e12);
  fmt::print("  compute busy      {} ({:.1f} % of the step)\n", ms(p.compute_busy_s), 100 * p.compute_busy_s / step);
  fmt::print("  collectives       {} in all; exposed {} ({:.1f} % of the step)\n", ms(p.comm_busy_s), ms(p.exposed_comm_s),
             100 * p.exposed_comm_s / step);
  // Host<->device copies (the batch up; with CPU offload the shards up and the gradients down): their own line, so
  // that neither exposed figure counts time its "in all" does not.
  if (p.copy_busy_s > 0 || p.exposed_copy_s > 0)
    fmt::print("  copies h2d/d2h    {} in all; exposed {} ({:.1f} % of the step)\n", ms(p.copy_busy_s), ms(p.exposed_copy_s),
               100 * p.exposed_copy_s / step);
  fmt::print("  host idle         {} (compute waiting for the host to issue work)\n", ms(p.host_idle_s));
  if (!cpu)
    fmt::print("  peak memory       {:.2f} GiB (shardtrain's device buffers)\n", p.peak_device_bytes / double(1ull << 30));
  if (!cpu && memory_bytes > 0 && static_cast<double>(p.peak_device_bytes) > memory_bytes)
    fmt::print(
        "  DOES NOT FIT: {:.2f} GiB at the peak, an {} has {:.1f} GiB (more shard ranks, activation checkpointing, "
        "or a smaller micro-batch)\n",
        p.peak_device_bytes / double(1ull << 30), o.gpu == "h100" ? "H100" : "H200", memory_bytes / double(1ull << 30));
  if (!p.idle.empty()) {
    // Units of the same kind grouped ("model.layers.* all_gather shard", 80 units), largest first.
    std::map<std::string, std::pair<double, int>> groups;
    for (const train::IdleCause& c : p.idle) {
      std::string g = c.what;
      if (const size_t at = g.find(".layers."); at != std::string::npos) {
        const size_t digits = at + 8, end = g.find_first_not_of("0123456789", digits);
        g = g.substr(0, digits) + "*" + g.substr(end == std::string::npos ? g.size() : end);
      }
      groups[g].first += c.seconds;
      ++groups[g].second;
    }
    std::vector<std::pair<std::string, std::pair<double, int>>> sorted(groups.begin(), groups.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    fmt::print("  compute idle by cause (per step):\n");
    for (const auto& [g, v] : sorted)
      if (v.first >= 1e-6)
        fmt::print("    {:<44} {:>10}{}\n", g, ms(v.first),
                   v.second > 1 ? fmt::format("  ({} units, {} each at most)", v.second, ms(max_of(p.idle, g))) : "");
  }
  const std::map<std::string, Priced> priced = priced_by_op(costs);
  auto priced_of = [&](const std::string& work) {
    const auto it = priced.find(work);
    return it == priced.end() ? Priced{} : it->second;
  };
  fmt::print("  compute by op (per step; priced from):\n");
  for (const train::WorkTotal& w : p.compute_by_work)
    if (w.seconds >= 1e-3 * step)
      fmt::print("    {:<22} {:>5.0f} calls {:>10} {:>5.1f} %   {}\n", w.work, w.calls, ms(w.seconds),
                 100 * w.seconds / step, priced_from(priced_of(w.work), cpu));
  if (!o.trace.empty()) write_trace(o.trace, p);
  if (!o.json.empty()) {
    nlohmann::json j = {{"prediction", true},
                        {"config", source},
                        {"nodes", o.nodes},
                        {"ranks_per_node", o.gpus_per_node},
                        {"device", cpu ? "cpu" : choice.device_name},
                        {"mesh", p.layout.describe()},
                        {"micro_batch", p.micro_batch},
                        {"seq", p.seq},
                        {"accumulation", p.accumulation},
                        {"step_s", step},
                        {"tokens_per_s_per_rank", p.tokens_per_s_per_rank},
                        {"mfu", p.mfu},
                        {"spec_peak_flops", p.spec_peak_flops},
                        {"compute_busy_s", p.compute_busy_s},
                        {"comm_busy_s", p.comm_busy_s},
                        {"exposed_comm_s", p.exposed_comm_s},
                        {"copy_busy_s", p.copy_busy_s},
                        {"exposed_copy_s", p.exposed_copy_s},
                        {"host_idle_s", p.host_idle_s},
                        {"peak_device_bytes", p.peak_device_bytes},
                        {"op_calls_from_profile", costs.hits()},
                        {"op_calls_from_rates", costs.misses()},
                        {"links", p.links_described},
                        {"links_preset_for_cpu_ranks", cpu_on_preset}};
    j["op_calls_at_nearest_gemm"] = nearest_gemm;
    for (const train::IdleCause& c : p.idle)
      j["idle"].push_back({{"cause", c.what}, {"seconds", c.seconds}, {"communication", c.communication}, {"copy", c.copy}});
    for (const train::WorkTotal& w : p.compute_by_work) {
      const Priced from = priced_of(w.work);
      j["compute_by_op"].push_back(
          {{"op", w.work},
           {"calls", w.calls},
           {"seconds", w.seconds},
           {"calls_priced", {{"profile", from.profile}, {"nearest_gemm", from.nearest_gemm}, {"rates", from.rates}}}});
    }
    std::ofstream out(o.json);
    out << j.dump(2) << "\n";
    if (!out) throw Error(ExitCode::Io, fmt::format("--json {}: cannot be written", o.json));
  }
  return 0;
}

}  // namespace

Command add_predict_command(CLI::App& parent) {
  auto o = std::make_shared<PredictOptions>();
  Command c;
  c.app = parent.add_subcommand("predict",
                                "predict a config's step on N nodes x G GPUs: the real step run against a timing device "
                                "(offline; docs/predict.md)");
  o->args.add_to(c.app, ConfigArgs::Use::Predict);
  c.app->add_option("--nodes", o->nodes, "nodes")->check(count_range())->capture_default_str();
  c.app->add_option("--gpus-per-node", o->gpus_per_node, "GPUs (ranks) per node")
      ->check(count_range(1, kMaxRanksPerNode))
      ->capture_default_str();
  c.app->add_option("--gpu", o->gpu, "h100, h200, or cpu (the CPU backend, with --ops-profile of this machine)")
      ->capture_default_str();
  c.app->add_option("--ops-profile", o->ops_profiles,
                    "a `bench ops --json` profile of the device (repeatable; profiles/): its calls' measured times");
  c.app->add_option(
      "--ops-profile-exclude", o->profile_excludes,
      "an op (attention_forward, ...) whose profile rows are not used: its kernels changed since (repeatable)");
  c.app->add_option("--links", o->links, "h100-dgx (NVLink + 8x400G InfiniBand), or a `bench comm --json` file")
      ->capture_default_str();
  c.app->add_option("--steps", o->steps, "steady steps averaged (after 2 warm-up)")
      ->check(count_range(1, 10000))
      ->capture_default_str();
  c.app
      ->add_option("--cpu-threads", o->cpu_threads,
                   fmt::format("--gpu cpu: host threads per rank, 1 to {} (default: the cores over --gpus-per-node, at "
                               "least 1); more than the system starts is a usage error",
                               data::kMaxThreads))
      ->check(count_range(1, data::kMaxThreads));
  c.app->add_option("--json", o->json, "write the prediction as JSON")->check(output_file_check());
  c.app->add_option("--trace", o->trace, "write the last step's timeline as a Chrome trace (chrome://tracing, Perfetto)")
      ->check(output_file_check());
  c.launch = Launch::Offline;
  c.run = [o, app = c.app](Runtime*) {
    o->links_given = app->get_option("--links")->count() > 0;
    return run_predict(*o);
  };
  return c;
}

}  // namespace shardtrain::cli
