// write_file_whole: POSIX calls, each checked, so that the file system's own reason reaches the error.
#include "shardtrain/runtime/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/temporaries.hpp"

namespace shardtrain {

namespace {

// Every byte of `text` to `fd`; errno of the failed write (ENOSPC for a write of nothing), or 0.
int write_all(int fd, std::string_view text) {
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;  // a write of nothing: no room for even a byte
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

int standard_stream_at(const std::string& path) {
  struct stat at {};
  if (path.empty() || ::stat(path.c_str(), &at) != 0) return 0;
  for (const int fd : {1, 2}) {
    struct stat s {};
    if (::fstat(fd, &s) == 0 && s.st_dev == at.st_dev && s.st_ino == at.st_ino) return fd;
  }
  return 0;
}

void write_file_whole(const std::string& path, std::string_view text, std::string_view what) {
  // In place: this process's own output (the stdio buffer first, so the text follows what was printed), or a device or
  // pipe, which a rename would replace.
  if (const int fd = standard_stream_at(path)) {
    std::fflush(fd == 1 ? stdout : stderr);
    if (const int err = write_all(fd, text))
      throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(err)));
    return;
  }
  if (struct stat s{}; ::stat(path.c_str(), &s) == 0 && !S_ISREG(s.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(errno)));
    const int err = write_all(fd, text);
    if (::close(fd) != 0 && err == 0)
      throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(errno)));
    if (err != 0) throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(err)));
    return;
  }
  const std::string tmp = temporary_beside(path);
  const SweptOnSignal swept(tmp);
  auto fail = [&](int err) {
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(errno)));
  if (const int err = write_all(fd, text)) {
    ::close(fd);
    fail(err);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(err);
  }
  if (::close(fd) != 0) fail(errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(errno);
}

std::string os_reason() { return errno != 0 ? fmt::format(": {}", std::strerror(errno)) : std::string(); }

}  // namespace shardtrain
