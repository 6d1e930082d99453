// The CUDA emulator's shared core (SHARDTRAIN_CUDA=EMULATED builds; see docs/gpu.md "The whole CUDA backend
// on the host"): device memory, streams and the schedule that runs their work. cuda_runtime.cpp implements the
// runtime API on top of it, cublaslt.cpp and nccl.cpp queue their work through it, and the SIMT emulator's
// launches reach it through simt_emulator::RuntimeHooks.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

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

// Stops the process with `message` on stderr: the emulator's way to report what a GPU would fault on.
[[noreturn]] void fatal(const std::string& message);

}  // namespace shardtrain::cuda_emulator
