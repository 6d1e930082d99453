// `shardtrain bench comm`: the collectives of the Communicator interface (comm/communicator.hpp), timed as training
// calls them, over the axes of a strategy's device mesh (built as `train` builds it) for a sweep of sizes; per
// axis and kind a fit of t = latency + bytes_factor * bytes / busbw: the measured links the step-time model reads.
//
// Sizes follow the Communicator's byte conventions, as nccl-tests' sizes do: all_gather the gathered output,
// reduce_scatter the reduced input, all_reduce the buffer. all_gather and reduce_scatter move bytes / n per rank,
// rounded down to whole elements (the point's bytes are those moved). all_gather and reduce_scatter run out of
// place, all_reduce in place (the engine's gradient all-reduce); host_all_reduce is the trainer's one host value
// reduction per step: --host-values doubles over MPI, whatever the backend and the memory.
// Timing: per size, warm-up calls, then timed calls, each started together on every rank after a world barrier
// (with device memory, the stream synchronized first) and timed by a DeviceTimer (CUDA events on the stream with
// device memory, a monotonic clock with host memory). A size's time is the median over calls of the max over ranks.
// algbw = bytes / time; busbw = algbw * bytes_factor, nccl-tests' factors (n ranks on the axis): all_gather and
// reduce_scatter (n-1)/n, all_reduce 2(n-1)/n.
// Fit, per axis and kind, of t = latency + bytes_factor * bytes / busbw: busbw from the slope of an ordinary
// least-squares line (intercept free) through the sizes of --fit-min-bytes (64 KiB) and up, so the largest sizes
// set it; latency the smallest size's time (an upper bound: it holds that size's transfer too). Chosen over one
// two-parameter fit because the times are not one line (small sizes move several times faster per byte than large
// ones: MPI changes protocol and algorithm with size, small buffers stay in cache), and a line through every size
// gets either the latency or the large sizes' bandwidth wrong, where FSDP's units (megabytes) need the latter. Fewer than two sizes from --fit-min-bytes: every
// size; a slope that is not positive (a sweep within the latency regime): the largest size's x / t (a lower
// bound). host_all_reduce has one size: latency only, busbw null.
//
// JSON (--json FILE, rank 0), what the step-time model reads as the measured links of a machine:
//   {"device": "cpu", "backend": "mpi|nccl", "ranks": N, "ranks_per_node": R,
//    "axes": {"world": {"all_gather": {"latency_s": .., "busbw_bytes_per_s": .., "points": [{"bytes": .., "seconds": ..},
//    ...]}, "reduce_scatter": {..}, "all_reduce": {..}, "host_all_reduce": {..}}, "shard": {..}, "replicate": {..}},
//    "strategy": .., "dtype": .., "memory": "host|device", "warmup": .., "iters": .., "fit": "..",
//    "axis_ranks": {"world": N, ..}, "axis_backends": {"world": "mpi", ..}}
// An axis of one rank moves nothing and is left out. On the NCCL backend the world axis is MPI (mesh_comms.hpp).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cmd_bench.hpp"
#include "command.hpp"
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/mesh/device_mesh.hpp"
#include "shardtrain/mesh/strategy.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::cli {
namespace {

struct BenchCommOptions {
  std::string strategy = "FULL_SHARD";
  int shard_size = 0;
  std::string comm_backend = "auto";
  std::vector<std::string> axes{"world", "shard", "replicate"};
  std::vector<std::string> kinds{"all_gather", "reduce_scatter", "all_reduce", "host_all_reduce"};
  std::string min_bytes = "4KiB", max_bytes = "256MiB", fit_min_bytes = "64KiB";
  int factor = 4;
  std::string dtype = "f32";
  std::string memory = "auto";
  int iters = 20, warmup = 5, host_values = 4;
  std::string json;
};

enum class BenchKind { AllGather, ReduceScatter, AllReduce, HostAllReduce };

const char* bench_kind_name(BenchKind k) {
  switch (k) {
    case BenchKind::AllGather: return "all_gather";
    case BenchKind::ReduceScatter: return "reduce_scatter";
    case BenchKind::AllReduce: return "all_reduce";
    case BenchKind::HostAllReduce: return "host_all_reduce";
  }
  return "?";
}

BenchKind parse_bench_kind(const std::string& s) {
  for (BenchKind k : {BenchKind::AllGather, BenchKind::ReduceScatter, BenchKind::AllReduce, BenchKind::HostAllReduce})
    if (s == bench_kind_name(k)) return k;
  throw UsageError(
      fmt::format("bench comm: --kinds {}: expected all_gather, reduce_scatter, all_reduce or host_all_reduce", s));
}

MeshAxis parse_axis(const std::string& s) {
  for (MeshAxis a : {MeshAxis::World, MeshAxis::Shard, MeshAxis::Replicate})
    if (s == mesh_axis_name(a)) return a;
  throw UsageError(fmt::format("bench comm: --axes {}: expected world, shard or replicate", s));
}

// nccl-tests' bus bandwidth factor of a collective over n ranks (host_all_reduce: an all-reduce).
double bytes_factor(BenchKind k, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return k == BenchKind::AllGather || k == BenchKind::ReduceScatter ? f : 2 * f;
}

// "4KiB", "256MiB", "1GiB", "1TiB", "4096" (bytes); KB/MB/GB/TB are powers of 10, K/M/G/T alone powers of 2;
// any case.
uint64_t parse_bytes(const std::string& text, const char* option) {
  const std::optional<NumberWithUnit> n = split_number_unit(text);
  const std::string unit = n ? n->unit : std::string("?");
  const double value = n ? n->value : 0;
  const double scale = unit.empty() || unit == "b"    ? 1.0
                       : unit == "k" || unit == "kib" ? 1024.0
                       : unit == "m" || unit == "mib" ? 1048576.0
                       : unit == "g" || unit == "gib" ? 1073741824.0
                       : unit == "t" || unit == "tib" ? 0x1p40  // "up to 1 TiB" was itself refused
                       : unit == "kb"                 ? 1e3
                       : unit == "mb"                 ? 1e6
                       : unit == "gb"                 ? 1e9
                       : unit == "tb"                 ? 1e12
                                                      : 0;
  const double bytes = std::round(value * scale);
  if (scale == 0 || !std::isfinite(bytes) || bytes < 1 || bytes > 0x1p40)
    throw UsageError(
        fmt::format("bench comm: {} '{}' is not a size; expected bytes (4096) or a size with a unit: 4KiB, "
                    "256MiB, 1GiB (powers of 2), 4KB, 1MB (powers of 10), up to 1 TiB",
                    option, text));
  return static_cast<uint64_t>(bytes);
}

struct Point {
  uint64_t bytes = 0;
  double seconds = 0;
};

struct Fit {
  double latency_s = 0;
  std::optional<double> busbw;  // bytes per second; none for host_all_reduce
};

// The fit of the header comment; `factor` turns bytes into bus bytes.
Fit fit_points(const std::vector<Point>& points, double factor, uint64_t fit_min_bytes, bool latency_only) {
  Fit f;
  if (points.empty()) return f;
  const auto by_bytes = [](const Point& p, const Point& q) { return p.bytes < q.bytes; };
  f.latency_s = std::min_element(points.begin(), points.end(), by_bytes)->seconds;
  if (latency_only) return f;
  std::vector<Point> fitted;
  for (const Point& p : points)
    if (p.bytes >= fit_min_bytes) fitted.push_back(p);
  if (fitted.size() < 2) fitted = points;
  double mx = 0, mt = 0;
  for (const Point& p : fitted) mx += factor * static_cast<double>(p.bytes), mt += p.seconds;
  mx /= static_cast<double>(fitted.size()), mt /= static_cast<double>(fitted.size());
  double sxx = 0, sxt = 0;
  for (const Point& p : fitted) {
    const double dx = factor * static_cast<double>(p.bytes) - mx;
    sxx += dx * dx, sxt += dx * (p.seconds - mt);
  }
  const double slope = sxx > 0 ? sxt / sxx : 0;  // seconds per bus byte
  const Point& largest = *std::max_element(points.begin(), points.end(), by_bytes);
  f.busbw = slope > 0 ? 1 / slope : factor * static_cast<double>(largest.bytes) / largest.seconds;
  return f;
}

// Two buffers of `bytes` each, zero-filled, in host or device memory: send and receive of every collective.
struct Buffers {
  Buffers(size_t bytes, MemorySpace space, StreamRef stream) {
    if (space == MemorySpace::Host) {
      host_a = PinnedBuffer(bytes), host_b = PinnedBuffer(bytes);
      std::memset(host_a.data(), 0, bytes);
      std::memset(host_b.data(), 0, bytes);
      a = host_a.data(), b = host_b.data();
      return;
    }
    device_a = DeviceBuffer(bytes), device_b = DeviceBuffer(bytes);
    const std::vector<std::byte> zeros(std::min<size_t>(bytes, size_t{64} << 20));
    for (void* dst : {device_a.data(), device_b.data()})
      for (size_t at = 0; at < bytes; at += zeros.size())
        copy_async(static_cast<std::byte*>(dst) + at, zeros.data(), std::min(zeros.size(), bytes - at), stream);
    stream_synchronize(stream);
    a = device_a.data(), b = device_b.data();
  }
  PinnedBuffer host_a, host_b;
  DeviceBuffer device_a, device_b;
  void* a = nullptr;
  void* b = nullptr;
};

struct KindResult {
  BenchKind kind;
  std::vector<Point> points;
  Fit fit;
};

struct AxisResult {
  MeshAxis axis;
  int ranks = 0;
  CommBackend backend = CommBackend::Mpi;
  std::vector<KindResult> kinds;
};

class CommBench {
 public:
  CommBench(const BenchCommOptions& o, MPI_Comm world, MemorySpace space, StreamRef stream)
      : o_(o),
        world_(world),
        space_(space),
        stream_(stream),
        timer_(space == MemorySpace::Device ? DeviceKind::Cuda : DeviceKind::Cpu, stream) {}

