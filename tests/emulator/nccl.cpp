// The NCCL API that src/comm/nccl_communicator.cpp uses, on the host (SHARDTRAIN_CUDA=EMULATED), for
// communicators of any number of ranks, each rank a process with its own emulated GPU
// (SHARDTRAIN_CUDA_EMULATOR_DEVICES, cuda_runtime.cpp).
//
// A collective is queued on its stream like any device work and runs when that work runs, that is when the
// rank's host waits for it (cuda_runtime.cpp): so it meets its peers' matching collective only as late as
// their schedules allow, and a rank whose streams were ordered wrongly reads a gather or a reduction before
// it landed, as on a GPU. The ranks of a communicator share one POSIX shared-memory segment, named by the
// unique id: each puts its send buffer in its slot, waits for the others (a barrier), computes its receive
// buffer from the slots, and waits again before the slots are reused. As NCCL does, ncclCommInitRank refuses
// two ranks of one communicator on the same GPU (the same physical device of the emulator: its UUID, whatever
// ordinal CUDA_VISIBLE_DEVICES gave it) with ncclInvalidUsage on every rank. Reductions run in rank order with an
// fp32 (or wider) accumulator rounded once, so every rank gets the same bits, whichever ranks they are. Send
// and receive buffers must be device memory of a live allocation. A rank that waits more than
// SHARDTRAIN_CUDA_EMULATOR_NCCL_TIMEOUT seconds (default 600) for its peers stops the process, naming the
// collective.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "shardtrain/runtime/dtype.hpp"
#include "tests/emulator/cuda_emulator.hpp"

namespace shardtrain::cuda_emulator {
namespace {

constexpr size_t kSlotBytes = size_t{256} << 20;  // the largest send buffer (sparse: pages exist once touched)
constexpr size_t kHeaderBytes = 4096;
constexpr int kMaxRanks = 64;

// What a rank is about to run, checked against its peers': NCCL needs every rank to issue a communicator's
// collectives in the same order with the same arguments (otherwise a GPU hangs or mixes data).
struct Call {
  uint64_t seq;  // 1, 2, ... on this communicator
  int32_t kind, type, op, root;
  uint64_t count;
  bool operator==(const Call&) const = default;
};

struct Header {
  std::atomic<uint32_t> ready;       // set by rank 0 once the segment is sized and initialized
  std::atomic<uint32_t> arrived;     // at the current barrier
  std::atomic<uint32_t> generation;  // barriers completed
  uint32_t nranks;
  Call calls[kMaxRanks];              // by rank, written before the barrier of each collective
  unsigned char uuid[kMaxRanks][16];  // by rank: the UUID of its current device, written before the init barrier
};
static_assert(sizeof(Header) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics must be lock-free");

std::string last_error;

ncclResult_t usage(const std::string& message) {
  last_error = message;
  std::fprintf(stderr, "cuda emulator (NCCL): %s\n", message.c_str());
  return ncclInvalidUsage;
}

double timeout_seconds() {
  const char* s = std::getenv("SHARDTRAIN_CUDA_EMULATOR_NCCL_TIMEOUT");
  return s && *s ? std::atof(s) : 600.0;
}

}  // namespace
}  // namespace shardtrain::cuda_emulator

struct ncclComm {
  int nranks = 1;
  int rank = 0;
  bool aborted = false;
  uint64_t collectives = 0;    // issued on this communicator
  cudaEvent_t last = nullptr;  // recorded after each collective: the next one waits for it
  std::string name;            // of the shared-memory segment
  shardtrain::cuda_emulator::Header* header = nullptr;
  unsigned char* slots = nullptr;  // nranks * kSlotBytes
  size_t mapped = 0;
};

namespace shardtrain::cuda_emulator {
namespace {

size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// Every rank of the communicator gets here before any leaves. `what` names the collective in the timeout.
void barrier(ncclComm* c, const std::string& what) {
  Header* h = c->header;
  const uint32_t gen = h->generation.load(std::memory_order_acquire);
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(c->nranks)) {
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.fetch_add(1, std::memory_order_release);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const double limit = timeout_seconds();
  for (int spins = 0; h->generation.load(std::memory_order_acquire) == gen; ++spins) {
    if (spins < 64) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spins & 1023) == 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit)
      fatal(what + ": rank " + std::to_string(c->rank) + " of " + std::to_string(c->nranks) + " waited " +
            std::to_string(static_cast<int>(limit)) + " s for its peers (SHARDTRAIN_CUDA_EMULATOR_NCCL_TIMEOUT)");
  }
}

// out[i] = op over ranks r (in rank order) of slot r's element (offset + i), for `count` elements, accumulated
// in Acc and converted back once (bf16 is shardtrain's bf16, which converts to and from float).
template <typename T, typename Acc>
void reduce_slots(const ncclComm* c, size_t offset, size_t count, ncclRedOp_t op, void* out) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    Acc acc{};
    for (int r = 0; r < c->nranks; ++r) {
      const auto v =
          static_cast<Acc>(reinterpret_cast<const T*>(c->slots + static_cast<size_t>(r) * kSlotBytes)[offset + i]);
      if (r == 0) acc = v;
      else if (op == ncclMax) acc = v > acc ? v : acc;
      else if (op == ncclMin) acc = v < acc ? v : acc;
      else if (op == ncclProd) acc = acc * v;
      else acc = acc + v;  // ncclSum, ncclAvg
    }
    if (op == ncclAvg) acc = acc / static_cast<Acc>(c->nranks);
    dst[i] = static_cast<T>(acc);
  }
}

