// A SIMT emulator for kernels written against kernels/simt.cuh: runs a grid on the host, one block after
// another, every thread of a block a fiber (ucontext). A fiber runs until it reaches a barrier or a warp
// collective; when every thread of the block (or every lane of the warp) waits at the same kind of point, the
// scheduler completes it: __syncthreads(_or), __shfl_xor_sync / __shfl_up_sync, mma.sync m16n8k16 bf16
// computed from the fragment layouts of the PTX ISA, and ldmatrix (x4, .trans) from the layout the ISA gives.
// cp.async copies land at one of the two ends of what the GPU allows: when issued (Schedule::Lockstep), so a
// copy into a buffer other warps still read corrupts their reads, or when the issuing thread's wait_group
// completes their group (the other schedules), so a read before the wait, or before the barrier after it, sees
// stale bytes; a thread that exits with copies it never waited for is reported. Divergent barriers, mismatched warp
// collectives and deadlocks are reported as errors, not hangs. Shared memory (dynamic, and each ST_SHARED array per
// block) starts as 0xFF bytes (NaN as floats and bf16), so a read of an entry nobody wrote shows up in the results.
// simt::launch checks what the GPU would refuse: more than 48 KiB of dynamic shared memory without the
// function attribute, grid dimensions past their limits.
//
// What it checks: the kernels' own indexing, masking, tiling, online softmax and barrier structure, with the
// arithmetic of the real algorithm, and (through Schedule) missing barriers. What it cannot: timing, races
// none of the schedules provokes, and whether the GPU's fragment layout is the documented one
// (attention_kernel_test's MmaFragmentLayout checks that on a device).
#pragma once

#include <cstddef>
#include <functional>

namespace shardtrain::simt_emulator {

struct Dim3 {
  int x = 1, y = 1, z = 1;
};

// Runs body() once per thread of every block of `grid`, `threads` threads a block (a multiple of 32), with
// `smem_bytes` of dynamic shared memory per block. Throws std::runtime_error on a divergent barrier, a
// mismatched warp collective or a deadlock.
void launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body);

// The order warps advance in, between block barriers. Lockstep: every warp completes one collective per round
// (the warps stay together). InOrder / Reversed: the first (last) warp that can go on does, as far as it can
// before the others move: a warp runs ahead into the next step of a loop, so a missing barrier before shared
// memory is rewritten corrupts a slower warp's reads and shows up in the results. Between rendezvous the threads
// run one after another in index order, except under Reversed (the last thread first), so a write that a
// missing barrier no longer keeps behind the other threads' reads lands before them in one of the two orders.
enum class Schedule { Lockstep, InOrder, Reversed };
void set_schedule(Schedule s);

// The CUDA runtime emulator's hooks (tests/emulator/cuda_runtime.cpp, SHARDTRAIN_CUDA=EMULATED): where
// simt::launch and the launchers' asynchronous copies queue their work, and how a pointer handed to the device
// is checked. Without them (the kernel tests) work runs at once and pointers are not checked.
struct RuntimeHooks {
  void (*submit)(void* stream, std::function<void()> work, const char* what) = nullptr;
  void (*check_device_range)(const void* p, size_t bytes, const char* what) = nullptr;
};
void set_runtime_hooks(const RuntimeHooks& hooks);

// Counters of the last launch, for tests of the emulator itself.
struct Stats {
  long long barriers = 0;          // completed block barriers (per block)
  long long warp_collectives = 0;  // completed warp collectives (per warp)
  long long mmas = 0;              // of which mma.sync
  long long ldmatrices = 0;        // and of which ldmatrix
  long long accesses16 = 0;        // 16-byte loads and stores (simt::copy_aligned<16>, cp_async16)
  long long async_copies = 0;      // cp_async16
};
Stats last_stats();

}  // namespace shardtrain::simt_emulator
