// Simulated communicators for the step-time prediction (docs/predict.md): collectives that move no bytes and take
// the time a link model gives them on the installed timing device (runtime/timing_device.hpp). A device-memory
// collective is queued on its stream as NCCL's would be; a host-memory one (the MPI backend, host values) blocks
// the host for its time. Every rank of a group is taken to arrive together: the engine's schedule is the same on
// every rank of a mesh, so one rank's timeline stands for all of them.
#pragma once

#include <memory>
#include <string>

#include "shardtrain/comm/communicator.hpp"

namespace shardtrain {

// One collective kind over one group: t = latency_s + factor * bytes / busbw_bytes_per_s, with nccl-tests' bus
// factors (all_gather and reduce_scatter (n-1)/n of the gathered or reduced bytes, all_reduce 2(n-1)/n, broadcast 1).
struct CollectiveCost {
  double latency_s = 0;
  double busbw_bytes_per_s = 0;
};

// The costs of one group's collectives: all_gather, reduce_scatter, all_reduce (broadcast as all_gather), and the
// blocking host collectives of a few values (the trainer's one per step; MPI, whatever the device backend).
struct GroupLinks {
  CollectiveCost all_gather, reduce_scatter, all_reduce;
  CollectiveCost host;
  // The link the group's device collectives hold while they run (TimingDevice resources): groups, and streams,
  // on the same link take turns. -1: none shared.
  int link = -1;
  std::string source;  // "nvlink (preset h100-dgx)", "measured: profiles/cpu-this-machine/comm-np2.json world"
};

// A ring's links, per the hardware: per-step latency and bus bandwidth within a node and across nodes.
struct LinkPreset {
  std::string name;
  double intra_step_latency_s = 0, intra_busbw_bytes_per_s = 0;  // within a node (NVLink, NVSwitch)
  double inter_step_latency_s = 0, inter_busbw_bytes_per_s = 0;  // across nodes (InfiniBand, one NIC per GPU)
  double host_latency_s = 0;                                     // one small MPI all-reduce across the job
};
// DGX/HGX H100-class nodes (docs/predict.md gives the sources): 8 GPUs on NVSwitch, 8 x 400 Gb/s InfiniBand.
LinkPreset h100_dgx_links();
// A group of `ranks` spanning `nodes` nodes (1: within one): a ring over NVLink (link 0), or one bounded by the
// NICs (link 1).
GroupLinks preset_group_links(const LinkPreset& preset, int ranks, int nodes);

double bus_factor(CollectiveKind kind, int ranks);
// Seconds of one collective (bytes as the Communicator counts them: communicator.hpp) over `ranks` ranks.
double collective_seconds(const GroupLinks& links, CollectiveKind kind, double bytes, int ranks);

// Queues (device space) or spends on the host (host space) each collective's time on timing::current().
// rank/size: this rank's place in the group. The watchdog and traffic counters work as for real ones.
std::unique_ptr<Communicator> make_sim_communicator(MeshAxis axis, int rank, int size, MemorySpace space,
                                                    CommBackend backend, GroupLinks links);

}  // namespace shardtrain
