// The SIMT emulator (simt_emulator.hpp) and the host side of kernels/simt.cuh it implements.
//
// Fibers: each is entered the first time through makecontext/swapcontext, and from then on switched with
// _setjmp/_longjmp, which (unlike swapcontext) leave the signal mask alone and so make no system call. A fiber
// never returns: it runs the kernel body for one block after another and parks at Wait::Done in between, so
// its stack and context are made once per emulator, not once per block.
#undef _FORTIFY_SOURCE  // __longjmp_chk refuses jumps between stacks, which is what fibers are
#include "tests/emulator/simt_emulator.hpp"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define SHARDTRAIN_SIMT_EMULATOR 1
#include "kernels/simt.cuh"

namespace shardtrain::simt_emulator {
namespace {

enum class Wait { None, Barrier, Shuffle, Mma, Ldmatrix, Done };

const char* wait_name(Wait w) {
  switch (w) {
    case Wait::None: return "running";
    case Wait::Barrier: return "__syncthreads";
    case Wait::Shuffle: return "__shfl_sync";
    case Wait::Mma: return "mma.sync";
    case Wait::Ldmatrix: return "ldmatrix";
    case Wait::Done: return "exited";
  }
  return "?";
}

struct Fiber {
  ucontext_t ctx{};  // for the first entry only
  jmp_buf jump{};    // where the fiber continues
  bool started = false;
  char* stack = nullptr;  // kStackBytes from Emulator::stacks
  int tid = 0;
  Wait wait = Wait::None;
  // Deposits of a barrier or warp collective, and its results.
  bool pred = false;
  unsigned char value[8]{};  // a shuffle's operand (value_bytes of it), then its result
  size_t value_bytes = 0;
  simt::ShuffleKind shuffle_kind = simt::ShuffleKind::Xor;
  int shuffle_operand = 0;
  uint32_t a[4]{}, b[2]{};
  float c[4]{};
  const uint16_t* ld_row = nullptr;  // ldmatrix: this lane's row address, the matrix count, .trans; the result in a
  int ld_matrices = 0;
  bool ld_trans = false;
  // cp.async copies not yet written: the 16 bytes read at issue, and the group (open_group while uncommitted).
  struct AsyncCopy {
    void* dst;
    unsigned char bytes[16];
    long long group;
  };
  std::vector<AsyncCopy> async_copies;
  long long open_group = 0;
};

constexpr size_t kStackBytes = 256 * 1024;

// A fiber stack of kStackBytes with a PROT_NONE guard page below it: an overflow faults at once instead of
// overwriting whatever lies below.
class FiberStack {
 public:
  FiberStack() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kStackBytes + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("simt: cannot map a fiber stack");
    base_ = static_cast<char*>(p);
    mprotect(base_, page_, PROT_NONE);
  }
  ~FiberStack() { munmap(base_, kStackBytes + page_); }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  char* stack() const { return base_ + page_; }