  // Seconds of one call: the median over the timed calls of the max over the world's ranks.
  template <typename Fn>
  double time(bool on_stream, Fn&& call) {
    DeviceTimer host_timer(DeviceKind::Cpu);
    DeviceTimer& timer = on_stream ? timer_ : host_timer;
    std::vector<double> seconds;
    for (int i = 0; i < o_.warmup + o_.iters; ++i) {
      if (space_ == MemorySpace::Device) stream_synchronize(stream_);
      ST_CHECK_MPI(MPI_Barrier(world_));
      timer.start();
      call();
      timer.stop();
      const double s = timer.seconds();
      if (i >= o_.warmup) seconds.push_back(s);
    }
    ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, seconds.data(), static_cast<int>(seconds.size()), MPI_DOUBLE, MPI_MAX, world_));
    return median(std::move(seconds));
  }

  // One kind over one axis, every size of the sweep (sizes too small for one element per rank are left out).
  KindResult run(Communicator& comm, BenchKind kind, DType dt, const std::vector<uint64_t>& sizes, uint64_t fit_min_bytes,
                 Buffers& buf) {
    KindResult r{kind, {}, {}};
    const int n = comm.size();
    const size_t es = dtype_size(dt);
    if (kind == BenchKind::HostAllReduce) {
      std::vector<double> values(static_cast<size_t>(o_.host_values), 1.0);
      const double s = time(false, [&] { comm.all_reduce(std::span<double>(values), ReduceOp::Sum); });
      r.points.push_back({values.size() * sizeof(double), s});
      r.fit = fit_points(r.points, bytes_factor(kind, n), 0, true);
      return r;
    }
    for (const uint64_t size : sizes) {
      const size_t count = kind == BenchKind::AllReduce ? size / es : size / (es * static_cast<size_t>(n));
      if (count == 0) continue;
      const uint64_t bytes = kind == BenchKind::AllReduce ? count * es : count * es * static_cast<size_t>(n);
      double s = 0;
      switch (kind) {
        case BenchKind::AllGather: s = time(true, [&] { comm.all_gather(buf.a, buf.b, count, dt, stream_); }); break;
        case BenchKind::ReduceScatter:
          s = time(true, [&] { comm.reduce_scatter(buf.a, buf.b, count, dt, ReduceOp::Sum, stream_); });
          break;
        case BenchKind::AllReduce:
          s = time(true, [&] { comm.all_reduce(buf.a, buf.a, count, dt, ReduceOp::Sum, stream_); });
          break;
        case BenchKind::HostAllReduce: break;
      }
      r.points.push_back({bytes, s});
    }
    r.fit = fit_points(r.points, bytes_factor(kind, n), fit_min_bytes, false);
    return r;
  }

 private:
  const BenchCommOptions& o_;
  MPI_Comm world_;
  MemorySpace space_;
  StreamRef stream_;
  DeviceTimer timer_;
};

