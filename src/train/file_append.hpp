// Appending a record to a log file whole or not at all: metrics.jsonl's lines and TensorBoard's records.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

namespace shardtrain::train {

// Writes `text` at the end of `fd` (opened O_APPEND). Returns 0, or the errno of a refusal (ENOSPC for a
// write that wrote nothing), after cutting the file back to its length before the call so that no partial
// record stays behind.
inline int append_whole(int fd, std::string_view text) {
  const off_t before = ::lseek(fd, 0, SEEK_END);
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (err != 0 && before >= 0 && ::ftruncate(fd, before) != 0) err = errno;
  return err;
}

}  // namespace shardtrain::train
