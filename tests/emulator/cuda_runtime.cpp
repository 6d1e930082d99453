// The CUDA runtime API that shardtrain uses, implemented on the host (SHARDTRAIN_CUDA=EMULATED): what the
// CUDA backend's host code does with memory, streams and events runs as the CUDA documentation says a GPU
// may run it, and whatever a GPU would fault on stops the process with a message.
//
// Memory. cudaMalloc returns fresh pages filled with 0xFF bytes (NaN as fp32 and bf16: a read of memory that
// nothing wrote shows up in results) that the host cannot touch: they are PROT_NONE except while device work
// runs, so host code dereferencing a device pointer faults, and the fault is reported with the allocation it
// hit (SHARDTRAIN_CUDA_EMULATOR_PROTECT=0 leaves it accessible, for a debugger). Every pointer a kernel, a
// copy, a GEMM or a collective is given must lie in a live allocation.
//
// Streams. Work is queued per stream and runs only when the host waits, and then only what the wait needs:
// a stream or event synchronization (or a synchronous copy) runs that stream up to the point waited for,
// and, first, the work on other streams those ops wait for (cudaStreamWaitEvent, the legacy stream's
// implicit synchronization with blocking streams); streams nobody waits for stay behind. So a reader that
// should have waited for another stream's writer runs before it, and a writer queued later overtakes a
// reader it should have waited for. Device synchronization, cudaFree and cudaFreeHost run everything, the
// stream whose next op was queued last first (SHARDTRAIN_CUDA_EMULATOR_SCHEDULE=lifo, the default), or
// first (fifo); `immediate` runs all work before each call returns (a synchronous device); `lagging` is lifo
// where, before a wait runs what it needs, every other stream first runs as far as it can without the waited
// stream's pending work: that stream's readers then run after writers queued later elsewhere. Host buffers
// are read and written when the copy runs (pinned memory, and device-to-host copies into pageable memory),
// or read at the call (pageable sources, which the runtime stages): the documented latitudes of
// cudaMemcpyAsync.
//
// Devices: devices.cpp (how many, which CUDA_VISIBLE_DEVICES shows, their identities).
//
// Host waits. SHARDTRAIN_CUDA_EMULATOR_WAITS=FILE appends a line "<pid> <api>" for every call that made the
// host wait for device work not yet run (a synchronization, a synchronous copy, cudaFree): where a GPU run
// may stall the host. Waits for work already run are not listed; on a GPU they return at once.
//
// Calls: every API entry and every piece of queued work is counted (call_counts.cpp).
#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/emulator/cuda_emulator.hpp"
#include "tests/emulator/simt_emulator.hpp"

struct CUstream_st;
struct CUevent_st;

namespace shardtrain::cuda_emulator {
namespace {

using Clock = std::chrono::steady_clock;

struct Marker {
  bool done = false;
  uint64_t seq = 0;  // its op's (the trace's waits_for)
  Clock::time_point at{};
  CUstream_st* stream = nullptr;  // where its op is queued (until it is done)
};

struct Op {
  uint64_t seq = 0;
  const char* what = "";
  std::function<void()> work;    // empty: only a dependency
  std::shared_ptr<Marker> wait;  // must be done before this op runs
  std::shared_ptr<Marker> done;
};

enum class Policy { Lifo, Fifo, Immediate, Lagging };

}  // namespace
}  // namespace shardtrain::cuda_emulator

struct CUstream_st {
  std::deque<shardtrain::cuda_emulator::Op> queue;
  int priority = 0;  // cudaStreamCreateWithPriority's, clamped to the range (recorded; the schedule ignores it)
  std::shared_ptr<shardtrain::cuda_emulator::Marker> tail;  // done marker of the last op queued
  bool blocking = true;                                     // synchronizes with the legacy stream (cudaStreamDefault)
  bool destroyed = false;                                   // cudaStreamDestroy with work pending: freed once it has run
};

struct CUevent_st {
  std::shared_ptr<shardtrain::cuda_emulator::Marker> last;  // of the latest cudaEventRecord
  bool timing = true;
};

