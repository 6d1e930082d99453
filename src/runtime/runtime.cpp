// Runtime construction: logging first (so every later message is rank-prefixed), then topology and device.
#include "shardtrain/runtime/runtime.hpp"

#include <algorithm>

namespace shardtrain {

Runtime::Runtime(const MpiSession& session, const RuntimeOptions& options) : options_(options) {
  log::configure(LogConfig{session.world_rank(), session.world_size(), options.log_level, options.log_all_ranks});
  const int rpn = options.ranks_per_node > 0 ? options.ranks_per_node : ranks_per_node_from_env();
  options_.ranks_per_node = rpn;
  topology_ = discover_topology(MPI_COMM_WORLD, rpn);
  device_ = select_device(topology_, options.device);
  // Simulated nodes share one machine: the cores are split among all ranks, not among a node's.
  const int sharing = topology_.simulated_nodes ? topology_.world_size : topology_.local_size;
  host_threads_ = std::max(1, usable_cores() / std::max(1, sharing));
}

}  // namespace shardtrain
