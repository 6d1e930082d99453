// Failure records: one line of JSON per failing rank in RUN_DIR/failures/ (failure_record.hpp).
#include "shardtrain/runtime/failure_record.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "shardtrain/runtime/strings.hpp"

namespace shardtrain::failure_record {
namespace {

struct State {
  std::mutex mutex;
  std::string dir;  // "" = not enabled
  int rank = 0;
  std::vector<std::string> nodes;  // by world rank; empty where they were not gathered (enable_this_rank)
};
State& state() {
  static State s;
  return s;
}

std::string node_name_of(const State& s, int rank);  // below node_name()
std::atomic<int64_t> g_step{-1};

bool out_of_memory(const std::string& message) {
  for (const char* m : {"out of GPU memory", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory",
                        "out of host memory", "host allocation of"})
    if (message.find(m) != std::string::npos) return true;
  return false;
}

// ---- crash records: a rank killed by a fatal signal ---------------------------------------------------------
// The handler may only use async-signal-safe calls, so everything it needs is prepared by enable(): the paths
// and the record's fixed fields. It writes the record (unless this rank already wrote one), then restores the
// previous action (Open MPI's backtrace printer, or the default) and raises the signal again, so the process
// still dies of it and the launcher reports 128 + signal as before.
struct CrashRecord {
  char dir[4096] = {};
  char path[4096] = {};
  char tmp[4096] = {};
  char fields[1024] = {};  // "\"rank\":3,\"node\":\"gpu017\","
  char node[600] = {};     // "\"gpu017\""
};
CrashRecord g_crash;
std::atomic<bool> g_crash_ready{false};
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
struct sigaction g_previous[NSIG];
bool g_handlers_installed = false;

// Appends to buf[0..cap) at n, never past it.
void put(char* buf, size_t cap, size_t& n, const char* s) {
  while (*s && n + 1 < cap) buf[n++] = *s++;
}
void put_int(char* buf, size_t cap, size_t& n, int64_t v) {
  char digits[24];
  int k = 0;
  const bool negative = v < 0;
  uint64_t u = negative ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
  do {
    digits[k++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u);
  if (negative) put(buf, cap, n, "-");
  while (k) {
    const char c[2] = {digits[--k], 0};
    put(buf, cap, n, c);
  }
}

// The files this process maps for reading (a dataset's tokens), for the handler: a SIGBUS at an address inside one is
// that file cut short under the run (truncated or rewritten in place), not a crash of ours. Slots are claimed and
// released under a mutex; the handler reads them without one (a slot's path is written before its range).
struct MappedSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> bytes{0};
  char path[1024] = {};  // JSON-escaped, without the quotes
};
constexpr size_t kMappedSlots = 64;
MappedSlot g_mapped[kMappedSlots];
std::mutex g_mapped_mutex;

const char* mapped_file_at(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  for (MappedSlot& slot : g_mapped) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin != 0 && a >= begin && a - begin < slot.bytes.load(std::memory_order_relaxed)) return slot.path;
  }
  return nullptr;
}

const char* signal_words(int sig, int code, bool& hardware) {
  hardware = false;
  switch (sig) {
    case SIGBUS:
      if (code == BUS_MCEERR_AR || code == BUS_MCEERR_AO) {
        hardware = true;
        return code == BUS_MCEERR_AR
                   ? "SIGBUS (BUS_MCEERR_AR): the kernel found an uncorrectable memory error (machine check) in memory this rank used"
                   : "SIGBUS (BUS_MCEERR_AO): the kernel found an uncorrectable memory error (machine check) in this rank's memory";
      }
      return "SIGBUS (bus error)";
    case SIGSEGV: return "SIGSEGV (segmentation fault)";
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGFPE: return "SIGFPE (arithmetic exception)";
    case SIGABRT: return "SIGABRT (aborted)";
    default: return "a fatal signal";
  }
}

