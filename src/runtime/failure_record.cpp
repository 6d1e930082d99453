// Failure records: one line of JSON per failing rank in RUN_DIR/failures/ (failure_record.hpp).
#include "shardtrain/runtime/failure_record.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

namespace shardtrain::failure_record {
namespace {

struct State {
  std::mutex mutex;
  std::string dir;  // "" = not enabled
  int rank = 0;
  std::vector<std::string> nodes;  // by world rank
};
State& state() {
  static State s;
  return s;
}
std::atomic<int64_t> g_step{-1};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else out += c;
    }
  }
  return out + "\"";
}

bool out_of_memory(const std::string& message) {
  for (const char* m : {"out of GPU memory", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory"})
    if (message.find(m) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string node_name() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return n;
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  return host.data();
}

void enable(const std::string& run_dir, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::array<char, 256> mine{};
  const std::string name = node_name();
  std::snprintf(mine.data(), mine.size(), "%s", name.c_str());
  std::vector<char> all(mine.size() * static_cast<size_t>(size));
  // Unchecked like the rest of this file: without the names a record still names this rank's own node.
  const bool gathered = MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(), static_cast<int>(mine.size()),
                                      MPI_CHAR, world) == MPI_SUCCESS;
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.dir = (std::filesystem::path(run_dir) / "failures").string();
  s.rank = rank;
  s.nodes.assign(static_cast<size_t>(size), std::string());
  for (int r = 0; r < size; ++r) s.nodes[static_cast<size_t>(r)] = gathered ? std::string(all.data() + r * mine.size()) : std::string();
  s.nodes[static_cast<size_t>(rank)] = name;
}

void disable() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.dir.clear();
  s.nodes.clear();
}

void set_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }

bool restartable(ExitCode code, const std::string& message) {
  switch (code) {
    case ExitCode::Comm:
    case ExitCode::Timeout: return true;
    case ExitCode::Device: return !out_of_memory(message);
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
  if (code == ExitCode::Device && !out_of_memory(message)) add(s.nodes.empty() ? node_name() : s.nodes[static_cast<size_t>(s.rank)]);
  if (code == ExitCode::Timeout) {
    for (const int r : suspect_ranks)
      if (r >= 0 && static_cast<size_t>(r) < s.nodes.size()) add(s.nodes[static_cast<size_t>(r)]);
  }
  return out;
}

std::string format(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks) {
  const std::vector<std::string> nodes = suspects(code, message, suspect_ranks);
  std::string list;
  for (const std::string& n : nodes) {
    if (!list.empty()) list += ',';
    list += json_string(n);
  }
  State& s = state();
  int rank = 0;
  std::string node;
  {
    std::lock_guard lock(s.mutex);
    rank = s.rank;
    node = s.nodes.empty() ? node_name() : s.nodes[static_cast<size_t>(s.rank)];
  }
  return fmt::format(R"({{"exit_code":{},"kind":{},"rank":{},"node":{},"step":{},"restartable":{},"suspect_nodes":[{}],"message":{}}})",
                     static_cast<int>(code), json_string(exit_code_name(code)), rank, json_string(node),
                     g_step.load(std::memory_order_relaxed), restartable(code, message) ? "true" : "false", list, json_string(message)) +
         "\n";
}

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
    const std::string line = format(code, message, suspect_ranks);
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