bool reducible(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32:
    case ncclFloat64:
    case ncclBfloat16:
    case ncclInt32:
    case ncclInt64:
    case ncclUint32:
    case ncclUint64:
    case ncclUint8: return true;
    default: return false;
  }
}

// A reducible type (checked when the collective was issued).
void reduce_into(const ncclComm* c, size_t offset, size_t count, ncclDataType_t t, ncclRedOp_t op, void* out) {
  switch (t) {
    case ncclFloat32: reduce_slots<float, double>(c, offset, count, op, out); break;
    case ncclFloat64: reduce_slots<double, double>(c, offset, count, op, out); break;
    case ncclBfloat16: reduce_slots<bf16, float>(c, offset, count, op, out); break;
    case ncclInt32: reduce_slots<int32_t, int64_t>(c, offset, count, op, out); break;
    case ncclInt64: reduce_slots<int64_t, int64_t>(c, offset, count, op, out); break;
    case ncclUint32: reduce_slots<uint32_t, uint64_t>(c, offset, count, op, out); break;
    case ncclUint64: reduce_slots<uint64_t, uint64_t>(c, offset, count, op, out); break;
    case ncclUint8: reduce_slots<uint8_t, uint64_t>(c, offset, count, op, out); break;
    default: break;
  }
}

enum class Kind { AllGather, ReduceScatter, AllReduce, Broadcast };

// When the collective runs on the stream: slot in, barrier, the peers' calls checked, receive buffer out of
// the slots, barrier.
void exchange(ncclComm* comm, const Call& call, const std::string& what, Kind kind, const void* send, void* recv,
              size_t count, size_t es, ncclDataType_t type, ncclRedOp_t op, int root, bool sends) {
  if (comm->aborted) return;  // an aborted communicator's queued work does nothing
  const size_t n = static_cast<size_t>(comm->nranks), me = static_cast<size_t>(comm->rank);
  const size_t send_bytes = (kind == Kind::ReduceScatter ? n : 1) * count * es;
  if (sends) std::memcpy(comm->slots + me * kSlotBytes, send, send_bytes);
  comm->header->calls[me] = call;
  barrier(comm, what);
  for (size_t r = 0; r < n; ++r) {
    const Call& c = comm->header->calls[r];
    if (!(c == call))
      fatal(what + " (kind " + std::to_string(call.kind) + ", " + std::to_string(call.count) + " elements of type " +
            std::to_string(call.type) + ") on rank " + std::to_string(me) + ", while rank " + std::to_string(r) + " runs #" +
            std::to_string(c.seq) + " (kind " + std::to_string(c.kind) + ", " + std::to_string(c.count) +
            " elements of type " + std::to_string(c.type) +
            "): the ranks issued this communicator's collectives differently; a GPU would hang or mix data");
  }
  switch (kind) {
    case Kind::AllGather:
      for (size_t r = 0; r < n; ++r)
        std::memcpy(static_cast<unsigned char*>(recv) + r * count * es, comm->slots + r * kSlotBytes, count * es);
      break;
    case Kind::ReduceScatter: reduce_into(comm, me * count, count, type, op, recv); break;
    case Kind::AllReduce: reduce_into(comm, 0, count, type, op, recv); break;
    case Kind::Broadcast: std::memcpy(recv, comm->slots + static_cast<size_t>(root) * kSlotBytes, count * es); break;
  }
  barrier(comm, what);  // the slots are read before anyone writes the next collective's
}