std::string format_rate(double bytes_per_s) { return fmt::format("{:.3g} GB/s", bytes_per_s * 1e-9); }

void print_kind(const KindResult& r, int n, DType dt) {
  const double factor = bytes_factor(r.kind, n);
  const bool host = r.kind == BenchKind::HostAllReduce;
  fmt::print("  {} ({}, bytes_factor {:.4g})\n", bench_kind_name(r.kind), host ? "f64, host values" : dtype_name(dt),
             factor);
  fmt::print("  {:>14} {:>12} {:>10} {:>13} {:>13}\n", "bytes", "count", "time", "algbw", "busbw");
  for (const Point& p : r.points) {
    const double algbw = static_cast<double>(p.bytes) / p.seconds;
    const size_t es = host ? sizeof(double) : dtype_size(dt);
    const uint64_t count = host || r.kind == BenchKind::AllReduce ? p.bytes / es : p.bytes / es / static_cast<uint64_t>(n);
    fmt::print("  {:>14} {:>12} {:>10} {:>13} {:>13}\n", p.bytes, count, format_seconds(p.seconds), format_rate(algbw),
               format_rate(algbw * factor));
  }
  if (r.fit.busbw) fmt::print("  fit: latency {}, busbw {}\n", format_seconds(r.fit.latency_s), format_rate(*r.fit.busbw));
  else fmt::print("  latency {} (one size: no bandwidth)\n", format_seconds(r.fit.latency_s));
}

