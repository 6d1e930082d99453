// Input files, plain or compressed (input_file.hpp): a 1 MiB window of decompressed bytes over the file, refilled
// by read(2), zlib's inflate (gzip members one after another, as `cat a.gz b.gz` makes) or zstd's streaming
// decoder (frames one after another, as parallel compressors write).
#include "input_file.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data {

namespace {
constexpr size_t kWindow = size_t{1} << 20;

}  // namespace

std::string lowercase_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return ext;
}

InputCompression input_compression(const std::string& path) {
  const auto ext = lowercase_extension(path);
  if (ext == ".gz" || ext == ".gzip") return InputCompression::Gzip;
  if (ext == ".zst" || ext == ".zstd") return InputCompression::Zstd;
  return InputCompression::None;
}

std::string without_compression_extension(const std::string& path) {
  if (input_compression(path) == InputCompression::None) return path;
  return std::filesystem::path(path).replace_extension().string();
}

struct InputFile::Decoder {
  std::vector<uint8_t> in = std::vector<uint8_t>(kWindow);
  size_t in_begin = 0, in_end = 0;
  uint64_t consumed = 0;  // compressed bytes handed to the decoder, for messages
  bool file_done = false;
  z_stream z{};
  bool z_ready = false;
  bool stream_open = false;  // inside a gzip member or zstd frame
  ZSTD_DStream* zstd = nullptr;

  ~Decoder() {
    if (z_ready) inflateEnd(&z);
    if (zstd) ZSTD_freeDStream(zstd);
  }
};

