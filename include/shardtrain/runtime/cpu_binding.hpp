// The cores a rank runs on, and releasing the one-core binding that Open MPI's mpirun gives by default.
#pragma once

#include <string>

namespace shardtrain {

// What adjust_cpu_binding() found and did. Cores are usable_cores() counts (the calling thread's affinity).
struct CpuBinding {
  int cores_at_start = 1;  // the affinity the launcher gave this rank
  int cores = 1;           // the affinity now (after a release, every CPU the process's cgroup allows)
  int allowed = 1;         // every CPU this process may be given (its cgroup cpuset), whether or not it has them
  bool released = false;   // the launcher's binding was widened to `allowed`
  std::string reason;      // why it was released or kept, for the log
};

// Open MPI's mpirun binds each rank to one core when it starts two ranks or fewer (to a socket above), unless
// told otherwise with --bind-to. A rank driving a GPU then runs all of its host work on one core: CPU
// offload's optimizer (an OpenMP region sized by that affinity), the gradient norm, the data loader. On the
// first GPU run (2026-11-25, `mpirun -np 1` on a 16-core H200 machine) the offloaded seed step took 4.7x the
// step without offload, about 240 ms of it the host update on one core.
//
// So, called early on the main thread (before OpenMP, CUDA or any worker thread starts, since threads keep
// the affinity they were created with), this widens the affinity to every CPU the process's cgroup allows
// when (a) the binding is the launcher's default, not one asked for: Open MPI marks a rank it bound with
// OMPI_MCA_orte_bound_at_launch=1 and passes an explicit --bind-to as OMPI_MCA_hwloc_base_binding_policy,
// and (b) the binding leaves the rank fewer cores than its share, allowed / ranks_sharing (a socket binding
// usually does not). `policy` is SHARDTRAIN_CPU_BINDING's value: "" or "auto" for that rule, "keep" never
// releases, "release" releases any binding narrower than the share (taskset's, srun's --cpu-bind too).
// Anything else is a ConfigError naming the variable.
CpuBinding adjust_cpu_binding(int ranks_sharing, const std::string& policy);

}  // namespace shardtrain