 private:
  char* base_ = nullptr;
  size_t page_ = 0;
};

struct Emulator {
  jmp_buf scheduler{};
  std::vector<Fiber> fibers;                        // one per thread of the block
  std::vector<std::unique_ptr<FiberStack>> stacks;  // grows to the largest block seen; reused by every launch
  Fiber* current = nullptr;
  Dim3 grid, block_index;
  std::vector<unsigned char> smem;
  std::map<const void*, std::vector<unsigned char>> static_smem;  // ST_SHARED arrays of the running block
  std::map<const void*, int> max_dynamic_smem;                    // cudaFuncSetAttribute, per kernel
  const std::function<void()>* body = nullptr;
  Schedule schedule = Schedule::Lockstep;
  Stats stats;
};

Emulator& emu() {
  static Emulator e;
  return e;
}

Fiber& self() {
  Fiber* f = emu().current;
  if (!f) throw std::logic_error("simt: a kernel primitive was called outside simt_emulator::launch");
  return *f;
}

// Leave the fiber at a rendezvous point; the scheduler resumes it once the point is complete.
void wait_at(Wait w) {
  Fiber& f = self();
  f.wait = w;
  if (_setjmp(f.jump) == 0) _longjmp(emu().scheduler, 1);
}

// A fiber's whole life: the body for the current block, then park until the scheduler starts the next block.
void fiber_main() {
  for (;;) {
    (*emu().body)();
    wait_at(Wait::Done);
  }
}

// Runs fiber f until it waits somewhere.
void resume(Emulator& e, Fiber& f) {
  e.current = &f;
  if (_setjmp(e.scheduler) == 0) {
    if (f.started) _longjmp(f.jump, 1);
    f.started = true;
    ucontext_t from;
    swapcontext(&from, &f.ctx);  // never comes back here: the fiber jumps to e.scheduler
  }
  e.current = nullptr;
}

float bf16_lo(uint32_t r) { return float_from_bf16_bits(static_cast<uint16_t>(r & 0xffffu)); }
float bf16_hi(uint32_t r) { return float_from_bf16_bits(static_cast<uint16_t>(r >> 16)); }

// d = a b + c for one warp, from the fragments each lane deposited (layouts in kernels/simt.cuh).
void complete_mma(Fiber* lanes) {
  float A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const Fiber& f = lanes[lane];
    const int g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; ++half) {  // a[0..3]: rows g, g+8; cols 2t.., 2t+8..
      const int row = g + 8 * half;
      A[row][2 * t] = bf16_lo(f.a[half]);
      A[row][2 * t + 1] = bf16_hi(f.a[half]);
      A[row][2 * t + 8] = bf16_lo(f.a[2 + half]);
      A[row][2 * t + 9] = bf16_hi(f.a[2 + half]);
    }
    B[2 * t][g] = bf16_lo(f.b[0]);
    B[2 * t + 1][g] = bf16_hi(f.b[0]);
    B[2 * t + 8][g] = bf16_lo(f.b[1]);
    B[2 * t + 9][g] = bf16_hi(f.b[1]);
    for (int i = 0; i < 4; ++i) C[g + 8 * (i / 2)][2 * t + i % 2] = f.c[i];
  }
  for (int lane = 0; lane < 32; ++lane) {
    Fiber& f = lanes[lane];
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      double acc = 0.0;  // products of bf16 are exact in fp32; the hardware's summation order is unspecified
      for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(B[k][col]);
      f.c[i] = static_cast<float>(acc + double(C[row][col]));
    }
  }
}

bool in_shared_memory(const Emulator& e, const void* p, size_t bytes) {
  const auto inside = [&](const unsigned char* base, size_t size) {
    const auto* q = static_cast<const unsigned char*>(p);
    return size > 0 && q >= base && q + bytes <= base + size;
  };
  if (inside(e.smem.data(), e.smem.size())) return true;
  for (const auto& [site, block] : e.static_smem)
    if (inside(block.data(), block.size())) return true;
  return false;
}