void on_crash(int sig, siginfo_t* info, void*) {
  // A mapped input file cut short under the run: said on stderr too (the launcher's own line names only the signal),
  // and not restartable (a restart meets the same file, and its start-up check names it).
  const char* cut_file = sig == SIGBUS && info && info->si_code == BUS_ADRERR ? mapped_file_at(info->si_addr) : nullptr;
  const char* cut_words =
      " past its end: the file was cut short (truncated or rewritten in place) while this run read it; a dataset must "
      "not change under a run: write a new one and rename it over the old (docs/data.md)";
  if (cut_file) {
    char line[1400];
    size_t n = 0;
    put(line, sizeof line, n, "shardtrain: killed by SIGBUS reading ");
    put(line, sizeof line, n, cut_file);
    put(line, sizeof line, n, cut_words);
    put(line, sizeof line, n, "\n");
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, line, n);
  }
  if (g_crash_ready.load() && access(g_crash.path, F_OK) != 0) {
    bool hardware = false;
    const char* words = signal_words(sig, info ? info->si_code : 0, hardware);
    char line[2048];
    size_t n = 0;
    const int64_t step = g_step.load(std::memory_order_relaxed);
    put(line, sizeof line, n, "{\"exit_code\":");
    put_int(line, sizeof line, n, 128 + sig);
    put(line, sizeof line, n, ",\"kind\":\"crash\",");
    put(line, sizeof line, n, g_crash.fields);
    put(line, sizeof line, n, "\"step\":");
    put_int(line, sizeof line, n, step);
    // A crash may be a bug (the same step crashes again, and the job script stops there) or the machine; only
    // a machine check names the node.
    put(line, sizeof line, n,
        cut_file ? ",\"restartable\":false,\"suspect_nodes\":[" : ",\"restartable\":true,\"suspect_nodes\":[");
    if (hardware) put(line, sizeof line, n, g_crash.node);
    put(line, sizeof line, n, "],\"message\":\"killed by ");
    if (cut_file) {
      put(line, sizeof line, n, "SIGBUS reading ");
      put(line, sizeof line, n, cut_file);
      put(line, sizeof line, n, cut_words);
    } else {
      put(line, sizeof line, n, words);
    }
    put(line, sizeof line, n, step >= 1 ? " during step " : "");
    if (step >= 1) put_int(line, sizeof line, n, step);
    put(line, sizeof line, n, "\"}\n");
    ::mkdir(g_crash.dir, 0755);  // made here, not in advance: a run that never fails has no failures/ directory
    const int fd = ::open(g_crash.tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      const bool ok = ::write(fd, line, n) == static_cast<ssize_t>(n);
      ::close(fd);
      if (ok) ::rename(g_crash.tmp, g_crash.path);
    }
  }
  sigaction(sig, &g_previous[sig], nullptr);
  raise(sig);  // delivered when this handler returns (the signal is blocked inside it), to the previous action
}

void prepare_crash_record(const std::string& dir, int rank, const std::string& node) {
  const std::string path = fmt::format("{}/rank_{:05d}.json", dir, rank), tmp = path + ".tmp";
  const std::string node_json = quoted_string(node), fields = fmt::format("\"rank\":{},\"node\":{},", rank, node_json);
  g_crash_ready.store(false);
  if (path.size() >= sizeof g_crash.tmp - 1 || fields.size() >= sizeof g_crash.fields ||
      node_json.size() >= sizeof g_crash.node)
    return;
  std::snprintf(g_crash.dir, sizeof g_crash.dir, "%s", dir.c_str());
  std::snprintf(g_crash.path, sizeof g_crash.path, "%s", path.c_str());
  std::snprintf(g_crash.tmp, sizeof g_crash.tmp, "%s", tmp.c_str());
  std::snprintf(g_crash.fields, sizeof g_crash.fields, "%s", fields.c_str());
  std::snprintf(g_crash.node, sizeof g_crash.node, "%s", node_json.c_str());
  g_crash_ready.store(true);
  if (g_handlers_installed) return;
  g_handlers_installed = true;
  for (const int sig : kCrashSignals) {
    struct sigaction a {};
    a.sa_sigaction = on_crash;
    a.sa_flags = SA_SIGINFO;
    sigemptyset(&a.sa_mask);
    sigaction(sig, &a, &g_previous[sig]);
  }
}

}  // namespace

std::string node_name() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return n;
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  return host.data();
}

namespace {

// World rank `rank`'s node as gathered by enable(); this rank's own from node_name() where none were gathered; ""
// for a rank whose node is not known.
std::string node_name_of(const State& s, int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < s.nodes.size()) return s.nodes[static_cast<size_t>(rank)];
  return s.nodes.empty() && rank == s.rank ? node_name() : std::string();
}

}  // namespace

