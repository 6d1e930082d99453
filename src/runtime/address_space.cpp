// The process's address-space limit and what it leaves (address_space.hpp).
#include "shardtrain/runtime/address_space.hpp"

#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace shardtrain {
namespace {
std::string bytes_text(double bytes) { return format_bytes(static_cast<uint64_t>(std::clamp(bytes, 0.0, 1.8e19))); }
}  // namespace

double AddressSpace::room() const { return std::max(limit - mapped - kept, 0.0); }

std::string AddressSpace::describe() const {
  return fmt::format(
      "the process's address-space limit (ulimit -v: {}; {} mapped already, {} kept for threads and OpenBLAS's "
      "buffers)",
      bytes_text(limit), bytes_text(mapped), bytes_text(kept));
}

std::optional<AddressSpace> address_space_limit(int host_threads) {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
  AddressSpace a;
  a.limit = static_cast<double>(r.rlim_cur);
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) a.mapped = std::stod(line.substr(7)) * 1024;  // "VmSize:  1309752 kB"
  const double mib = 1024.0 * 1024.0, threads = std::max(host_threads, 1);
  a.kept = 128 * mib * (threads + 1) + 64 * mib * (threads + 4);
  return a;
}

void check_address_space(int host_threads, const std::string& command) {
  const auto as = address_space_limit(host_threads);
  if (!as || as->limit - as->mapped >= as->kept) return;
  throw Error(
      ExitCode::Device,
      fmt::format("out of host memory before {} started: {} leaves {}, less than the threads and OpenBLAS's "
                  "buffers take (OpenBLAS would wait for memory without end): {}",
                  command, as->describe(), bytes_text(std::max(as->limit - as->mapped, 0.0)), kRaiseAddressSpaceLimit));
}

}  // namespace shardtrain