// The fit of the header comment, in the JSON's words (`fit`).
std::string fit_method(uint64_t fit_min_bytes) {
  return fmt::format(
      "t = latency + bytes_factor * bytes / busbw; busbw: slope of a least-squares line through the sizes >= {} bytes "
      "(every size when fewer than two); latency: the smallest size's time",
      fit_min_bytes);
}

int run_bench_comm(const BenchCommOptions& o, Runtime* rt) {
  if (o.iters < 1 || o.warmup < 0) throw UsageError("bench comm: --iters 1 or more, --warmup 0 or more");
  const DType dt = parse_dtype(o.dtype);  // fp32 or bf16, the dtypes FSDP moves (float_dtype_check)
  const uint64_t min_bytes = parse_bytes(o.min_bytes, "--min-bytes"), max_bytes = parse_bytes(o.max_bytes, "--max-bytes");
  const uint64_t fit_min_bytes = parse_bytes(o.fit_min_bytes, "--fit-min-bytes");
  if (min_bytes > max_bytes)
    throw UsageError(fmt::format("bench comm: --min-bytes {} is above --max-bytes {}", o.min_bytes, o.max_bytes));
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes; s <= max_bytes; s *= static_cast<uint64_t>(o.factor)) sizes.push_back(s);
  std::vector<MeshAxis> axes;
  for (const std::string& a : o.axes) axes.push_back(parse_axis(a));
  std::vector<BenchKind> kinds;
  for (const std::string& k : o.kinds) kinds.push_back(parse_bench_kind(k));

  const Topology& t = rt->topology();
  const bool cuda = rt->device().is_cuda();
  if (o.memory != "auto" && o.memory != "host" && o.memory != "device")
    throw UsageError(fmt::format("bench comm: --memory {}: expected auto, host or device", o.memory));
  const MemorySpace space = o.memory == "host" || (o.memory == "auto" && !cuda) ? MemorySpace::Host : MemorySpace::Device;
  if (space == MemorySpace::Device && !cuda)
    throw UsageError(fmt::format("bench comm: --memory device needs a GPU on every rank; rank {} runs on {}", t.world_rank,
                                 rt->device().describe()));
  // As `train` chooses (fsdp.comm_backend); host memory is MPI's alone.
  const CommBackendPreference pref = parse_comm_backend(o.comm_backend);
  CommBackendChoice choice;
  if (space == MemorySpace::Host && cuda) {
    if (pref == CommBackendPreference::Nccl)
      throw UsageError("bench comm: --memory host with --comm-backend nccl: NCCL takes device memory; use mpi or auto");
    choice.reason = "--memory host";
  } else {
    choice = choose_comm_backend(*rt, pref);
  }
  DeviceMesh mesh(rt->world(), t, MeshSpec{parse_sharding_strategy(o.strategy), o.shard_size});
  MeshComms comms(mesh, choice.backend, space);
  const bool root = t.world_rank == 0;
  // The axes with 2 or more ranks (the same on every rank), each one element per rank in the largest size.
  std::vector<MeshAxis> timed;
  for (MeshAxis a : axes) {
    const int n = comms.axis(a).size();
    if (n < 2) {
      if (root) log::info("bench comm: the {} axis has one rank ({}): nothing to time", mesh_axis_name(a), o.strategy);
      continue;
    }
    if (max_bytes < dtype_size(dt) * static_cast<uint64_t>(n))
      throw UsageError(
          fmt::format("bench comm: --max-bytes {} holds less than one {} element per rank on the {} axis of {} ranks",
                      o.max_bytes, dtype_name(dt), mesh_axis_name(a), n));
    timed.push_back(a);
  }
  if (timed.empty())
    throw UsageError(fmt::format("bench comm: no axis of {} ranks with {} has 2 or more ranks: nothing to time",
                                 t.world_size, sharding_strategy_name(mesh.strategy())));
  std::unique_ptr<CudaStream> stream;
  if (space == MemorySpace::Device) stream = std::make_unique<CudaStream>();
  const StreamRef sref = stream ? stream->ref() : StreamRef{};
  Buffers buffers(static_cast<size_t>(max_bytes), space, sref);
  CommBench bench(o, rt->world(), space, sref);

  if (root) {
    fmt::print("bench comm: {} mesh {}, {} ranks ({} per node, {} node(s){}), device {}, collectives {}\n",
               sharding_strategy_name(mesh.strategy()), mesh.layout().describe(), t.world_size, t.local_size, t.node_count,
               t.simulated_nodes ? ", simulated" : "", rt->device().describe(), choice.describe());
    fmt::print(
        "{} memory, {}, sizes {} .. {} x{}; {} warm-up + {} timed calls per size, each started after a world "
        "barrier; time: median over calls of the max over ranks\n",
        space == MemorySpace::Host ? "host" : "device", dtype_name(dt), format_bytes(min_bytes), format_bytes(max_bytes),
        o.factor, o.warmup, o.iters);
    fmt::print(
        "bytes: all_gather the gathered output, reduce_scatter the reduced input, all_reduce the buffer; "
        "algbw = bytes / time, busbw = algbw * bytes_factor (nccl-tests: all_gather, reduce_scatter (n-1)/n; "
        "all_reduce 2(n-1)/n)\n");
    fmt::print("fit: {}\n", fit_method(fit_min_bytes));
  }
  std::vector<AxisResult> results;
  for (MeshAxis a : timed) {
    Communicator& comm = comms.axis(a);
    AxisResult ar{a, comm.size(), comm.backend(), {}};
    if (root)
      fmt::print("\naxis {}: {} ranks per group, {} group(s), {}\n", mesh_axis_name(a), comm.size(),
                 t.world_size / comm.size(), comm_backend_name(comm.backend()));
    for (BenchKind k : kinds) {
      ar.kinds.push_back(bench.run(comm, k, dt, sizes, fit_min_bytes, buffers));
      if (root) print_kind(ar.kinds.back(), comm.size(), dt);
    }
    results.push_back(std::move(ar));
  }
  if (!root) return 0;

  fmt::print("\n{:<10} {:<16} {:>12} {:>14}\n", "axis", "kind", "latency", "busbw");
  for (const AxisResult& ar : results)
    for (const KindResult& k : ar.kinds)
      fmt::print("{:<10} {:<16} {:>12} {:>14}\n", mesh_axis_name(ar.axis), bench_kind_name(k.kind),
                 format_seconds(k.fit.latency_s), k.fit.busbw ? format_rate(*k.fit.busbw) : std::string("-"));

  if (!o.json.empty()) {
    nlohmann::ordered_json j;
    j["device"] = rt->device().describe();
    j["backend"] = comm_backend_name(choice.backend);
    j["ranks"] = t.world_size;
    j["ranks_per_node"] = t.local_size;
    nlohmann::ordered_json jaxes = nlohmann::ordered_json::object(), ranks = nlohmann::ordered_json::object(),
                           backends = nlohmann::ordered_json::object();
    for (const AxisResult& ar : results) {
      nlohmann::ordered_json ja = nlohmann::ordered_json::object();
      for (const KindResult& k : ar.kinds) {
        nlohmann::ordered_json points = nlohmann::ordered_json::array();
        for (const Point& p : k.points) points.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}});
        ja[bench_kind_name(k.kind)] = {
            {"latency_s", k.fit.latency_s},
            {"busbw_bytes_per_s", k.fit.busbw ? nlohmann::ordered_json(*k.fit.busbw) : nlohmann::ordered_json(nullptr)},
            {"points", points}};
      }
      jaxes[mesh_axis_name(ar.axis)] = ja;
      ranks[mesh_axis_name(ar.axis)] = ar.ranks;
      backends[mesh_axis_name(ar.axis)] = comm_backend_name(ar.backend);
    }
    j["axes"] = jaxes;
    j["strategy"] = sharding_strategy_name(mesh.strategy());
    j["dtype"] = dtype_name(dt);
    j["memory"] = space == MemorySpace::Host ? "host" : "device";
    j["warmup"] = o.warmup;
    j["iters"] = o.iters;
    j["fit"] = fit_method(fit_min_bytes);
    j["axis_ranks"] = ranks;
    j["axis_backends"] = backends;
    write_text_file(o.json, j.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

BenchSubcommand add_bench_comm_command(CLI::App& bench) {
  auto o = std::make_shared<BenchCommOptions>();
  CLI::App* a = bench.add_subcommand(
      "comm",
      "time the collectives training runs (all_gather, reduce_scatter, all_reduce, host_all_reduce) over the axes of a "
      "strategy's mesh under mpirun, for a sweep of sizes; fit latency and bus bandwidth per axis and kind");
  a->add_option("--strategy", o->strategy, "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2")
      ->capture_default_str();
  a->add_option("--shard-size", o->shard_size, "hybrid strategies: ranks per shard group (default: ranks per node)")
      ->check(count_range(0));
  a->add_option("--comm-backend,--fsdp.comm_backend", o->comm_backend, "auto, mpi or nccl, as fsdp.comm_backend")
      ->capture_default_str();
  a->add_option("--axes", o->axes, "mesh axes to time: world, shard, replicate (an axis of one rank is skipped)")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--kinds", o->kinds, "collectives: all_gather, reduce_scatter, all_reduce, host_all_reduce")
      ->delimiter(',')
      ->capture_default_str();
  a->add_option("--min-bytes", o->min_bytes, "smallest size (bytes, or 4KiB, 1MiB, ...)")->capture_default_str();
  a->add_option("--max-bytes", o->max_bytes, "largest size")->capture_default_str();
  a->add_option("--fit-min-bytes", o->fit_min_bytes, "the bandwidth fit's smallest size")->capture_default_str();
  a->add_option("--factor", o->factor, "each size is the previous one times this")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  a->add_option("--dtype", o->dtype, "f32 or bf16")->check(float_dtype_check())->capture_default_str();
  a->add_option("--memory", o->memory, "host, device (a GPU on every rank) or auto (device on a GPU)")
      ->capture_default_str();
  a->add_option("--iters", o->iters, "timed calls per size (their median is reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  a->add_option("--warmup", o->warmup, "untimed calls first")->capture_default_str()->check(CLI::Range(0, 100000));
  a->add_option("--host-values", o->host_values, "doubles in host_all_reduce (the trainer's per-step host values)")
      ->capture_default_str()
      ->check(count_range(1, 1 << 20));
  a->add_option("--json", o->json, "also write the results as JSON to this file (rank 0): the step-time model's links")
      ->check(output_file_check());
  a->footer(
      "Sizes are the Communicator's bytes: all_gather the gathered output, reduce_scatter the reduced input,\n"
      "all_reduce the buffer. Time: median over the timed calls of the max over ranks. busbw = bytes / time *\n"
      "bytes_factor: (n-1)/n for all_gather and reduce_scatter, 2(n-1)/n for all_reduce (nccl-tests).\n"
      "Fit per axis and kind: t = latency + bytes_factor * bytes / busbw; busbw from the slope of a least-squares\n"
      "line through the sizes >= --fit-min-bytes, latency the smallest size's time. host_all_reduce: one size,\n"
      "latency only (busbw null).\n"
      "JSON: {\"device\", \"backend\": \"mpi|nccl\", \"ranks\", \"ranks_per_node\", \"axes\": {\"world\"|\"shard\"|\"replicate\":\n"
      "{\"all_gather\"|\"reduce_scatter\"|\"all_reduce\"|\"host_all_reduce\": {\"latency_s\", \"busbw_bytes_per_s\",\n"
      "\"points\": [{\"bytes\", \"seconds\"}, ...]}}}, then strategy, dtype, memory, warmup, iters, fit, axis_ranks,\n"
      "axis_backends}. docs/cluster.md, \"Measuring the links\".");
  return {a, [o](Runtime* rt) { return run_bench_comm(*o, rt); }};
}

}  // namespace shardtrain::cli
