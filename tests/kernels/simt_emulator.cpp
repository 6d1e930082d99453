// The SIMT emulator (simt_emulator.hpp) and the host side of kernels/simt.cuh it implements.
#include "tests/kernels/simt_emulator.hpp"

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#define SHARDTRAIN_SIMT_EMULATOR 1
#include "kernels/simt.cuh"

namespace shardtrain::simt_emulator {
namespace {

enum class Wait { None, Barrier, Shuffle, Mma, Done };

const char* wait_name(Wait w) {
  switch (w) {
    case Wait::None: return "running";
    case Wait::Barrier: return "__syncthreads";
    case Wait::Shuffle: return "__shfl_xor_sync";
    case Wait::Mma: return "mma.sync";
    case Wait::Done: return "exited";
  }
  return "?";
}

struct Fiber {
  ucontext_t ctx{};
  std::vector<char> stack;
  int tid = 0;
  Wait wait = Wait::None;
  // Deposits of a barrier or warp collective, and its results.
  bool pred = false;
  float value = 0.f;
  int lane_mask = 0;
  uint32_t a[4]{}, b[2]{};
  float c[4]{};
};

constexpr size_t kStackBytes = 256 * 1024;

struct Emulator {
  ucontext_t scheduler{};
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  Dim3 grid, block_index;
  std::vector<unsigned char> smem;
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
  swapcontext(&f.ctx, &emu().scheduler);
}

void fiber_main() {
  (*emu().body)();
  emu().current->wait = Wait::Done;  // returning resumes the scheduler through uc_link
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
    f.wait = Wait::None;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &e.scheduler;
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::memset(e.smem.data(), 0xff, e.smem.size());
  for (;;) {
    for (Fiber& f : fibers) {
      if (f.wait != Wait::None) continue;
      e.current = &f;
      swapcontext(&e.scheduler, &f.ctx);
      e.current = nullptr;
    }
    bool progress = false;
    const int warps = n / 32;
    for (int i = 0; i < warps && !(progress && e.schedule != Schedule::Lockstep); ++i) {
      const int w = e.schedule == Schedule::Reversed ? warps - 1 - i : i;
      Fiber* lanes = &fibers[static_cast<size_t>(w) * 32];
      const Wait kind = lanes[0].wait;
      if (kind != Wait::Shuffle && kind != Wait::Mma) continue;
      bool all = true;
      for (int l = 1; l < 32; ++l) all = all && lanes[l].wait == kind;
      if (!all) continue;
      if (kind == Wait::Shuffle) {
        float values[32];
        for (int l = 0; l < 32; ++l) values[l] = lanes[l].value;
        for (int l = 0; l < 32; ++l) {
          if (lanes[l].lane_mask != lanes[0].lane_mask)
            throw std::runtime_error("simt: lanes of warp " + std::to_string(w) + " shuffle with different masks in " +
                                     where(e, bx, by, bz));
          lanes[l].value = values[l ^ (lanes[l].lane_mask & 31)];
        }
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
    if (done == n) return;
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
    e.fibers.assign(static_cast<size_t>(threads), Fiber{});
    for (int i = 0; i < threads; ++i) {
      e.fibers[static_cast<size_t>(i)].tid = i;
      e.fibers[static_cast<size_t>(i)].stack.resize(kStackBytes);
    }
  }
  e.smem.assign(smem_bytes, 0xff);
  for (int z = 0; z < grid.z; ++z)
    for (int y = 0; y < grid.y; ++y)
      for (int x = 0; x < grid.x; ++x) {
        e.block_index = Dim3{x, y, z};
        run_block(e, x, y, z);
      }
  e.body = nullptr;
}

Stats last_stats() { return emu().stats; }
void set_schedule(Schedule s) { emu().schedule = s; }

}  // namespace shardtrain::simt_emulator

namespace shardtrain::simt {

using simt_emulator::emu;
using simt_emulator::self;
using simt_emulator::Wait;
using simt_emulator::wait_at;

int thread_x() { return self().tid; }
int block_x() { return emu().block_index.x; }
int block_y() { return emu().block_index.y; }
int block_z() { return emu().block_index.z; }
int grid_x() { return emu().grid.x; }

void sync() {
  self().pred = false;
  wait_at(Wait::Barrier);
}

bool sync_or(bool p) {
  self().pred = p;
  wait_at(Wait::Barrier);
  return self().pred;
}

float shfl_xor(float v, int lane_mask) {
  self().value = v;
  self().lane_mask = lane_mask;
  wait_at(Wait::Shuffle);
  return self().value;
}

void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  auto& f = self();
  std::memcpy(f.a, a, sizeof f.a);
  std::memcpy(f.b, b, sizeof f.b);
  std::memcpy(f.c, d, sizeof f.c);
  wait_at(Wait::Mma);
  std::memcpy(d, self().c, sizeof self().c);
}

unsigned char* dynamic_smem() { return emu().smem.data(); }

}  // namespace shardtrain::simt
