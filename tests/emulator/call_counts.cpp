// Call counts of the CUDA emulator. SHARDTRAIN_CUDA_EMULATOR_CALLS=FILE appends, when the process exits, a
// line "<pid> <name> <count>" for every kind of call it made: the runtime calls that allocate, free, create,
// destroy, copy, record and wait (cuda_runtime.cpp), the cuBLASLt calls that build descriptors and pick
// algorithms (cublaslt.cpp), NCCL's communicator set-up (nccl.cpp), and every piece of queued device work by
// what it is ("kernel launch", "cublasLtMatmul", "ncclAllGather", ...: submit() counts them). The same run
// for a few more steps shows what a step costs: what it creates (nothing, in a steady state) and how much it
// queues (tests/train/host_waits_test.py).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tests/emulator/cuda_emulator.hpp"

namespace shardtrain::cuda_emulator {
namespace {

struct Counts {
  std::mutex mutex;
  int fd = -1;  // none: counting is off
  std::unordered_map<std::string, uint64_t> calls;

  Counts() {
    const char* path = std::getenv("SHARDTRAIN_CUDA_EMULATOR_CALLS");
    if (path == nullptr || *path == '\0') return;
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) fatal(std::string("SHARDTRAIN_CUDA_EMULATOR_CALLS=") + path + ": " + std::strerror(errno));
    std::atexit(write_all);
  }

  // At exit, the counts in one write (ranks may share the file).
  static void write_all();
};

Counts& counts() {
  static Counts* c = new Counts;  // never destroyed: work may still be counted during static destruction
  return *c;
}

void Counts::write_all() {
  Counts& c = counts();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::string text;
  for (const auto& [name, n] : c.calls) text += std::to_string(getpid()) + " " + name + " " + std::to_string(n) + "\n";
  if (!text.empty() && write(c.fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    std::fprintf(stderr, "cuda emulator: SHARDTRAIN_CUDA_EMULATOR_CALLS: write failed\n");
}

}  // namespace

void count_call(const char* name) {
  Counts& c = counts();
  if (c.fd < 0) return;
  std::lock_guard<std::mutex> lock(c.mutex);
  ++c.calls[name];
}

}  // namespace shardtrain::cuda_emulator
