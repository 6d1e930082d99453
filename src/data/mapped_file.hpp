// A whole input file mapped read-only, for the readers that seek in it (Parquet, Arrow IPC): the page cache
// holds it, not the heap, and it is read in the order the reader walks it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardtrain::data {

struct MappedFile {
  const uint8_t* data = nullptr;
  size_t size = 0;
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Maps `path` (an empty file maps to nothing: size 0). DataError naming the file when it cannot be opened.
  void map(const std::string& path);
};

}  // namespace shardtrain::data