void enable(const std::string& run_dir, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::array<char, 256> mine{};
  const std::string name = node_name();
  std::snprintf(mine.data(), mine.size(), "%s", name.c_str());
  std::vector<char> all(mine.size() * static_cast<size_t>(size));
  // Unchecked like the rest of this file: without the names a record still names this rank's own node.
  const bool gathered = MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
                                      static_cast<int>(mine.size()), MPI_CHAR, world) == MPI_SUCCESS;
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.dir = (std::filesystem::path(run_dir) / "failures").string();
  s.rank = rank;
  s.nodes.assign(static_cast<size_t>(size), std::string());
  for (int r = 0; r < size; ++r)
    s.nodes[static_cast<size_t>(r)] = gathered ? std::string(all.data() + r * mine.size()) : std::string();
  s.nodes[static_cast<size_t>(rank)] = name;
  prepare_crash_record(s.dir, rank, name);
}

void enable_this_rank(const std::string& run_dir, int rank) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.dir = (std::filesystem::path(run_dir) / "failures").string();
  s.rank = rank;
  s.nodes.clear();  // node_name_of: this rank's own node only
}

bool enabled() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return !s.dir.empty();
}

void disable() {
  g_crash_ready.store(false);
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.dir.clear();
  s.nodes.clear();
}

void set_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }

int note_mapped_file(const void* begin, size_t bytes, const std::string& path) {
  std::string escaped = quoted_string(path);
  escaped = escaped.substr(1, escaped.size() - 2);
  std::lock_guard lock(g_mapped_mutex);
  for (size_t k = 0; k < kMappedSlots; ++k) {
    MappedSlot& slot = g_mapped[k];
    if (slot.begin.load(std::memory_order_relaxed) != 0) continue;
    std::snprintf(slot.path, sizeof slot.path, "%s", escaped.c_str());
    slot.bytes.store(bytes, std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    return static_cast<int>(k);
  }
  return -1;  // more files than slots: a SIGBUS in this one is an ordinary crash record
}

void forget_mapped_file(int handle) {
  if (handle < 0 || static_cast<size_t>(handle) >= kMappedSlots) return;
  std::lock_guard lock(g_mapped_mutex);
  g_mapped[handle].begin.store(0, std::memory_order_release);
}

bool restartable(ExitCode code, const std::string& message) {
  switch (code) {
    case ExitCode::Comm:
    case ExitCode::Timeout: return true;
    case ExitCode::Device: return !out_of_memory(message);
    // A save that hung (a file system that stopped answering) may well go through after a restart; a disk
    // that is full or refuses writes stays so.
    case ExitCode::Io: return message.find("(checkpoint.save_timeout)") != std::string::npos;
    default: return false;
  }
}

std::vector<std::string> suspects(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  std::vector<std::string> out;
  auto add = [&](const std::string& n) {
    if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  };
  if (code == ExitCode::Device && !out_of_memory(message)) add(node_name_of(s, s.rank));
  if (code == ExitCode::Timeout) {
    for (const int r : suspect_ranks) add(node_name_of(s, r));
  }
  return out;
}

namespace {

// This rank's record: one line of JSON.
std::string record_line(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks) {
  const std::vector<std::string> nodes = suspects(code, message, suspect_ranks);
  std::string list;
  for (const std::string& n : nodes) {
    if (!list.empty()) list += ',';
    list += quoted_string(n);
  }
  State& s = state();
  int rank = 0;
  std::string node;
  {
    std::lock_guard lock(s.mutex);
    rank = s.rank;
    node = node_name_of(s, s.rank);
  }
  return fmt::format(
             R"({{"exit_code":{},"kind":{},"rank":{},"node":{},"step":{},"restartable":{},"suspect_nodes":[{}],"message":{}}})",
             static_cast<int>(code), quoted_string(exit_code_name(code)), rank, quoted_string(node),
             g_step.load(std::memory_order_relaxed), restartable(code, message) ? "true" : "false", list,
             quoted_string(message)) +
         "\n";
}

}  // namespace

void write(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks) {
  std::string dir;
  int rank = 0;
  {
    State& s = state();
    std::lock_guard lock(s.mutex);
    dir = s.dir;
    rank = s.rank;
  }
  if (dir.empty()) return;
  try {
    const std::string line = record_line(code, message, suspect_ranks);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string path = fmt::format("{}/rank_{:05d}.json", dir, rank), tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::fsync(fd);
    ::close(fd);
    if (ok) std::rename(tmp.c_str(), path.c_str());
    else ::unlink(tmp.c_str());
  } catch (...) {
    // A record is a courtesy to the job script; the job is ending either way.
  }
}

}  // namespace shardtrain::failure_record
