// `shardtrain env`: what the job sees: ranks, nodes, devices (each rank's GPU by identity: UUID and PCI bus
// id), the communication backend and why it was chosen, and the device mesh of a strategy with each rank's
// coordinates. Each axis is checked with an all-reduce of world ranks, so a broken interconnect shows here,
// before a training job hangs on it.
#include <array>
#include <cstdio>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "command.hpp"
#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/mesh/device_mesh.hpp"
#include "shardtrain/ops/cuda_ops.hpp"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::cli {
namespace {

struct EnvOptions {
  std::string strategy = "FULL_SHARD";
  int shard_size = 0;
  bool json = false;
  std::string comm_backend = "auto";
};

// One rank's row, gathered to rank 0 as plain bytes.
struct RankRow {
  int world_rank, node, local_rank, local_size, device_index, replicate, shard, ranks_sharing;
  int cores_at_start, host_threads, binding_released;
  std::array<char, 64> host;
  std::array<char, 96> device;
  std::array<char, 48> uuid;  // the physical GPU ("" on the CPU)
  std::array<char, 16> pci_bus_id;
};

// Sum of world ranks over an axis, checked against the group the mesh says this rank is in.
bool check_axis(Communicator& comm, const std::vector<int>& group, int world_rank) {
  int64_t v = world_rank;
  comm.all_reduce(std::span<int64_t>(&v, 1), ReduceOp::Sum);
  return v == std::accumulate(group.begin(), group.end(), int64_t{0});
}

int run_env(Runtime& rt, const EnvOptions& o) {
  const Topology& t = rt.topology();
  const MeshSpec spec{parse_sharding_strategy(o.strategy), o.shard_size};
  DeviceMesh mesh(rt.world(), t, spec);
  const CommBackendChoice choice = choose_comm_backend(rt, parse_comm_backend(o.comm_backend));
  const CommBackend backend = choice.backend;
  // Device buffers with a GPU on every rank (NCCL, or MPI staging through the host), host memory otherwise.
  const bool device_space = backend == CommBackend::Nccl || choice.host_staging;
  MeshComms comms(mesh, backend, device_space ? MemorySpace::Device : MemorySpace::Host);

  // With a GPU and NCCL the check needs device memory; host memory otherwise.
  const auto shard_groups = mesh.shard_groups_world();
  const auto replicate_groups = mesh.replicate_groups_world();
  bool ok = true;
  if (!device_space) {
    std::vector<int> world(t.world_size);
    std::iota(world.begin(), world.end(), 0);
    // Every axis on every rank, whatever the first gave: with `&&` a rank whose shard sum came out wrong (what this
    // command is for) skipped the two all-reduces its peers waited in, until the watchdog ended them.
    const bool shard_ok = check_axis(comms.shard(), shard_groups[mesh.coord().replicate], t.world_rank);
    const bool replicate_ok = check_axis(comms.replicate(), replicate_groups[mesh.coord().shard], t.world_rank);
    const bool world_ok = check_axis(comms.world(), world, t.world_rank);
    ok = shard_ok && replicate_ok && world_ok;
  } else {
    DeviceBuffer buf(sizeof(int64_t));
    int64_t v = t.world_rank;
    for (MeshAxis a : {MeshAxis::Shard, MeshAxis::Replicate, MeshAxis::World}) {
      copy_async(buf.data(), &v, sizeof(v), {});
      comms.axis(a).all_reduce(buf.data(), buf.data(), 1, DType::I64, ReduceOp::Sum);
      int64_t got = 0;
      copy_async(&got, buf.data(), sizeof(got), {});
      stream_synchronize({});
      const auto& g = a == MeshAxis::Shard       ? shard_groups[mesh.coord().replicate]
                      : a == MeshAxis::Replicate ? replicate_groups[mesh.coord().shard]
                                                 : std::vector<int>();
      const int64_t want = a == MeshAxis::World ? int64_t{t.world_size} * (t.world_size - 1) / 2
                                                : std::accumulate(g.begin(), g.end(), int64_t{0});
      ok = ok && got == want;
    }
  }
  int all_ok = ok ? 1 : 0;
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, rt.world()));

  RankRow row{};
  row.world_rank = t.world_rank;
  row.node = t.node_index;
  row.local_rank = t.local_rank;
  row.local_size = t.local_size;
  row.device_index = rt.device().index;
  row.ranks_sharing = rt.device().ranks_sharing;
  std::snprintf(row.uuid.data(), row.uuid.size(), "%s", rt.device().uuid.c_str());
  std::snprintf(row.pci_bus_id.data(), row.pci_bus_id.size(), "%s", rt.device().pci_bus_id.c_str());
  row.replicate = mesh.coord().replicate;
  row.shard = mesh.coord().shard;
  row.cores_at_start = rt.cpu_binding().cores_at_start;
  row.host_threads = rt.host_threads();
  row.binding_released = rt.cpu_binding().released ? 1 : 0;
  std::snprintf(row.host.data(), row.host.size(), "%s", t.hostname.c_str());
  std::snprintf(row.device.data(), row.device.size(), "%s", rt.device().describe().c_str());
  std::vector<RankRow> rows(t.world_rank == 0 ? t.world_size : 0);
  ST_CHECK_MPI(MPI_Gather(&row, sizeof(row), MPI_BYTE, rows.data(), sizeof(row), MPI_BYTE, 0, rt.world()));
  if (t.world_rank != 0) return all_ok ? 0 : static_cast<int>(ExitCode::Comm);

  const MeshLayout& m = mesh.layout();
  if (o.json) {
    nlohmann::json j;
    j["world_size"] = t.world_size;
    j["nodes"] = t.node_count;
    j["ranks_per_node"] = t.local_size;
    j["simulated_nodes"] = t.simulated_nodes;
    j["backend"] = rt.device().is_cuda() ? "cuda" : "cpu";
    j["cuda_built"] = cuda_built();
    j["comm_backend"] = comm_backend_name(backend);
    j["comm_backend_reason"] = choice.reason;
    j["comm_host_staging"] = choice.host_staging;
#if SHARDTRAIN_WITH_CUDA
    if (rt.device().is_cuda()) j["cudnn_attention"] = ops::cudnn_attention_status();
#endif
    j["strategy"] = sharding_strategy_name(m.strategy);
    j["mesh"] = {{"shape", {m.replicate_size, m.shard_size}},
                 {"axes", {"replicate", "shard"}},
                 {"replicate_size", m.replicate_size},
                 {"shard_size", m.shard_size},
                 {"shard_groups", shard_groups},
                 {"replicate_groups", replicate_groups}};
    j["axis_check"] = all_ok == 1;
    for (const RankRow& r : rows) {
      j["ranks"].push_back({{"rank", r.world_rank},
                            {"host", r.host.data()},
                            {"node", r.node},
                            {"local_rank", r.local_rank},
                            {"device", r.device.data()},
                            {"device_index", r.device_index},
                            {"gpu_uuid", r.uuid.data()},
                            {"pci_bus_id", r.pci_bus_id.data()},
                            {"ranks_sharing_gpu", r.ranks_sharing},
                            {"cores_at_start", r.cores_at_start},
                            {"host_threads", r.host_threads},
                            {"cpu_binding_released", r.binding_released == 1},
                            {"coord", {{"replicate", r.replicate}, {"shard", r.shard}}}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::string out;
    out += fmt::format("shardtrain {}: {} ranks on {} node(s){}, {} per node\n", SHARDTRAIN_VERSION, t.world_size,
                       t.node_count, t.simulated_nodes ? " (simulated by --ranks-per-node)" : "", t.local_size);
    out += fmt::format("backend: {} (CUDA {}), collectives: {}\n", rt.device().is_cuda() ? "cuda" : "cpu",
                       cuda_built() ? "built in" : "not built", choice.describe());
    out += fmt::format("strategy {}: mesh {}\n", sharding_strategy_name(m.strategy), m.describe());
    out += fmt::format("  shard groups:     {}\n", fmt::join(shard_groups, " "));
    out += fmt::format("  replicate groups: {}\n", fmt::join(replicate_groups, " "));
    out += fmt::format("{:>5}  {:<16} {:>4} {:>5}  {:>9} {:>5}  {}\n", "rank", "host", "node", "local", "replicate", "shard",
                       "device");
    for (const RankRow& r : rows) {
      out += fmt::format("{:>5}  {:<16} {:>4} {:>5}  {:>9} {:>5}  {}\n", r.world_rank, r.host.data(), r.node, r.local_rank,
                         r.replicate, r.shard, r.device.data());
    }
#if SHARDTRAIN_WITH_CUDA
    if (rt.device().is_cuda()) out += fmt::format("attention: cuDNN on rank 0: {}\n", ops::cudnn_attention_status());
#endif
    if (rt.device().is_cuda()) {  // the physical GPUs, as nvidia-smi -L names them
      out += fmt::format("{:>5}  {:<40} {:<12}  {}\n", "rank", "GPU", "PCI bus id", "ranks on it");
      for (const RankRow& r : rows)
        out += fmt::format("{:>5}  {:<40} {:<12}  {}\n", r.world_rank, r.uuid.data(), r.pci_bus_id.data(), r.ranks_sharing);
    }
    std::vector<int> threads;
    for (const RankRow& r : rows) threads.push_back(r.host_threads);
    const CpuBinding& b = rt.cpu_binding();
    out += fmt::format("host threads per rank: {} (rank 0: {} core(s) at start; {})\n", fmt::join(threads, " "),
                       b.cores_at_start, b.reason);
    out += fmt::format("axis check (all-reduce of ranks on shard, replicate, world): {}\n", all_ok ? "ok" : "FAILED");
    std::fputs(out.c_str(), stdout);
  }
  std::fflush(stdout);
  if (!all_ok) throw Error(ExitCode::Comm, "axis check failed: a mesh axis all-reduce returned the wrong sum");
  return 0;
}

}  // namespace

Command add_env_command(CLI::App& parent) {
  auto opts = std::make_shared<EnvOptions>();
  Command c;
  c.app = parent.add_subcommand("env", "print ranks, nodes, devices and the device mesh of a strategy");
  c.app
      ->add_option("--strategy", opts->strategy,
                   "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or HYBRID_SHARD_ZERO2 (or 1-5)")
      ->capture_default_str();
  c.app->add_option("--shard-size", opts->shard_size, "hybrid strategies: ranks per shard group (default: ranks per node)")
      ->check(count_range(0));
  c.app->add_option("--comm-backend", opts->comm_backend, "auto, mpi or nccl")->capture_default_str();
  c.app->add_flag("--json", opts->json, "print one JSON object on rank 0 (stdout)");
  c.launch = Launch::Mpi;
  c.run = [opts](Runtime* rt) { return run_env(*rt, *opts); };
  return c;
}

}  // namespace shardtrain::cli
