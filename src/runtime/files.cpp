// write_file_whole: POSIX calls, each checked, so that the file system's own reason reaches the error.
#include "shardtrain/runtime/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/temporaries.hpp"

namespace shardtrain {

void write_file_whole(const std::string& path, std::string_view text, std::string_view what) {
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const SweptOnSignal swept(tmp);
  auto fail = [&](int err) {
    ::unlink(tmp.c_str());
    throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(fmt::format("{}: cannot write {}: {}", path, what, std::strerror(errno)));
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;  // a write of nothing: no room for even a byte
      ::close(fd);
      fail(err);
    }
    done += static_cast<size_t>(n);
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
