// The process's address-space limit (RLIMIT_AS, `ulimit -v`): what it leaves, and the start-up check that keeps a
// run short of it from hanging in OpenBLAS (docs/training.md, "The configuration").
#pragma once

#include <optional>
#include <string>

namespace shardtrain {

// Under such a limit a failed allocation is not always an error: OpenBLAS 0.3 retries a failed buffer allocation
// without end, so the first GEMM of a thread short of address space spins forever (a hang, not std::bad_alloc).
// `kept` is the room held back for what no plan counts, measured rather than assumed: a tiny CPU run grows from 1.3
// to 2.0 GB of address space on 2 threads (8 threads in all, each a stack and a malloc arena of up to 64 MiB; the
// OpenBLAS buffers, 128 MiB each on x86-64, one per thread that calls it at a time).
struct AddressSpace {
  double limit = 0;   // bytes
  double mapped = 0;  // bytes mapped now (VmSize)
  double kept = 0;    // bytes held back for threads and OpenBLAS's buffers
  double room() const;
  std::string describe() const;  // "the process's address-space limit (ulimit -v: ...; ... mapped already, ...)"
};

// nullopt when the address space is unlimited.
std::optional<AddressSpace> address_space_limit(int host_threads);

// What to do about a limit that is too tight, for the end of an error message.
inline constexpr const char* kRaiseAddressSpaceLimit =
    "raise the limit (`ulimit -v unlimited` before launching; under Slurm, submit with --propagate=NONE so the login "
    "shell's limit stays behind)";

// Throws a device error (exit code 7, out of host memory) when a limit leaves less than `kept`, before `command`
// calls OpenBLAS at all.
void check_address_space(int host_threads, const std::string& command);

}  // namespace shardtrain
