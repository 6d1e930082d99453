// SweptOnSignal: a fixed table of paths that a signal handler can read (no allocation, no locks), and the handler.
#include "shardtrain/runtime/temporaries.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <climits>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

namespace shardtrain {
namespace {

constexpr int kSlots = 16;
constexpr size_t kPathBytes = 4096;

// A slot is claimed (Claimed) by the thread registering a path, filled, then published (Live) for the handler.
enum SlotState : int { Free = 0, Claimed = 1, Live = 2 };
struct Slot {
  std::atomic<int> state{Free};
  char path[kPathBytes];
};
std::array<Slot, kSlots> g_slots;
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads the slots' states");

constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};

// The files of a folder, then the folder: raw getdents64 and unlinkat, which a handler may call (opendir may not).
void remove_folder(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[8192];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0) break;
    bool removed = false;
    for (long at = 0; at < n;) {
      // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
      unsigned short reclen = 0;
      std::memcpy(&reclen, buf + at + 16, sizeof reclen);
      const char* name = buf + at + 19;
      if (std::strcmp(name, ".") != 0 && std::strcmp(name, "..") != 0) removed = (::unlinkat(fd, name, 0) == 0) || removed;
      at += reclen;
    }
    if (removed) ::lseek(fd, 0, SEEK_SET);  // the listing changed under us: read it again from the start
  }
  ::close(fd);
  ::rmdir(path);
}

extern "C" void sweep_and_reraise(int sig) {
  const int saved = errno;
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != Live) continue;
    if (::unlink(s.path) != 0 && (errno == EISDIR || errno == EPERM)) remove_folder(s.path);
  }
  errno = saved;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const int sig : kSignals) {
      struct ::sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
      struct ::sigaction sa {};
      sa.sa_handler = sweep_and_reraise;
      sigemptyset(&sa.sa_mask);
      for (const int other : kSignals) sigaddset(&sa.sa_mask, other);  // one sweep at a time
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

}  // namespace

SweptOnSignal::SweptOnSignal(const std::string& path) {
  if (path.size() >= kPathBytes) return;
  install_once();
  for (int i = 0; i < kSlots; ++i) {
    int expected = Free;
    if (!g_slots[i].state.compare_exchange_strong(expected, Claimed, std::memory_order_acquire)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(Live, std::memory_order_release);
    slot_ = i;
    return;
  }
}

SweptOnSignal::~SweptOnSignal() {
  if (slot_ >= 0) g_slots[slot_].state.store(Free, std::memory_order_release);
}

namespace {

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "host";
  std::string h(host);
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

}  // namespace

std::string temporary_stem(std::string_view name, std::string_view kind) {
  // ".KIND-" + HOST (at most HOST_NAME_MAX) + "-" + PID (at most 10 digits) + "-N" (consolidate's further names).
  const size_t room = kind.size() + 2 + HOST_NAME_MAX + 1 + 10 + 8;
  size_t keep = std::min(name.size(), NAME_MAX > room ? NAME_MAX - room : size_t{1});
  // Whole UTF-8 characters: not before a continuation byte.
  while (keep > 1 && keep < name.size() && (static_cast<unsigned char>(name[keep]) & 0xC0) == 0x80) --keep;
  return fmt::format("{}.{}-", name.substr(0, keep), kind);
}

std::string temporary_beside(const std::string& out, std::string_view kind) {
  const std::filesystem::path target(out);
  const std::string stem = temporary_stem(target.filename().string(), kind);
  return (target.parent_path() / fmt::format("{}{}-{}", stem, host_name(), ::getpid())).string();
}

std::vector<std::string> sweep_dead_temporaries(const std::string& out, std::initializer_list<std::string_view> kinds) {
  namespace fs = std::filesystem;
  std::vector<fs::path> dead;  // listed first, removed after: the listing is not changed under its iterator
  const fs::path target(out);
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string base = target.filename().string(), host = host_name();
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (const std::string_view kind : kinds) {
      const std::string prefix = fmt::format("{}{}-", temporary_stem(base, kind), host);
      if (!name.starts_with(prefix)) continue;
      // PID, or PID-N (consolidate's further names of one process).
      const std::string_view rest = std::string_view(name).substr(prefix.size());
      const size_t dash = rest.find('-');
      const std::string_view pid_text = rest.substr(0, dash);
      if (dash != std::string_view::npos && rest.find_first_not_of("0123456789", dash + 1) != std::string_view::npos)
        continue;
      pid_t pid = 0;
      const auto [p, err] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
      if (err != std::errc() || p != pid_text.data() + pid_text.size() || pid <= 0 || pid == ::getpid()) continue;
      if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // it runs (or is another user's: EPERM)
      dead.push_back(target.parent_path() / name);          // as `out` names its folder (no "./" where it names none)
    }
  }
  std::vector<std::string> removed;
  for (const fs::path& p : dead) {
    std::error_code rm;
    fs::remove_all(p, rm);
    if (!rm) removed.push_back(p.string());
  }
  return removed;
}

}  // namespace shardtrain