// ldmatrix for one warp (layout in kernels/simt.cuh): lane l addressed row l % 8 of matrix l / 8.
void complete_ldmatrix(const Emulator& e, Fiber* lanes, int warp, const std::string& at) {
  const int count = lanes[0].ld_matrices;
  for (int l = 0; l < 32; ++l) {
    const Fiber& f = lanes[l];
    if (f.ld_matrices != count || f.ld_trans != lanes[0].ld_trans)
      throw std::runtime_error("simt: lanes of warp " + std::to_string(warp) + " run different ldmatrix shapes in " + at);
    if (l >= 8 * count) continue;  // these lanes' addresses are not used
    if (reinterpret_cast<uintptr_t>(f.ld_row) % 16 != 0)
      throw std::runtime_error("simt: ldmatrix row address of lane " + std::to_string(l) + " of warp " +
                               std::to_string(warp) + " is not 16-byte aligned in " + at);
    if (!in_shared_memory(e, f.ld_row, 16))
      throw std::runtime_error("simt: ldmatrix row address of lane " + std::to_string(l) + " of warp " +
                               std::to_string(warp) + " is not in shared memory in " + at);
  }
  uint32_t out[32][4]{};
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < count; ++i) {
      const Fiber* m = lanes + 8 * i;  // the lanes that addressed matrix i's rows
      uint16_t lo, hi;
      if (lanes[0].ld_trans) {
        lo = m[2 * t].ld_row[g];
        hi = m[2 * t + 1].ld_row[g];
      } else {
        lo = m[g].ld_row[2 * t];
        hi = m[g].ld_row[2 * t + 1];
      }
      out[l][i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
  for (int l = 0; l < 32; ++l) std::memcpy(lanes[l].a, out[l], sizeof out[l]);
}

std::string describe(const std::vector<Fiber>& fibers) {
  std::string out;
  for (size_t w = 0; w < fibers.size() / 32; ++w) {
    out += " warp " + std::to_string(w) + ":";
    Wait last = Wait::None;
    for (size_t l = 0; l < 32; ++l) {
      const Wait x = fibers[w * 32 + l].wait;
      if (l == 0 || x != last) out += " lane " + std::to_string(l) + "+ " + wait_name(x);
      last = x;
    }
    out += ";";
  }
  return out;
}

std::string where(const Emulator& e, int bx, int by, int bz) {
  return "block (" + std::to_string(bx) + ", " + std::to_string(by) + ", " + std::to_string(bz) + ") of grid (" +
         std::to_string(e.grid.x) + ", " + std::to_string(e.grid.y) + ", " + std::to_string(e.grid.z) + ")";
}

// Runs every fiber to its next rendezvous, then completes what can be completed; until all have exited.
void run_block(Emulator& e, int bx, int by, int bz) {
  std::vector<Fiber>& fibers = e.fibers;
  const int n = static_cast<int>(fibers.size());
  for (Fiber& f : fibers) {
    f.wait = Wait::None;  // a started fiber parked at Done goes round its loop into the body again
    if (f.started) continue;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;  // fiber_main never returns
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::memset(e.smem.data(), 0xff, e.smem.size());
  e.static_smem.clear();
  for (;;) {
    // Threads run between rendezvous one after another: in index order, or (Reversed) the last thread first,
    // so that a write by a high thread lands before a low thread's read that a missing barrier no longer orders.
    for (int i = 0; i < n; ++i) {
      Fiber& f = fibers[static_cast<size_t>(e.schedule == Schedule::Reversed ? n - 1 - i : i)];
      if (f.wait != Wait::None) continue;
      resume(e, f);
    }
    bool progress = false;
    const int warps = n / 32;
    for (int i = 0; i < warps && !(progress && e.schedule != Schedule::Lockstep); ++i) {
      const int w = e.schedule == Schedule::Reversed ? warps - 1 - i : i;
      Fiber* lanes = &fibers[static_cast<size_t>(w) * 32];
      const Wait kind = lanes[0].wait;
      if (kind != Wait::Shuffle && kind != Wait::Mma && kind != Wait::Ldmatrix) continue;
      bool all = true;
      for (int l = 1; l < 32; ++l) all = all && lanes[l].wait == kind;
      if (!all) continue;
      if (kind == Wait::Shuffle) {
        unsigned char values[32][8];
        for (int l = 0; l < 32; ++l) std::memcpy(values[l], lanes[l].value, sizeof values[l]);
        for (int l = 0; l < 32; ++l) {
          const Fiber& f = lanes[l];
          if (f.shuffle_kind != lanes[0].shuffle_kind || f.shuffle_operand != lanes[0].shuffle_operand ||
              f.value_bytes != lanes[0].value_bytes)
            throw std::runtime_error("simt: lanes of warp " + std::to_string(w) +
                                     " shuffle with different kinds, operands or types in " + where(e, bx, by, bz));
          // xor: the lane (l ^ mask) of the warp; up: lane l - delta, or l itself when that is below 0.
          const int src = f.shuffle_kind == simt::ShuffleKind::Xor ? l ^ (f.shuffle_operand & 31)
                                                                   : (l >= f.shuffle_operand ? l - f.shuffle_operand : l);
          std::memcpy(lanes[l].value, values[src], sizeof values[src]);
        }
      } else if (kind == Wait::Ldmatrix) {
        complete_ldmatrix(e, lanes, w, where(e, bx, by, bz));
        ++e.stats.ldmatrices;
      } else {
        complete_mma(lanes);
        ++e.stats.mmas;
      }
      ++e.stats.warp_collectives;
      for (int l = 0; l < 32; ++l) lanes[l].wait = Wait::None;
      progress = true;
    }
    if (progress) continue;
    int done = 0, at_barrier = 0;
    for (const Fiber& f : fibers) {
      done += f.wait == Wait::Done;
      at_barrier += f.wait == Wait::Barrier;
    }
    if (done == n) {
      for (const Fiber& f : fibers)
        if (!f.async_copies.empty())
          throw std::runtime_error("simt: thread " + std::to_string(f.tid) + " exits with " +
                                   std::to_string(f.async_copies.size()) + " cp.async copies it never waited for in " +
                                   where(e, bx, by, bz));
      return;
    }
    if (at_barrier == n) {
      bool any = false;
      for (const Fiber& f : fibers) any = any || f.pred;
      for (Fiber& f : fibers) {
        f.pred = any;
        f.wait = Wait::None;
      }
      ++e.stats.barriers;
      continue;
    }
    throw std::runtime_error("simt: deadlock or divergent barrier/collective in " + where(e, bx, by, bz) + ":" +
                             describe(fibers));
  }
}

}  // namespace

void launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  if (threads <= 0 || threads % 32 != 0 || threads > 1024)
    throw std::invalid_argument("simt_emulator::launch: threads must be a multiple of 32, at most 1024");
  Emulator& e = emu();
  e.grid = grid;
  e.body = &body;
  e.stats = Stats{};
  if (e.fibers.size() != static_cast<size_t>(threads)) {
    while (e.stacks.size() < static_cast<size_t>(threads)) e.stacks.push_back(std::make_unique<FiberStack>());
    e.fibers.assign(static_cast<size_t>(threads), Fiber{});
    for (int i = 0; i < threads; ++i) {
      e.fibers[static_cast<size_t>(i)].tid = i;
      e.fibers[static_cast<size_t>(i)].stack = e.stacks[static_cast<size_t>(i)]->stack();
    }
  }
  e.smem.assign(smem_bytes, 0xff);
  try {
    for (int z = 0; z < grid.z; ++z)
      for (int y = 0; y < grid.y; ++y)
        for (int x = 0; x < grid.x; ++x) {
          e.block_index = Dim3{x, y, z};
          run_block(e, x, y, z);
        }
  } catch (...) {
    for (Fiber& f : e.fibers) {
      f.started = false;  // abandoned mid-body: the next launch starts them afresh
      f.async_copies.clear();
    }
    e.body = nullptr;
    throw;
  }
  e.body = nullptr;
}

