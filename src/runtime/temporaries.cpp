// SweptOnSignal: a fixed table of paths that a signal handler can read (no allocation, no locks), and the handler.
#include "shardtrain/runtime/temporaries.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

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

}  // namespace shardtrain
