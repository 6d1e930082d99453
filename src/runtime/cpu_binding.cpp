// Releasing a launcher's default one-core binding (include/shardtrain/runtime/cpu_binding.hpp).
#include "shardtrain/runtime/cpu_binding.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain {
namespace {

bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && value == v;
}

// Every CPU the kernel knows of; sched_setaffinity keeps those the process's cpuset allows.
cpu_set_t all_cpus() {
  cpu_set_t all;
  CPU_ZERO(&all);
  const long n = std::min<long>(sysconf(_SC_NPROCESSORS_CONF), CPU_SETSIZE);
  for (long c = 0; c < n; ++c) CPU_SET(static_cast<int>(c), &all);
  return all;
}

}  // namespace

CpuBinding adjust_cpu_binding(int ranks_sharing, const std::string& policy) {
  if (!policy.empty() && policy != "auto" && policy != "keep" && policy != "release") {
    throw ConfigError(fmt::format("SHARDTRAIN_CPU_BINDING='{}': expected auto, keep or release", policy));
  }
  CpuBinding b;
  b.cores_at_start = b.cores = b.allowed = usable_cores();
  cpu_set_t start;
  CPU_ZERO(&start);
  if (sched_getaffinity(0, sizeof(start), &start) != 0) {
    b.reason = "the affinity could not be read";
    return b;
  }
  // The widest affinity the process may have, found by asking for every CPU (the kernel intersects the
  // request with the cgroup's cpuset); put back below unless the binding is released.
  const cpu_set_t all = all_cpus();
  if (sched_setaffinity(0, sizeof(all), &all) != 0) {
    b.reason = "the affinity could not be widened";
    return b;
  }
  b.allowed = usable_cores();
  const int share = std::max(1, b.allowed / std::max(1, ranks_sharing));

  const bool launcher_default =
      env_is("OMPI_MCA_orte_bound_at_launch", "1") && std::getenv("OMPI_MCA_hwloc_base_binding_policy") == nullptr;
  if (b.cores_at_start >= share) {
    b.reason = fmt::format("{} of the {} cores this process may use, its share at {} per machine", b.cores_at_start,
                           b.allowed, ranks_sharing);
  } else if (policy == "keep") {
    b.reason = "kept (SHARDTRAIN_CPU_BINDING=keep)";
  } else if (policy == "release") {
    b.released = true;
    b.reason = "released (SHARDTRAIN_CPU_BINDING=release)";
  } else if (launcher_default) {
    b.released = true;
    b.reason = "released: Open MPI's default binding (mpirun without --bind-to binds each of 2 ranks or fewer to one core)";
  } else {
    b.reason = "kept: the launcher was asked for it (mpirun --bind-to, srun --cpu-bind, taskset)";
  }
  if (!b.released) {
    sched_setaffinity(0, sizeof(start), &start);
  }
  b.cores = usable_cores();
  return b;
}

}  // namespace shardtrain
