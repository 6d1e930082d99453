// The per-process context of an MPI command: session facts, topology and the selected device.
// Passed explicitly to every layer that needs it (no globals).
#pragma once

#include <mpi.h>

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
  // Collective over MPI_COMM_WORLD: configures logging, discovers the topology, selects the device,
  // and sizes host thread pools to the cores this rank can use.
  Runtime(const MpiSession& session, const RuntimeOptions& options);

  const Topology& topology() const { return topology_; }
  const Device& device() const { return device_; }
  const RuntimeOptions& options() const { return options_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int host_threads() const { return host_threads_; }  // cores per local rank, at least 1

 private:
  RuntimeOptions options_;
  Topology topology_;
  Device device_;
  int host_threads_ = 1;
};

}  // namespace shardtrain
