// Mapping input files read-only (mapped_file.hpp).
#include "mapped_file.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data {

MappedFile::~MappedFile() {
  if (data != nullptr && size > 0) munmap(const_cast<uint8_t*>(data), size);
}

void MappedFile::map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat sb {};
  if (fstat(fd, &sb) != 0) {
    const int err = errno;
    ::close(fd);
    throw DataError(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  const auto n = static_cast<size_t>(sb.st_size);
  if (n > 0) {
    void* p = mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    if (p == MAP_FAILED) {
      ::close(fd);
      throw DataError(fmt::format("{}: cannot map: {}", path, std::strerror(err)));
    }
    data = static_cast<const uint8_t*>(p);
    size = n;
    madvise(p, n, MADV_SEQUENTIAL);
  }
  ::close(fd);  // the mapping keeps the file
}

}  // namespace shardtrain::data