namespace shardtrain::cuda_emulator {
namespace {

struct Allocation {
  size_t bytes = 0;   // as asked for
  size_t mapped = 0;  // device: whole pages
  Memory kind = Memory::Device;
};

struct State {
  std::recursive_mutex mutex;
  Policy policy = Policy::Lifo;
  bool protect = true;
  CUstream_st legacy;
  std::vector<CUstream_st*> streams;            // the legacy stream first
  std::map<uintptr_t, Allocation> allocations;  // by base address
  std::map<uintptr_t, size_t> freed;            // recently freed device ranges, for messages
  size_t device_in_use = 0;
  uint64_t next_seq = 1;
  int running = 0;       // > 0 while queued work runs (device memory accessible)
  int waits_fd = -1;     // SHARDTRAIN_CUDA_EMULATOR_WAITS: where host waits for unfinished work are listed
  bool tracing = false;  // trace_begin .. trace_end
  std::vector<TraceOp> trace;

  State() {
    legacy.blocking = false;  // the legacy stream itself; blocking streams synchronize with it
    streams.push_back(&legacy);
    if (const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_SCHEDULE")) {
      const std::string v = s;
      if (v == "lifo") policy = Policy::Lifo;
      else if (v == "fifo") policy = Policy::Fifo;
      else if (v == "immediate") policy = Policy::Immediate;
      else if (v == "lagging") policy = Policy::Lagging;
      else fatal("SHARDTRAIN_CUDA_EMULATOR_SCHEDULE=" + v + ": expected lifo, fifo, immediate or lagging");
    }
    if (const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_PROTECT")) protect = std::string(s) != "0";
    if (const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_WAITS"); s && *s) {
      waits_fd = open(s, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (waits_fd < 0) fatal(std::string("SHARDTRAIN_CUDA_EMULATOR_WAITS=") + s + ": " + std::strerror(errno));
    }
  }
};

State& state() {
  static State* s = new State;  // never destroyed: static destructors of other objects may still free memory
  return *s;
}

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// The live allocation holding address a, or whose end a is (one past the end still belongs to it). The last
// allocation starting at or before a: the one starting at a, when one does, also when a ends another.
const Allocation* find_allocation(const State& g, uintptr_t a, uintptr_t* base) {
  auto it = g.allocations.upper_bound(a);
  if (it == g.allocations.begin()) return nullptr;
  --it;
  if (a > it->first + it->second.bytes) return nullptr;  // one past the end still belongs to it
  *base = it->first;
  return &it->second;
}

CUstream_st* resolve(State& g, void* stream) {
  auto* s = static_cast<CUstream_st*>(stream);
  if (s == nullptr || s == reinterpret_cast<CUstream_st*>(0x1) || s == reinterpret_cast<CUstream_st*>(0x2)) return &g.legacy;
  if (std::find(g.streams.begin(), g.streams.end(), s) == g.streams.end() || s->destroyed)
    fatal("work queued on stream " + hex(stream) + ", which is not a live stream (destroyed, or never created)");
  return s;
}

void set_device_access(State& g, bool on) {
  if (!g.protect) return;
  for (const auto& [base, a] : g.allocations) {
    if (a.kind != Memory::Device) continue;
    if (mprotect(reinterpret_cast<void*>(base), a.mapped, on ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
      fatal("mprotect failed on device memory at " + hex(reinterpret_cast<void*>(base)));
  }
}

// Device memory is accessible while queued work runs (from the first op a drain runs to its end).
struct DeviceAccess {
  State& g;
  bool on = false;
  void enable() {
    if (!on && g.running++ == 0) set_device_access(g, true);
    on = true;
  }
  ~DeviceAccess() {
    if (on && --g.running == 0) set_device_access(g, false);
  }
};

// Runs the op at the head of s, after whatever it waits for (which runs first, wherever it is queued).
void run_until(State& g, DeviceAccess& access, const std::shared_ptr<Marker>& m);
void run_head(State& g, DeviceAccess& access, CUstream_st* s) {
  const std::shared_ptr<Marker> dep = s->queue.front().wait;
  if (dep && !dep->done) run_until(g, access, dep);  // never s itself: a wait names earlier work
  Op op = std::move(s->queue.front());
  s->queue.pop_front();
  if (s->queue.empty() && s->destroyed) {
    g.streams.erase(std::find(g.streams.begin(), g.streams.end(), s));
    delete s;
  }
  if (op.work) {
    access.enable();
    try {
      op.work();
    } catch (const std::exception& e) {  // a kernel the SIMT emulator refused, say: name the queued work
      throw std::runtime_error(std::string(op.what) + " (queued device work): " + e.what());
    }
  }
  op.done->done = true;
  op.done->at = Clock::now();
}

// Runs what `m` needs and nothing else: its stream up to it, and the work on other streams that those ops
// wait for. Streams nobody waits for stay behind, as they may on a GPU.
void run_until(State& g, DeviceAccess& access, const std::shared_ptr<Marker>& m) {
  while (!m->done) run_head(g, access, m->stream);
}

// A host wait that found device work still to do: where a GPU run may stall the host. One line "<pid>
// <api>" per wait, appended in one write (ranks may share the file).
void note_wait(State& g, const char* api) {
  if (g.waits_fd < 0 || api == nullptr) return;  // null: the immediate schedule's own runs
  const std::string line = std::to_string(getpid()) + " " + api + "\n";
  if (write(g.waits_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    fatal("SHARDTRAIN_CUDA_EMULATOR_WAITS: write failed");
}

// lagging: before a wait runs what it needs, every other stream runs ahead as far as it can without work still
// queued on the waited stream, so the waited stream's readers run after writers queued later elsewhere.
void run_others_ahead(State& g, DeviceAccess& access, CUstream_st* waited) {
  for (bool progress = true; progress;) {
    progress = false;
    for (CUstream_st* s : g.streams) {
      while (s != waited && !s->queue.empty()) {
        const std::shared_ptr<Marker>& dep = s->queue.front().wait;
        if (dep && !dep->done) break;
        run_head(g, access, s);
        progress = true;
      }
      if (progress) break;  // the list may have changed (a destroyed stream released)
    }
  }
}

void drain_until(State& g, const std::shared_ptr<Marker>& m, const char* api) {
  if (!m || m->done) return;
  note_wait(g, api);
  DeviceAccess access{g};
  if (g.policy == Policy::Lagging) run_others_ahead(g, access, m->stream);
  run_until(g, access, m);
}

// Runs everything: the stream whose next op was queued last (lifo) or first (fifo) goes first.
void drain_all(State& g, const char* api) {
  if (std::any_of(g.streams.begin(), g.streams.end(), [](const CUstream_st* s) { return !s->queue.empty(); }))
    note_wait(g, api);
  DeviceAccess access{g};
  for (;;) {
    CUstream_st* pick = nullptr;
    for (CUstream_st* s : g.streams) {
      if (s->queue.empty()) continue;
      if (!pick || (g.policy == Policy::Fifo ? s->queue.front().seq < pick->queue.front().seq
                                             : s->queue.front().seq > pick->queue.front().seq))
        pick = s;
    }
    if (!pick) return;
    run_head(g, access, pick);
  }
}

void drain_stream(State& g, CUstream_st* s, const char* api) { drain_until(g, s->tail, api); }

std::shared_ptr<Marker> enqueue(State& g, CUstream_st* s, std::function<void()> work, const char* what,
                                std::shared_ptr<Marker> wait = nullptr) {
  auto push = [&](std::function<void()> w, const char* name, std::shared_ptr<Marker> dep) {
    Op op;
    op.seq = g.next_seq++;
    op.what = name;
    op.work = std::move(w);
    op.wait = std::move(dep);
    op.done = std::make_shared<Marker>();
    op.done->stream = s;
    op.done->seq = op.seq;
    // Waits for events are traced by cudaStreamWaitEvent itself (also those that queue nothing).
    if (g.tracing && std::strcmp(name, "cudaStreamWaitEvent") != 0) {
      TraceOp t;
      t.seq = op.seq;
      t.stream = s == &g.legacy ? nullptr : s;
      t.what = name;
      t.waits_for = op.wait ? op.wait->seq : 0;
      g.trace.push_back(std::move(t));
    }
    s->tail = op.done;
    s->queue.push_back(std::move(op));
  };
  // The legacy stream waits for every blocking stream's queued work, and a blocking stream for the legacy's.
  if (s == &g.legacy) {
    for (CUstream_st* b : g.streams)
      if (b != s && b->blocking && b->tail && !b->tail->done) push({}, "implicit synchronization", b->tail);
  } else if (s->blocking && g.legacy.tail && !g.legacy.tail->done) {
    push({}, "implicit synchronization", g.legacy.tail);
  }
  if (wait && !wait->done) push({}, "cudaStreamWaitEvent", std::move(wait));
  push(std::move(work), what, nullptr);
  std::shared_ptr<Marker> done = s->tail;
  if (g.policy == Policy::Immediate) drain_all(g, nullptr);
  return done;
}

// Where the host reached a device page: report the allocation and stop.
void on_segv(int sig, siginfo_t* info, void*) {
  State& g = state();
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  auto it = g.allocations.upper_bound(addr);
  const Allocation* a = nullptr;
  uintptr_t base = 0;
  if (it != g.allocations.begin()) {
    --it;
    base = it->first;
    a = &it->second;
  }
  if (a && a->kind == Memory::Device && addr < base + a->mapped) {
    char msg[512];
    const int n = std::snprintf(msg, sizeof msg,
                                "cuda emulator: host code touched device memory at %p (byte %zu of a cudaMalloc "
                                "allocation of %zu bytes); device memory is not host-accessible: copy it with "
                                "cudaMemcpy. Backtrace:\n",
                                info->si_addr, static_cast<size_t>(addr - base), a->bytes);
    (void)!write(2, msg, static_cast<size_t>(n));
    void* frames[64];
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    std::abort();
  }
  signal(sig, SIG_DFL);  // not ours: the default action on return (the fault repeats)
}

void install_segv_handler() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
}

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// Checks a copy's kind against where its pointers lie, and their ranges. Returns cudaSuccess or the error.
cudaError_t check_copy(State& g, const char* api, void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  const bool dd = classify(dst) == Memory::Device, sd = classify(src) == Memory::Device;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToHost: ok = !dd && !sd; break;
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = !dd && sd; break;
    case cudaMemcpyDeviceToDevice: ok = dd && sd; break;
    case cudaMemcpyDefault: break;
    default: ok = false;
  }
  if (!ok)
    return record_error(cudaErrorInvalidMemcpyDirection, std::string(api) + ": " + kind_name(kind) + " from " +
                                                             (sd ? "device" : "host") + " memory " + hex(src) + " to " +
                                                             (dd ? "device" : "host") + " memory " + hex(dst));
  // Device and pinned sides are range-checked (pageable memory cannot be).
  if (dd || classify(dst) == Memory::Pinned) require_device_range(dst, count, (std::string(api) + " destination").c_str());
  if (sd || classify(src) == Memory::Pinned) require_device_range(src, count, (std::string(api) + " source").c_str());
  return cudaSuccess;
}

// Queues the copy on `s` by the rules in the header comment; `synchronous`: cudaMemcpy's host waits.
const char* memory_name(Memory m) { return m == Memory::Device ? "device" : m == Memory::Pinned ? "pinned" : "pageable"; }

// The trace's note on the copy just queued (the last op traced).
void trace_copy(State& g, Memory sk, Memory dk, size_t count) {
  if (!g.tracing || g.trace.empty()) return;
  g.trace.back().detail = std::string(memory_name(sk)) + "->" + memory_name(dk);
  g.trace.back().bytes = count;
}

void copy(State& g, CUstream_st* s, void* dst, const void* src, size_t count, bool synchronous, const char* api) {
  if (count == 0) return;
  const Memory dk = classify(dst), sk = classify(src);
  if (dk != Memory::Device && sk != Memory::Device) {  // host to host: fully synchronous
    drain_stream(g, s, api);
    std::memmove(dst, src, count);
    return;
  }
  if (sk == Memory::Other) {  // pageable source: staged now (after the stream's earlier work, for cudaMemcpy)
    if (synchronous) drain_stream(g, s, api);
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + count);
    enqueue(
        g, s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); }, "memcpy (staged source)");
    trace_copy(g, sk, dk, count);
    return;  // the host may reuse its buffer; the device copy lands later
  }
  const std::shared_ptr<Marker> done = enqueue(
      g, s, [dst, src, count] { std::memmove(dst, src, count); }, "memcpy");
  trace_copy(g, sk, dk, count);
  // cudaMemcpy returns once a copy into host memory (or from pinned memory) has landed; device to device it
  // does not wait.
  if (synchronous && !(dk == Memory::Device && sk == Memory::Device)) drain_until(g, done, api);
}

}  // namespace

Memory classify(const void* p) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  uintptr_t base = 0;
  const Allocation* a = p ? find_allocation(g, reinterpret_cast<uintptr_t>(p), &base) : nullptr;
  return a ? a->kind : Memory::Other;
}

void require_device_range(const void* p, size_t bytes, const char* what, bool pinned_ok) {
  if (p == nullptr) return;
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  const auto a = reinterpret_cast<uintptr_t>(p);
  uintptr_t base = 0;
  const Allocation* alloc = find_allocation(g, a, &base);
  if (!alloc || (alloc->kind == Memory::Pinned && !pinned_ok)) {
    std::string why = "is not device memory";
    auto f = g.freed.upper_bound(a);
    if (f != g.freed.begin() && a < std::prev(f)->first + std::prev(f)->second)
      why = "points into device memory already freed";
    fatal(std::string(what) + ": " + hex(p) + " " + why);
  }
  if (a + bytes > base + alloc->bytes)
    fatal(std::string(what) + ": " + std::to_string(bytes) + " bytes at " + hex(p) + " (byte " + std::to_string(a - base) +
          " of an allocation of " + std::to_string(alloc->bytes) + ") run past its end");
}

void submit(void* stream, std::function<void()> work, const char* what) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  count_call(what);
  enqueue(g, resolve(g, stream), std::move(work), what);
}