Stats last_stats() { return emu().stats; }
void set_schedule(Schedule s) { emu().schedule = s; }

// The limits a launch on the GPUs shardtrain builds for (sm_80, sm_90) must respect.
constexpr size_t kDefaultDynamicSmem = 48 * 1024;  // without cudaFuncSetAttribute
constexpr size_t kMaxDynamicSmem = 227 * 1024;     // sm_90's opt-in maximum per block (sm_80: 163 KiB)
constexpr unsigned kMaxGridYZ = 65535;

}  // namespace shardtrain::simt_emulator

namespace shardtrain::simt {

using simt_emulator::emu;

void set_max_dynamic_smem(const void* kernel, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > simt_emulator::kMaxDynamicSmem)
    throw std::runtime_error("simt: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " + std::to_string(bytes) +
                             ") is beyond what a GPU allows (" + std::to_string(simt_emulator::kMaxDynamicSmem) + ")");
  emu().max_dynamic_smem[kernel] = bytes;
}

void count_access16() { ++emu().stats.accesses16; }

void misaligned_access(const void* dst, const void* src, int bytes) {
  const auto& e = emu();
  std::string at;
  if (e.current)
    at = " by thread " + std::to_string(e.current->tid) + " of block (" + std::to_string(e.block_index.x) + ", " +
         std::to_string(e.block_index.y) + ", " + std::to_string(e.block_index.z) + ")";
  std::fprintf(stderr, "simt: misaligned address: a %d-byte access from %p to %p%s (both must be %d-byte aligned)\n", bytes,
               src, dst, at.c_str(), bytes);
  std::fflush(stderr);
  std::abort();
}

void check_launch(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes) {
  auto& e = emu();
  if (block.y != 1 || block.z != 1) throw std::runtime_error("simt: the emulator runs one-dimensional blocks only");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > simt_emulator::kMaxGridYZ ||
      grid.z > simt_emulator::kMaxGridYZ || grid.x > 0x7fffffffu)
    throw std::runtime_error("simt: invalid grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
                             std::to_string(grid.z) + ")");
  size_t allowed = simt_emulator::kDefaultDynamicSmem;
  if (auto it = e.max_dynamic_smem.find(kernel); it != e.max_dynamic_smem.end())
    allowed = std::max(allowed, static_cast<size_t>(it->second));
  if (smem_bytes > allowed)
    throw std::runtime_error("simt: a launch asks for " + std::to_string(smem_bytes) +
                             " bytes of dynamic shared memory, the kernel allows " + std::to_string(allowed) +
                             " (cudaFuncSetAttribute MaxDynamicSharedMemorySize)");
}

void launch_emulated(const void* kernel, dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  check_launch(kernel, grid, block, smem_bytes);
  simt_emulator::launch(simt_emulator::Dim3{static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z)},
                        static_cast<int>(block.x), smem_bytes, body);
}

}  // namespace shardtrain::simt

namespace shardtrain::simt_emulator {
namespace {
RuntimeHooks runtime_hooks;  // constant-initialized: set before or after, never half
}  // namespace
void set_runtime_hooks(const RuntimeHooks& hooks) { runtime_hooks = hooks; }
}  // namespace shardtrain::simt_emulator

