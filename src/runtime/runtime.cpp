// Runtime construction: logging first (so every later message is rank-prefixed), then topology and device.
#include "shardtrain/runtime/runtime.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "shardtrain/runtime/cpu_binding.hpp"

namespace shardtrain {

Runtime::Runtime(const MpiSession& session, const RuntimeOptions& options, const StartupStage& stage) : options_(options) {
  log::configure(LogConfig{session.world_rank(), session.world_size(), options.log_level, options.log_all_ranks});
  const int rpn = options.ranks_per_node > 0 ? options.ranks_per_node : ranks_per_node_from_env();
  options_.ranks_per_node = rpn;
  if (stage) stage("the ranks' topology (their hosts and nodes)", true);
  topology_ = discover_topology(MPI_COMM_WORLD, rpn);
  // Simulated nodes share one machine: the cores are split among all ranks, not among a node's.
  const int sharing = std::max(1, topology_.simulated_nodes ? topology_.world_size : topology_.local_size);
  ranks_sharing_cores_ = sharing;
  // Before the device (CUDA starts threads of its own) and before any OpenMP region or worker thread:
  // threads keep the affinity they were created with.
  const char* policy = std::getenv("SHARDTRAIN_CPU_BINDING");
  cpu_binding_ = adjust_cpu_binding(sharing, policy ? policy : "");
  // A rank given cores of its own (srun --cpus-per-task) uses them all; ranks that see the same cores (no
  // binding, or a socket's) split them.
  host_threads_ = std::max(1, std::min(cpu_binding_.cores, cpu_binding_.allowed / sharing));
  // Every OpenMP region that names no thread count (the host optimizer's, the engine's) takes this one.
  omp_set_num_threads(host_threads_);
  const CpuBinding& b = cpu_binding_;
  if (b.released) {
    log::info("cpu binding: {} core(s) at start, {}; {} host thread(s) per rank", b.cores_at_start, b.reason, host_threads_);
  } else if (b.cores_at_start < b.allowed / sharing) {
    log::warn(
        "cpu binding: this rank may use {} of the {} cores that are its share ({}): its host work (CPU offload's "
        "optimizer, the data loader) runs on {} thread(s). To give it more: mpirun --bind-to none, "
        "srun --cpus-per-task=N, or SHARDTRAIN_CPU_BINDING=release",
        b.cores_at_start, b.allowed / sharing, b.reason, host_threads_);
  }
  machine_ = machine_comm(MPI_COMM_WORLD);
  device_ = select_device(topology_, options.device, machine_.get(), stage);
}

}  // namespace shardtrain