// Checks the call, then queues the exchange on the stream. count: the receive buffer's elements per rank
// (all-gather, reduce-scatter) or in all (all-reduce, broadcast).
ncclResult_t collective(const char* api, Kind kind, ncclComm_t comm, const void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, int root, cudaStream_t stream) {
  if (!comm || comm->aborted) return usage(std::string(api) + " on a destroyed or aborted communicator");
  const size_t es = type_bytes(type);
  if (es == 0) return usage(std::string(api) + ": unknown data type");
  if ((kind == Kind::ReduceScatter || kind == Kind::AllReduce) && !reducible(type))
    return usage(std::string(api) + ": the emulator does not reduce data type " + std::to_string(static_cast<int>(type)));
  if (kind == Kind::Broadcast && (root < 0 || root >= comm->nranks))
    return usage(std::string(api) + ": root " + std::to_string(root) + " of a communicator of " +
                 std::to_string(comm->nranks) + " ranks");
  const size_t n = static_cast<size_t>(comm->nranks);
  const size_t send_bytes = (kind == Kind::ReduceScatter ? n : 1) * count * es;
  const size_t recv_bytes = (kind == Kind::AllGather ? n : 1) * count * es;
  // A broadcast reads the send buffer of its root only (the others may pass null).
  const bool sends = kind != Kind::Broadcast || root == comm->rank;
  if (sends) require_device_range(send, send_bytes, (std::string(api) + " send buffer").c_str(), false);
  require_device_range(recv, recv_bytes, (std::string(api) + " receive buffer").c_str(), false);
  if (send_bytes > kSlotBytes)
    return usage(std::string(api) + ": " + std::to_string(send_bytes) + " bytes per rank, more than the emulator's " +
                 std::to_string(kSlotBytes) + "-byte exchange slot");
  if (send_bytes == 0) return ncclSuccess;
  const Call call{
      ++comm->collectives,         static_cast<int32_t>(kind), static_cast<int32_t>(type), static_cast<int32_t>(op), root,
      static_cast<uint64_t>(count)};
  const std::string what = std::string(api) + " #" + std::to_string(call.seq);
  // A communicator's collectives run in the order they were issued, whatever their streams (as NCCL
  // orders them): each waits for the one before.
  if (cudaStreamWaitEvent(stream, comm->last, 0) != cudaSuccess) return usage(what + ": invalid stream");
  if (comm->nranks == 1) {  // a copy (none in place)
    if (send != recv)
      submit(
          stream, [send, recv, recv_bytes] { std::memmove(recv, send, recv_bytes); }, api);
  } else {
    submit(
        stream, [=] { exchange(comm, call, what, kind, send, recv, count, es, type, op, root, sends); }, api);
  }
  cudaEventRecord(comm->last, stream);
  return ncclSuccess;
}

}  // namespace
}  // namespace shardtrain::cuda_emulator

