// The CUDA emulator's shared core (SHARDTRAIN_CUDA=EMULATED builds; see docs/gpu.md "The whole CUDA backend
// on the host"): device memory, streams and the schedule that runs their work. cuda_runtime.cpp implements the
// runtime API on top of it (devices.cpp the device queries, errors.cpp the last error), cublaslt.cpp and
// nccl.cpp queue their work through it, and the SIMT emulator's launches reach it through
// simt_emulator::RuntimeHooks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain::cuda_emulator {

// Queues `work` on `stream` (a cudaStream_t; null or cudaStreamLegacy is the legacy default stream). `what`
// names it in error messages. Under SHARDTRAIN_CUDA_EMULATOR_SCHEDULE=immediate it runs before this returns.
void submit(void* stream, std::function<void()> work, const char* what);

// Counts one call of `name` for SHARDTRAIN_CUDA_EMULATOR_CALLS (nothing when it is not set). submit counts
// its `what` itself.
void count_call(const char* name);

// Where a pointer lies.
enum class Memory { Device, Pinned, Other };
Memory classify(const void* p);

// [p, p + bytes) must lie inside one live cudaMalloc allocation (or cudaMallocHost, when pinned_ok), else the
// process stops with a message naming `what`. bytes 0: p may also be one past the end. Null passes.
void require_device_range(const void* p, size_t bytes, const char* what, bool pinned_ok = true);

// The streams' dependency graph, for tests that assert a schedule's structure (tests/fsdp/schedule_checker.hpp):
// between trace_begin() and trace_end(), every op queued on a stream is listed in queue order, each
// cudaStreamWaitEvent with the op it waits for (also when that has run already: the dependency is in the
// program either way), and each copy with where its ends lie. The process's own thread only (tests call it
// around one engine's work).
struct TraceOp {
  uint64_t seq = 0;              // queue order, process-wide (an op's own number; waits for done work get one too)
  const void* stream = nullptr;  // the cudaStream_t; nullptr: the legacy default stream
  std::string what;              // as queued: "kernel launch", "ncclAllGather", "cudaEventRecord", "cudaStreamWaitEvent",
                                 // "memcpy", "cudaLaunchHostFunc", "implicit synchronization", ...; "mark" for trace_mark
  uint64_t waits_for = 0;        // a wait: the seq of the op it waits for (a record; 0: an event never recorded)
  std::string detail;            // a copy: "<src>-><dst>" with each end "device", "pinned" or "pageable"; a mark: its label
  size_t bytes = 0;              // a copy's size
};
void trace_begin();
std::vector<TraceOp> trace_end();
// Puts a label into the trace at this point of queue order (what the test knows and the device does not:
// "unit 3 forward begins").
void trace_mark(std::string label);

// What the emulated device reports as its memory (an H100's 80 GB); cudaMalloc refuses more.
inline constexpr size_t kDeviceMemory = size_t{80} << 30;

// Sets the runtime's last error (cudaGetLastError) to `e` and returns it; a non-empty `message` goes to stderr
// first, as every failed call of the emulator says why (devices.cpp's calls fail through this).
cudaError_t record_error(cudaError_t e, const std::string& message);

// Stops the process with `message` on stderr: the emulator's way to report what a GPU would fault on.
[[noreturn]] void fatal(const std::string& message);

}  // namespace shardtrain::cuda_emulator