InputFile::InputFile(const std::string& path) : path_(path), compression_(input_compression(path)), buffer_(kWindow) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  if (compression_ == InputCompression::None) return;
  decoder_ = std::make_unique<Decoder>();
  if (compression_ == InputCompression::Gzip) {
    if (inflateInit2(&decoder_->z, 16 + MAX_WBITS) != Z_OK) throw DataError(fmt::format("{}: zlib cannot start", path));
    decoder_->z_ready = true;
  } else {
    decoder_->zstd = ZSTD_createDStream();
    if (!decoder_->zstd || ZSTD_isError(ZSTD_initDStream(decoder_->zstd)))
      throw DataError(fmt::format("{}: zstd cannot start", path));
  }
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool InputFile::fill() {
  if (at_end_) return false;
  // Keep the unread bytes at the front; a line longer than the window widens it.
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
  auto read_some = [&](void* dst, size_t n) -> size_t {
    for (;;) {
      const ssize_t got = ::read(fd_, dst, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) throw DataError(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
    }
  };
  if (!decoder_) {
    const size_t got = read_some(buffer_.data() + end_, buffer_.size() - end_);
    end_ += got;
    at_end_ = got == 0;
    return got > 0;
  }
  Decoder& d = *decoder_;
  const size_t before = end_;
  while (end_ == before) {
    if (d.in_begin == d.in_end && !d.file_done) {
      d.in_begin = 0;
      d.in_end = read_some(d.in.data(), d.in.size());
      d.file_done = d.in_end == 0;
    }
    if (d.in_begin == d.in_end && d.file_done) {
      if (d.stream_open)
        throw DataError(fmt::format("{}: the {} data ends in the middle of a stream (the file is cut short)", path_,
                                    compression_ == InputCompression::Gzip ? "gzip" : "zstd"));
      at_end_ = true;
      return false;
    }
    const size_t avail = d.in_end - d.in_begin;
    if (compression_ == InputCompression::Gzip) {
      if (!d.stream_open && d.consumed > 0 &&
          std::all_of(d.in.begin() + static_cast<ptrdiff_t>(d.in_begin), d.in.begin() + static_cast<ptrdiff_t>(d.in_end),
                      [](uint8_t b) { return b == 0; })) {
        // Zero bytes after the last member: padding (tape blocks, a preallocated file), which gzip -t and zcat
        // ignore as the end of the data. Data after them is still read as a member, and refused if it is not one.
        d.consumed += avail;
        d.in_begin = d.in_end;
        continue;
      }
      if (!d.stream_open) {  // a new member: only after the previous one ended
        if (d.consumed > 0 && inflateReset(&d.z) != Z_OK) throw DataError(fmt::format("{}: zlib cannot restart", path_));
        d.stream_open = true;
      }
      d.z.next_in = d.in.data() + d.in_begin;
      d.z.avail_in = static_cast<uInt>(avail);
      d.z.next_out = reinterpret_cast<Bytef*>(buffer_.data() + end_);
      d.z.avail_out = static_cast<uInt>(buffer_.size() - end_);
      const int rc = inflate(&d.z, Z_NO_FLUSH);
      const size_t used = avail - d.z.avail_in;
      if (rc != Z_OK && rc != Z_STREAM_END)  // with input and room for output, no progress is corruption too
        throw DataError(fmt::format("{}: the gzip data is corrupt near compressed byte {} ({})", path_, d.consumed + used,
                                    d.z.msg ? d.z.msg : zError(rc)));
      end_ = buffer_.size() - d.z.avail_out;
      d.in_begin += used;
      d.consumed += used;
      if (rc == Z_STREAM_END) d.stream_open = false;
    } else {
      ZSTD_inBuffer in{d.in.data() + d.in_begin, avail, 0};
      ZSTD_outBuffer out{buffer_.data() + end_, buffer_.size() - end_, 0};
      const size_t rc = ZSTD_decompressStream(d.zstd, &out, &in);
      if (ZSTD_isError(rc))
        throw DataError(fmt::format("{}: the zstd data is corrupt near compressed byte {} ({})", path_, d.consumed + in.pos,
                                    ZSTD_getErrorName(rc)));
      end_ += out.pos;
      d.in_begin += in.pos;
      d.consumed += in.pos;
      d.stream_open = rc != 0;  // 0: a frame ended and all of it was given out
    }
  }
  return true;
}

bool InputFile::read_line(std::string& line) {
  size_t searched = begin_;
  for (;;) {
    const char* nl = static_cast<const char*>(std::memchr(buffer_.data() + searched, '\n', end_ - searched));
    if (nl) {
      const auto at = static_cast<size_t>(nl - buffer_.data());
      line.assign(buffer_.data() + begin_, at - begin_);
      begin_ = at + 1;
      return true;
    }
    const size_t unread = end_ - begin_;
    if (!fill()) break;
    searched = unread;  // fill() moved the unread bytes to the front
  }
  if (begin_ == end_) return false;
  line.assign(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  return true;
}

std::string InputFile::read_all() {
  while (fill()) {
  }
  std::string out(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  return out;
}

size_t InputFile::read_some(std::string& out, size_t most) {
  if (begin_ == end_ && !fill()) return 0;
  const size_t n = std::min(most, end_ - begin_);
  out.append(buffer_.data() + begin_, n);
  begin_ += n;
  return n;
}

bool InputFile::empty() { return begin_ == end_ && !fill(); }

uint64_t InputFile::estimate_size(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return 0;
  const auto compression = input_compression(path);
  if (compression == InputCompression::None) return size;
  const uint64_t guess = 4 * size;  // text compresses about this much
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return guess;
  uint64_t estimate = guess;
  if (compression == InputCompression::Gzip && size >= 4) {
    // The last member's length mod 2^32: the whole when the file is one member of under 4 GiB.
    uint32_t isize = 0;
    if (pread(fd, &isize, 4, static_cast<off_t>(size - 4)) == 4 && isize >= size) estimate = isize;
  } else if (compression == InputCompression::Zstd) {
    uint8_t head[18] = {};  // a zstd frame header is at most 18 bytes
    const ssize_t got = pread(fd, head, sizeof(head), 0);
    const auto content = got > 0 ? ZSTD_getFrameContentSize(head, static_cast<size_t>(got)) : ZSTD_CONTENTSIZE_UNKNOWN;
    if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != ZSTD_CONTENTSIZE_ERROR && content >= size) estimate = content;
  }
  ::close(fd);
  return estimate;
}

}  // namespace shardtrain::data
