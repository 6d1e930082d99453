// Simulated communicators (sim_communicator.hpp): time from a link model, on the timing device.
#include "shardtrain/comm/sim_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timing_device.hpp"

namespace shardtrain {

// Sources for the preset (public datasheets; docs/predict.md):
//  - NVLink 4 on H100 SXM: 900 GB/s per GPU both directions, 450 GB/s each way; NCCL's all_gather and
//    reduce_scatter bus bandwidth on an 8-GPU NVSwitch node is typically reported near 360 GB/s (80 % of it).
//  - DGX H100: 8 ConnectX-7 NICs at 400 Gb/s, one per GPU = 50 GB/s per GPU; NCCL reaches about 90 % of it.
//  - Latencies: NCCL's ring step over NVLink is a few microseconds, over InfiniBand about twice that.
LinkPreset h100_dgx_links() {
  // name, intra-node step latency and bus bandwidth, inter-node step latency and bus bandwidth, host all-reduce
  return {"h100-dgx", 3e-6, 360e9, 8e-6, 45e9, 30e-6};
}

GroupLinks preset_group_links(const LinkPreset& preset, int ranks, int nodes) {
  GroupLinks g;
  const bool inter = nodes > 1;
  const double step = inter ? preset.inter_step_latency_s : preset.intra_step_latency_s;
  // A ring through several nodes runs at the pace of its slowest hops: each node's NICs.
  const double busbw =
      inter ? std::min(preset.intra_busbw_bytes_per_s, preset.inter_busbw_bytes_per_s) : preset.intra_busbw_bytes_per_s;
  const int steps = std::max(ranks - 1, 0);
  g.all_gather = {step * steps, busbw};
  g.reduce_scatter = {step * steps, busbw};
  g.all_reduce = {2 * step * steps, busbw};
  g.host = {preset.host_latency_s, 10e9};
  g.link = inter ? 1 : 0;
  g.source = fmt::format("{} (preset {}, {} ranks on {} node{})", inter ? "infiniband" : "nvlink", preset.name, ranks, nodes,
                         nodes == 1 ? "" : "s");
  return g;
}

double bus_factor(CollectiveKind kind, int ranks) {
  const double n = ranks;
  switch (kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter: return (n - 1) / n;
    case CollectiveKind::AllReduce: return 2 * (n - 1) / n;
    case CollectiveKind::Broadcast: return 1;
    case CollectiveKind::Barrier: return 0;
  }
  return 1;
}

double collective_seconds(const GroupLinks& links, CollectiveKind kind, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const CollectiveCost& c = kind == CollectiveKind::ReduceScatter ? links.reduce_scatter
                            : kind == CollectiveKind::AllReduce   ? links.all_reduce
                                                                  : links.all_gather;
  if (kind == CollectiveKind::Barrier) return c.latency_s;
  return c.latency_s + bus_factor(kind, ranks) * bytes / c.busbw_bytes_per_s;
}

namespace {

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(MeshAxis axis, int rank, int size, MemorySpace space, CommBackend backend, GroupLinks links)
      : Communicator(axis, rank, size, space), backend_(backend), links_(std::move(links)) {}
  CommBackend backend() const override { return backend_; }

 protected:
  void do_all_gather(const void*, void*, size_t count, DType dtype, StreamRef stream) override {
    spend(CollectiveKind::AllGather, count * size() * dtype_size(dtype), stream);
  }
  void do_reduce_scatter(const void*, void*, size_t count, DType dtype, ReduceOp, StreamRef stream) override {
    spend(CollectiveKind::ReduceScatter, count * size() * dtype_size(dtype), stream);
  }
  void do_all_reduce(const void*, void*, size_t count, DType dtype, ReduceOp, StreamRef stream) override {
    spend(CollectiveKind::AllReduce, count * dtype_size(dtype), stream);
  }
  void do_broadcast(void*, size_t count, DType dtype, int, StreamRef stream) override {
    spend(CollectiveKind::Broadcast, count * dtype_size(dtype), stream);
  }
  void do_barrier() override { host(CollectiveKind::Barrier, 0); }
  void do_host_all_gather(const void*, void*, size_t count, DType dtype) override {
    host(CollectiveKind::AllGather, count * size() * dtype_size(dtype));
  }
  void do_host_all_reduce(void*, size_t count, DType dtype, ReduceOp) override {
    host(CollectiveKind::AllReduce, count * dtype_size(dtype));
  }

 private:
  static timing::TimingDevice& device() {
    timing::TimingDevice* t = timing::current();
    if (!t) throw InternalError("a simulated communicator used with no timing device installed");
    return *t;
  }
  std::string label(CollectiveKind kind, double bytes) const {
    return fmt::format("{} {} {:.3g} MB", collective_kind_name(kind), mesh_axis_name(axis()), bytes / 1e6);
  }
  void spend(CollectiveKind kind, double bytes, StreamRef stream) {
    if (size() <= 1) return;
    timing::TimingDevice& t = device();
    const double seconds = collective_seconds(links_, kind, bytes, size());
    if (space() == MemorySpace::Device) {
      t.enqueue(stream, timing::WorkKind::Comm, seconds, t.costs().comm_launch_s, label(kind, bytes), links_.link);
    } else {
      t.host_work(seconds, label(kind, bytes), timing::WorkKind::Comm);
    }
  }
  // Host values over MPI: a round trip per ring step of latency, at the host link's bandwidth.
  void host(CollectiveKind kind, double bytes) {
    if (size() <= 1) return;
    const double seconds = links_.host.latency_s + bus_factor(kind, size()) * bytes / links_.host.busbw_bytes_per_s;
    device().host_work(seconds, label(kind, bytes), timing::WorkKind::Comm);
  }

  CommBackend backend_;
  GroupLinks links_;
};

}  // namespace

std::unique_ptr<Communicator> make_sim_communicator(MeshAxis axis, int rank, int size, MemorySpace space,
                                                    CommBackend backend, GroupLinks links) {
  return std::make_unique<SimCommunicator>(axis, rank, size, space, backend, std::move(links));
}

}  // namespace shardtrain
