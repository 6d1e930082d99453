// The bytes of an input file, decompressed on the way when its name ends in .gz or .zst (the forms C4, Dolma,
// the Pile and SlimPajama ship their JSONL in), read a buffer at a time: line by line for JSONL and
// blank-line text, whole for a one-document text file. Corrupt or cut-short compressed data is a DataError
// naming the file and the compressed byte where it was found.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain::data {

enum class InputCompression { None, Gzip, Zstd };

// By the file name's last extension: .gz / .gzip, .zst / .zstd, anything else none.
InputCompression input_compression(const std::string& path);
// The name without its compression extension ("c4-0001.json.gz" -> "c4-0001.json").
std::string without_compression_extension(const std::string& path);
// The file name's last extension in ASCII lower case (".JSONL" -> ".jsonl"): Windows tools write SHARD.JSONL and
// x.Json, which were read as plain text.
std::string lowercase_extension(const std::string& path);

class InputFile {
 public:
  explicit InputFile(const std::string& path);  // DataError when it cannot be opened
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // The next line without its '\n' (a last line without one counts); false at the end.
  bool read_line(std::string& line);
  // Everything not read yet.
  std::string read_all();
  // Appends up to `most` of the bytes not read yet to `out`; how many (0 at the end). Memory stays one window.
  size_t read_some(std::string& out, size_t most);
  // True when the file holds no bytes at all (compressed: no bytes once decompressed).
  bool empty();

  // About how many bytes the file decompresses to, from its size and, where the format records it, the
  // gzip trailer or the zstd frame header: a progress bar's estimate, not a promise.
  static uint64_t estimate_size(const std::string& path);

 private:
  bool fill();  // more decompressed bytes into buffer_; false at the end

  struct Decoder;
  std::string path_;
  int fd_ = -1;
  InputCompression compression_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // unread bytes of buffer_
  bool at_end_ = false;
};

}  // namespace shardtrain::data