namespace shardtrain::simt {

void submit(void* stream, std::function<void()> work, const char* what) {
  if (simt_emulator::runtime_hooks.submit) {
    simt_emulator::runtime_hooks.submit(stream, std::move(work), what);
  } else {
    work();
  }
}

void check_device_range(const void* p, size_t bytes, const char* what) {
  if (simt_emulator::runtime_hooks.check_device_range) simt_emulator::runtime_hooks.check_device_range(p, bytes, what);
}

}  // namespace shardtrain::simt

namespace shardtrain::simt {

using simt_emulator::emu;
using simt_emulator::Fiber;
using simt_emulator::self;
using simt_emulator::Wait;
using simt_emulator::wait_at;

int thread_x() { return self().tid; }
int block_x() { return emu().block_index.x; }
int block_y() { return emu().block_index.y; }
int block_z() { return emu().block_index.z; }
int block_dim_x() { return static_cast<int>(emu().fibers.size()); }
int grid_x() { return emu().grid.x; }
int grid_y() { return emu().grid.y; }

void sync() {
  self().pred = false;
  wait_at(Wait::Barrier);
}

bool sync_or(bool p) {
  self().pred = p;
  wait_at(Wait::Barrier);
  return self().pred;
}

void shuffle(void* value, size_t bytes, ShuffleKind kind, int operand) {
  Fiber& f = self();
  std::memcpy(f.value, value, bytes);
  f.value_bytes = bytes;
  f.shuffle_kind = kind;
  f.shuffle_operand = operand;
  wait_at(Wait::Shuffle);
  std::memcpy(value, self().value, bytes);
}

void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  auto& f = self();
  std::memcpy(f.a, a, sizeof f.a);
  std::memcpy(f.b, b, sizeof f.b);
  std::memcpy(f.c, d, sizeof f.c);
  wait_at(Wait::Mma);
  std::memcpy(d, self().c, sizeof self().c);
}

void ldmatrix(uint32_t* r, int matrices, bool trans, const uint16_t* row) {
  Fiber& f = self();
  f.ld_row = row;
  f.ld_matrices = matrices;
  f.ld_trans = trans;
  wait_at(Wait::Ldmatrix);
  std::memcpy(r, self().a, sizeof(uint32_t) * static_cast<size_t>(matrices));
}

void cp_async16(void* smem_dst, const void* global_src) {
  if ((reinterpret_cast<uintptr_t>(smem_dst) | reinterpret_cast<uintptr_t>(global_src)) % 16 != 0)
    misaligned_access(smem_dst, global_src, 16);
  if (!simt_emulator::in_shared_memory(emu(), smem_dst, 16)) {  // the GPU faults: stop, as misaligned_access does
    std::fprintf(stderr, "simt: cp.async destination %p (thread %d) is not in shared memory\n", smem_dst, self().tid);
    std::fflush(stderr);
    std::abort();
  }
  ++emu().stats.async_copies;
  count_access16();
  // The GPU lands a copy any time between the issue and the wait: at once under Lockstep (a buffer still being
  // read is overwritten early), at the wait under the other schedules (a read before it sees stale bytes).
  if (emu().schedule == simt_emulator::Schedule::Lockstep) {
    std::memcpy(smem_dst, global_src, 16);
    return;
  }
  Fiber& f = self();
  Fiber::AsyncCopy c{smem_dst, {}, f.open_group};
  std::memcpy(c.bytes, global_src, sizeof c.bytes);
  f.async_copies.push_back(c);
}

void cp_async_commit() { ++self().open_group; }

void cp_async_wait_group(int n) {
  Fiber& f = self();
  std::vector<Fiber::AsyncCopy> still;
  for (const Fiber::AsyncCopy& c : f.async_copies) {
    // Committed groups are open_group - 1, open_group - 2, ...; the newest n of them may stay in flight.
    if (c.group < f.open_group - n) {
      std::memcpy(c.dst, c.bytes, sizeof c.bytes);
    } else {
      still.push_back(c);
    }
  }
  f.async_copies = std::move(still);
}

unsigned char* dynamic_smem() { return emu().smem.data(); }

void* static_smem(const void* site, size_t bytes) {
  (void)self();  // only from inside a launch
  std::vector<unsigned char>& block = emu().static_smem[site];
  if (block.empty()) block.assign(bytes, 0xff);
  if (block.size() != bytes) throw std::logic_error("simt: one ST_SHARED site asked for two sizes");
  return block.data();
}

}  // namespace shardtrain::simt
