// The per-process context of an MPI command: session facts, topology and the selected device.
// Passed explicitly to every layer that needs it (no globals).
#pragma once

#include <mpi.h>

#include "shardtrain/runtime/cpu_binding.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain {

struct RuntimeOptions {
  int ranks_per_node = 0;  // 0: real nodes (MPI_COMM_TYPE_SHARED); >0: simulated nodes of this size
  DevicePreference device = DevicePreference::Auto;
  LogLevel log_level = LogLevel::Info;
  bool log_all_ranks = false;
};

class Runtime {
 public:
  // Collective over MPI_COMM_WORLD: configures logging, discovers the topology, releases Open MPI's default
  // one-core binding (cpu_binding.hpp), sizes host thread pools to the cores this rank can use (and sets
  // OpenMP's default thread count to it), and selects the device. `stage`, where given, is told as each collective
  // part begins (the topology, then select_device's), for the start-up's deadline (main.cpp).
  Runtime(const MpiSession& session, const RuntimeOptions& options, const StartupStage& stage = {});

  const Topology& topology() const { return topology_; }
  const Device& device() const { return device_; }
  const RuntimeOptions& options() const { return options_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  // The ranks on this machine (machine_comm), physical even where --ranks-per-node simulates nodes: the
  // ranks that may share a GPU.
  MPI_Comm machine() const { return machine_.get(); }
  // Threads for this rank's host work: its own cores when the launcher gave it some (srun --cpus-per-task),
  // else its share of the cores the ranks on the machine see. At least 1.
  int host_threads() const { return host_threads_; }
  const CpuBinding& cpu_binding() const { return cpu_binding_; }
  // The ranks that share this machine's cores (cpu_binding().allowed): the node's ranks, or every rank where
  // --ranks-per-node simulates nodes on one machine.
  int ranks_sharing_cores() const { return ranks_sharing_cores_; }

 private:
  RuntimeOptions options_;
  Topology topology_;
  MpiComm machine_;
  Device device_;
  CpuBinding cpu_binding_;
  int host_threads_ = 1;
  int ranks_sharing_cores_ = 1;
};

}  // namespace shardtrain