using namespace shardtrain::cuda_emulator;  // NOLINT: the C API below is this file's whole purpose

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<uint64_t> counter{0};
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "/shardtrain-nccl-%d-%llu-%08x", static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter++), static_cast<unsigned>(std::random_device{}()));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  count_call("ncclCommInitRank");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return usage("ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  if (nranks > kMaxRanks) return usage("ncclCommInitRank: more than " + std::to_string(kMaxRanks) + " ranks");
  auto* c = new ncclComm;
  c->nranks = nranks;
  c->rank = rank;
  cudaEventCreateWithFlags(&c->last, cudaEventDisableTiming);
  if (nranks == 1) {
    *comm = c;
    return ncclSuccess;
  }
  c->name.assign(id.internal, strnlen(id.internal, sizeof id.internal));
  if (c->name.rfind("/shardtrain-nccl-", 0) != 0) {
    cudaEventDestroy(c->last);
    delete c;
    return usage("ncclCommInitRank: a unique id not made by the emulator's ncclGetUniqueId");
  }
  c->mapped = kHeaderBytes + static_cast<size_t>(nranks) * kSlotBytes;
  const auto start = std::chrono::steady_clock::now();
  int fd = -1;
  if (rank == 0) {
    fd = shm_open(c->name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(c->mapped)) != 0)
      fatal("ncclCommInitRank: shared memory " + c->name + ": " + std::strerror(errno));
  } else {  // rank 0 creates it: wait for the name, then for its full size
    for (;;) {
      fd = shm_open(c->name.c_str(), O_RDWR, 0600);
      struct stat st {};
      if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == c->mapped) break;
      if (fd >= 0) close(fd);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds())
        fatal("ncclCommInitRank: rank " + std::to_string(rank) + " waited for rank 0 to create " + c->name);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void* p = mmap(nullptr, c->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) fatal("ncclCommInitRank: mmap of " + c->name + ": " + std::strerror(errno));
  c->header = static_cast<Header*>(p);
  c->slots = static_cast<unsigned char*>(p) + kHeaderBytes;
  if (rank == 0) {
    c->header->nranks = static_cast<uint32_t>(nranks);
    c->header->ready.store(1, std::memory_order_release);  // the rest is zero from ftruncate
  } else {
    while (c->header->ready.load(std::memory_order_acquire) == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (c->header->nranks != static_cast<uint32_t>(nranks))
      fatal("ncclCommInitRank: " + c->name + " has " + std::to_string(c->header->nranks) + " ranks, rank " +
            std::to_string(rank) + " asked for " + std::to_string(nranks));
  }
  int device = 0;
  cudaDeviceProp prop{};
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&prop, device);
  std::memcpy(c->header->uuid[rank], prop.uuid.bytes, 16);
  // Blocking, as NCCL's is: every rank has mapped the segment when it returns, and its name can go.
  barrier(c, "ncclCommInitRank");
  if (rank == 0) shm_unlink(c->name.c_str());
  for (int r = 0; r < nranks; ++r) {  // every rank finds the same pair, so every rank fails alike
    for (int q = 0; q < r; ++q) {
      if (std::memcmp(c->header->uuid[r], c->header->uuid[q], 16) != 0) continue;
      char text[40];
      const unsigned char* u = c->header->uuid[r];
      std::snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-...-%02x", u[0], u[1], u[2], u[3], u[4], u[5], u[15]);
      munmap(c->header, c->mapped);
      cudaEventDestroy(c->last);
      delete c;
      return usage("ncclCommInitRank: duplicate GPU detected: rank " + std::to_string(r) + " and rank " + std::to_string(q) +
                   " both on " + text + " (NCCL needs a GPU of its own for each rank of a communicator)");
    }
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  // Queued collectives read the communicator when they run: an aborted one's do nothing but that check, so
  // it stays allocated; otherwise they run to completion first (with their peers), as NCCL's destroy waits.
  if (comm->aborted) return ncclSuccess;
  cudaEventSynchronize(comm->last);
  if (comm->header) munmap(comm->header, comm->mapped);
  cudaEventDestroy(comm->last);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm) comm->aborted = true;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (!comm) return ncclInvalidArgument;
  *state = ncclSuccess;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage (see the CUDA emulator's message)";
    default: return "unhandled error (CUDA emulator)";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclAllGather", Kind::AllGather, comm, send, recv, count, type, ncclSum, 0, stream);
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduceScatter", Kind::ReduceScatter, comm, send, recv, count, type, op, 0, stream);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclAllReduce", Kind::AllReduce, comm, send, recv, count, type, op, 0, stream);
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclBroadcast", Kind::Broadcast, comm, send, recv, count, type, ncclSum, root, stream);
}

}  // extern "C"