void trace_begin() {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  g.trace.clear();
  g.tracing = true;
}

std::vector<TraceOp> trace_end() {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  g.tracing = false;
  return std::move(g.trace);
}

void trace_mark(std::string label) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!g.tracing) return;
  TraceOp t;
  t.seq = g.next_seq++;
  t.what = "mark";
  t.detail = std::move(label);
  g.trace.push_back(std::move(t));
}

[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "cuda emulator: %s\n", message.c_str());
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  std::fflush(stderr);
  std::abort();
}

namespace {
// The SIMT emulator's launches and the launchers' copies come through here.
[[maybe_unused]] const bool hooks_installed = [] {
  simt_emulator::set_runtime_hooks(
      {&submit, [](const void* p, size_t bytes, const char* what) { require_device_range(p, bytes, what); }});
  return true;
}();
}  // namespace

}  // namespace shardtrain::cuda_emulator

using namespace shardtrain::cuda_emulator;  // NOLINT: the C API below is this file's whole purpose

extern "C" {

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  *total = kDeviceMemory;
  *free_bytes = kDeviceMemory - g.device_in_use;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t size) {
  count_call("cudaMalloc");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  install_segv_handler();
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  if (size > kDeviceMemory - g.device_in_use)
    return record_error(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(size) + "): beyond the emulated 80 GB");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = (size + page - 1) / page * page;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return record_error(cudaErrorMemoryAllocation, "cudaMalloc: mmap failed");
  std::memset(p, 0xff, mapped);  // uninitialized device memory reads as NaN
  if (g.protect && g.running == 0 && mprotect(p, mapped, PROT_NONE) != 0) fatal("cudaMalloc: mprotect failed");
  g.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, mapped, Memory::Device};
  g.freed.erase(reinterpret_cast<uintptr_t>(p));
  g.device_in_use += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  count_call("cudaFree");
  if (ptr == nullptr) return cudaSuccess;
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  auto it = g.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g.allocations.end() || it->second.kind != Memory::Device)
    return record_error(cudaErrorInvalidValue, "cudaFree(" + hex(ptr) + "): not the start of a live cudaMalloc allocation");
  drain_all(g, "cudaFree");  // cudaFree synchronizes: queued work may still use the memory
  const Allocation a = it->second;
  g.allocations.erase(it);
  g.device_in_use -= a.bytes;
  munmap(ptr, a.mapped);
  g.freed[reinterpret_cast<uintptr_t>(ptr)] = a.bytes;
  if (g.freed.size() > 4096) g.freed.erase(g.freed.begin());
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocHost(void** ptr, size_t size) {
  count_call("cudaMallocHost");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (!p) return record_error(cudaErrorMemoryAllocation, "cudaMallocHost: out of host memory");
  g.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{size, 0, Memory::Pinned};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  count_call("cudaFreeHost");
  if (ptr == nullptr) return cudaSuccess;
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  auto it = g.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g.allocations.end() || it->second.kind != Memory::Pinned)
    return record_error(cudaErrorInvalidValue, "cudaFreeHost(" + hex(ptr) + "): not a live cudaMallocHost allocation");
  drain_all(g, "cudaFreeHost");  // as cudaFree: queued copies may still read or write it
  g.allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  count_call("cudaMemcpy");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (cudaError_t e = check_copy(g, "cudaMemcpy", dst, src, count, kind); e != cudaSuccess) return e;
  copy(g, &g.legacy, dst, src, count, true, "cudaMemcpy");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  count_call("cudaMemcpyAsync");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (cudaError_t e = check_copy(g, "cudaMemcpyAsync", dst, src, count, kind); e != cudaSuccess) return e;
  copy(g, resolve(g, stream), dst, src, count, false, "cudaMemcpyAsync");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  count_call("cudaMemsetAsync");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (count == 0) return cudaSuccess;
  require_device_range(ptr, count, "cudaMemsetAsync");
  enqueue(
      g, resolve(g, stream), [ptr, value, count] { std::memset(ptr, value, count); }, "cudaMemsetAsync");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemset(void* ptr, int value, size_t count) {
  count_call("cudaMemset");
  // Asynchronous with respect to the host for device memory (on the legacy stream), synchronous for pinned.
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (count == 0) return cudaSuccess;
  require_device_range(ptr, count, "cudaMemset");
  auto done = enqueue(
      g, &g.legacy, [ptr, value, count] { std::memset(ptr, value, count); }, "cudaMemset");
  if (classify(ptr) == Memory::Pinned) drain_until(g, done, "cudaMemset");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  count_call("cudaStreamCreateWithFlags");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  auto* s = new CUstream_st;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  g.streams.push_back(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

// An H100's range: 0 (the default, least) to -5 (greatest). Lower numbers are higher priorities.
constexpr int kLeastStreamPriority = 0, kGreatestStreamPriority = -5;

cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = kLeastStreamPriority;
  if (greatest) *greatest = kGreatestStreamPriority;
  return cudaSuccess;
}

// As CUDA does, a priority outside the range is clamped into it.
cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  count_call("cudaStreamCreateWithPriority");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  auto* s = new CUstream_st;
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  s->priority = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
  g.streams.push_back(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  *priority = resolve(g, stream)->priority;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  count_call("cudaStreamDestroy");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  CUstream_st* s = resolve(g, stream);
  if (s == &g.legacy) return record_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the legacy stream");
  if (!s->queue.empty()) {  // released once its work has run
    s->destroyed = true;
    return cudaSuccess;
  }
  g.streams.erase(std::find(g.streams.begin(), g.streams.end(), s));
  delete s;
  return cudaSuccess;
}

// Runs `fn` when the stream's work reaches it (the host thread that waited runs it, where CUDA uses one of
// its own: the host function must not call CUDA either way).
cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  count_call("cudaLaunchHostFunc");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!fn) return record_error(cudaErrorInvalidValue, "cudaLaunchHostFunc: null function");
  enqueue(
      g, resolve(g, stream), [fn, user_data] { fn(user_data); }, "cudaLaunchHostFunc");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  count_call("cudaStreamSynchronize");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  CUstream_st* s = resolve(g, stream);
  drain_stream(g, s, "cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  count_call("cudaDeviceSynchronize");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  drain_all(g, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  count_call("cudaEventCreateWithFlags");
  auto* e = new CUevent_st;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = e;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  count_call("cudaEventDestroy");
  delete event;  // queued records hold their markers themselves
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  count_call("cudaEventRecord");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!event) return record_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
  event->last = enqueue(g, resolve(g, stream), {}, "cudaEventRecord");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  count_call("cudaStreamWaitEvent");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!event) return record_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: null event");
  // The wait is for the record made before this call (none: nothing to wait for).
  CUstream_st* s = resolve(g, stream);
  uint64_t seq = 0;
  if (event->last && !event->last->done) {
    seq = enqueue(g, s, {}, "cudaStreamWaitEvent", event->last)->seq;
  } else if (g.tracing) {
    seq = g.next_seq++;
  }
  if (g.tracing) {
    TraceOp t;
    t.seq = seq;
    t.stream = s == &g.legacy ? nullptr : s;
    t.what = "cudaStreamWaitEvent";
    t.waits_for = event->last ? event->last->seq : 0;
    g.trace.push_back(std::move(t));
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  return !event->last || event->last->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  count_call("cudaEventSynchronize");
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  drain_until(g, event->last, "cudaEventSynchronize");
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  State& g = state();
  std::lock_guard<std::recursive_mutex> lock(g.mutex);
  if (!start->timing || !end->timing)
    return record_error(cudaErrorInvalidResourceHandle,
                        "cudaEventElapsedTime on an event created with cudaEventDisableTiming");
  if (!start->last || !end->last)
    return record_error(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event never recorded");
  if (!start->last->done || !end->last->done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->last->at - start->last->at).count();
  return cudaSuccess;
}

}  // extern "C"
