// Reading one Parquet column chunk page by page (parquet_format.hpp): page headers, their CRCs,
// decompression, repetition and definition levels (RLE/bit-packed hybrid, or the old BIT_PACKED), in data
// pages of version 1 or 2. Strings: values in PLAIN, dictionary (PLAIN_DICTIONARY / RLE_DICTIONARY),
// DELTA_LENGTH_BYTE_ARRAY or DELTA_BYTE_ARRAY encoding. Lists of INT32 / INT64 (token ids): PLAIN,
// dictionary or DELTA_BINARY_PACKED, rows assembled from the levels, across pages. Every length and offset is
// checked against its buffer: a corrupt file is a DataError naming the file, row group, column and byte,
// never a crash.
#include <brotli/decode.h>
#include <lz4.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <span>

#include "parquet_format.hpp"
#include "shardtrain/runtime/error.hpp"
#include "thrift_compact.hpp"

namespace shardtrain::data::parquet_detail {
namespace {

using thrift::CompactReader;
using thrift::Type;

// A problem inside a chunk; read_column_chunk adds the file, row group and column.
class ChunkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw ChunkError(fmt::format(f, std::forward<Args>(args)...));
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // little-endian, as this host
}

// `bits` bits (at most 64) starting `bit` bits into data[0, size), least significant bit first (the order of
// Parquet's bit-packed runs); bytes past the end read as zero, for the caller to have bounded.
uint64_t bits_lsb_first(const uint8_t* data, size_t size, uint64_t bit, int bits) {
  if (bits == 0) return 0;
  const size_t first = static_cast<size_t>(bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  uint8_t buf[16] = {};
  const size_t want = static_cast<size_t>((shift + bits + 7) >> 3);  // at most 9 bytes
  if (first < size) std::memcpy(buf, data + first, std::min(want, size - first));
  uint64_t lo;
  std::memcpy(&lo, buf, 8);
  uint64_t v = lo >> shift;
  if (shift + bits > 64) v |= static_cast<uint64_t>(buf[8]) << (64 - shift);
  return bits == 64 ? v : v & ((uint64_t{1} << bits) - 1);
}

uint64_t read_uleb(const uint8_t*& p, const uint8_t* end) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= end) fail("a varint runs past the end of its page");
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  fail("a varint longer than 10 bytes");
}
int64_t read_zigzag(const uint8_t*& p, const uint8_t* end) {
  const uint64_t v = read_uleb(p, end);
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

// The RLE / bit-packing hybrid: runs of one repeated value, and runs of groups of 8 bit-packed values.
class HybridDecoder {
 public:
  HybridDecoder(const uint8_t* p, const uint8_t* end, int bit_width) : p_(p), end_(end), width_(bit_width) {
    if (bit_width < 0 || bit_width > 32) fail("a bit width of {} (at most 32)", bit_width);
  }
  void read(uint32_t* out, size_t count) {
    for (size_t i = 0; i < count;) {
      if (left_ == 0) next_run();
      const size_t n = std::min<size_t>(count - i, left_);
      if (rle_) {
        std::fill_n(out + i, n, value_);
      } else {
        for (size_t k = 0; k < n; ++k, ++packed_index_) {
          const uint64_t bit = packed_index_ * static_cast<uint64_t>(width_);
          if (((bit + static_cast<uint64_t>(width_) + 7) >> 3) > packed_bytes_) fail("a bit-packed run is cut short");
          out[i + k] = static_cast<uint32_t>(bits_lsb_first(packed_, packed_bytes_, bit, width_));
        }
      }
      i += n;
      left_ -= n;
    }
  }

 private:
  void next_run() {
    const uint64_t header = read_uleb(p_, end_);
    if (header & 1) {  // (header >> 1) groups of 8 values, width bits each
      const uint64_t groups = header >> 1;
      if (groups == 0 || groups > (uint64_t{1} << 31)) fail("a bit-packed run of {} groups", groups);
      const uint64_t bytes = groups * static_cast<uint64_t>(width_);
      packed_ = p_;
      // The last run of a buffer may stop short of its groups' bytes: what is there is read, the rest fails.
      packed_bytes_ = static_cast<size_t>(std::min<uint64_t>(bytes, static_cast<uint64_t>(end_ - p_)));
      p_ += packed_bytes_;
      packed_index_ = 0;
      left_ = groups * 8;
      rle_ = false;
    } else {
      left_ = header >> 1;
      if (left_ == 0) fail("an RLE run of no values");
      const int bytes = (width_ + 7) / 8;
      if (end_ - p_ < bytes) fail("an RLE run's value runs past the end of its page");
      value_ = 0;
      for (int b = 0; b < bytes; ++b) value_ |= static_cast<uint32_t>(p_[b]) << (8 * b);
      p_ += bytes;
      if (width_ < 32 && (value_ >> width_) != 0) fail("an RLE value wider than its {} bits", width_);
      rle_ = true;
    }
  }

  const uint8_t* p_;
  const uint8_t* end_;
  int width_;
  uint64_t left_ = 0;
  bool rle_ = false;
  uint32_t value_ = 0;
  const uint8_t* packed_ = nullptr;
  size_t packed_bytes_ = 0;
  uint64_t packed_index_ = 0;
};

int bit_width(uint32_t max_value) { return max_value == 0 ? 0 : 32 - std::countl_zero(max_value); }

// DELTA_BINARY_PACKED: a header, then blocks of a min delta and miniblocks of bit-packed deltas. Decodes
// exactly `expected` values (the page says how many) and leaves p after the last miniblock it needed.
std::vector<int64_t> delta_binary_packed(const uint8_t*& p, const uint8_t* end, size_t expected) {
  const uint64_t block = read_uleb(p, end), minis = read_uleb(p, end), total = read_uleb(p, end);
  const int64_t first = read_zigzag(p, end);
  if (block == 0 || block % 128 != 0 || minis == 0 || block % minis != 0 || (block / minis) % 32 != 0)
    fail("a DELTA_BINARY_PACKED header with blocks of {} values in {} miniblocks", block, minis);
  if (total != expected) fail("a DELTA_BINARY_PACKED run of {} values where the page has {}", total, expected);
  std::vector<int64_t> out;
  out.reserve(expected);
  if (total == 0) return out;
  out.push_back(first);
  const uint64_t per_mini = block / minis;
  uint64_t last = static_cast<uint64_t>(first);
  while (out.size() < total) {
    const auto min_delta = static_cast<uint64_t>(read_zigzag(p, end));
    if (static_cast<uint64_t>(end - p) < minis) fail("a DELTA_BINARY_PACKED block header runs past its page");
    const uint8_t* widths = p;
    p += minis;
    for (uint64_t m = 0; m < minis && out.size() < total; ++m) {
      const int w = widths[m];
      if (w > 64) fail("a DELTA_BINARY_PACKED miniblock of {} bits", w);
      const uint64_t bytes = per_mini * static_cast<uint64_t>(w) / 8;
      const uint64_t take = std::min<uint64_t>(per_mini, total - out.size());
      if (take * static_cast<uint64_t>(w) > static_cast<uint64_t>(end - p) * 8)
        fail("a DELTA_BINARY_PACKED miniblock runs past the end of its page");
      for (uint64_t k = 0; k < take; ++k) {
        last += min_delta + bits_lsb_first(p, static_cast<size_t>(end - p), k * static_cast<uint64_t>(w), w);
        out.push_back(static_cast<int64_t>(last));
      }
      p += std::min<uint64_t>(bytes, static_cast<uint64_t>(end - p));  // the last miniblock may be cut short
    }
  }
  return out;
}

void plain_byte_arrays(const uint8_t* p, const uint8_t* end, size_t count, std::vector<std::string_view>& out) {
  if (count > static_cast<size_t>(end - p) / 4) fail("{} PLAIN values in a page of {} bytes", count, end - p);
  out.reserve(out.size() + count);
  for (size_t i = 0; i < count; ++i) {
    if (end - p < 4) fail("PLAIN value {} of {} runs past the end of its page", i, count);
    const uint32_t n = load_u32(p);
    p += 4;
    if (n > static_cast<uint64_t>(end - p))
      fail("PLAIN value {} of {} ({} bytes) runs past the end of its page", i, count, n);
    out.emplace_back(reinterpret_cast<const char*>(p), n);
    p += n;
  }
}

void delta_length_byte_arrays(const uint8_t*& p, const uint8_t* end, size_t count, std::vector<std::string_view>& out) {
  const auto lengths = delta_binary_packed(p, end, count);
  out.reserve(out.size() + count);
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = lengths[i];
    if (n < 0 || n > end - p) fail("DELTA_LENGTH_BYTE_ARRAY value {} of {} ({} bytes) runs past its page", i, count, n);
    out.emplace_back(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    p += n;
  }
}

void delta_byte_arrays(const uint8_t* p, const uint8_t* end, size_t count, std::vector<std::string>& out) {
  const auto prefixes = delta_binary_packed(p, end, count);
  std::vector<std::string_view> suffixes;
  delta_length_byte_arrays(p, end, count, suffixes);
  out.reserve(count);
  std::string_view previous;
  for (size_t i = 0; i < count; ++i) {
    const int64_t keep = prefixes[i];
    if (keep < 0 || static_cast<uint64_t>(keep) > previous.size())
      fail("DELTA_BYTE_ARRAY value {} keeps {} bytes of a {}-byte predecessor", i, keep, previous.size());
    std::string v(previous.substr(0, static_cast<size_t>(keep)));
    v.append(suffixes[i]);
    out.push_back(std::move(v));
    previous = out.back();
  }
}

// Decompresses src into exactly `size` bytes (the page header's count) of buf; an uncompressed page is
// returned as it lies in the file.
std::span<const uint8_t> decompress(int32_t codec, std::span<const uint8_t> src, size_t size, std::vector<uint8_t>& buf) {
  const auto c = static_cast<Codec>(codec);
  constexpr size_t kMaxPage = size_t{1} << 30;  // what the page header asks for is allocated: bound it
  if (size > kMaxPage) fail("a page of {} bytes once decompressed (more than 1 GiB)", size);
  if (c == Codec::Uncompressed) {
    if (src.size() != size) fail("an uncompressed page of {} bytes says it holds {}", src.size(), size);
    return src;
  }
  if (size == 0) return {};  // a page of nulls only: nothing to decompress
  buf.resize(size);
  const auto* in = reinterpret_cast<const char*>(src.data());
  auto* out = reinterpret_cast<char*>(buf.data());
  size_t got = 0;
  switch (c) {
    case Codec::Snappy: {
      if (snappy_uncompressed_length(in, src.size(), &got) != SNAPPY_OK || got != size ||
          snappy_uncompress(in, src.size(), out, &got) != SNAPPY_OK)
        fail("a SNAPPY page does not decompress to its {} bytes", size);
      break;
    }
    case Codec::Gzip: {  // gzip members (or a zlib stream), one after another
      z_stream z{};
      if (inflateInit2(&z, 15 + 32) != Z_OK) fail("zlib cannot start");
      z.next_in = const_cast<Bytef*>(src.data());
      z.avail_in = static_cast<uInt>(src.size());
      z.next_out = buf.data();
      z.avail_out = static_cast<uInt>(size);
      int rc = Z_OK;
      while (true) {
        rc = inflate(&z, Z_FINISH);
        if (rc == Z_STREAM_END && z.avail_in > 0 && z.avail_out > 0) {
          inflateReset(&z);
          continue;
        }
        break;
      }
      got = size - z.avail_out;
      inflateEnd(&z);
      if (rc != Z_STREAM_END || got != size) fail("a GZIP page does not decompress to its {} bytes", size);
      break;
    }
    case Codec::Brotli: {
      got = size;
      if (BrotliDecoderDecompress(src.size(), src.data(), &got, buf.data()) != BROTLI_DECODER_RESULT_SUCCESS || got != size)
        fail("a BROTLI page does not decompress to its {} bytes", size);
      break;
    }
    case Codec::Zstd: {
      const size_t rc = ZSTD_decompress(out, size, in, src.size());
      if (ZSTD_isError(rc) || rc != size)
        fail("a ZSTD page does not decompress to its {} bytes ({})", size,
             ZSTD_isError(rc) ? ZSTD_getErrorName(rc) : "short");
      break;
    }
    case Codec::Lz4Raw: {
      if (LZ4_decompress_safe(in, out, static_cast<int>(src.size()), static_cast<int>(size)) != static_cast<int>(size))
        fail("an LZ4_RAW page does not decompress to its {} bytes", size);
      break;
    }
    case Codec::Lz4: {
      // The deprecated LZ4 codec: Hadoop's framing (big-endian lengths before each block), or, from some
      // writers, one bare LZ4 block; the framing is tried first, as other readers do.
      const uint8_t* p = src.data();
      const uint8_t* end = p + src.size();
      bool framed = true;
      while (framed && p < end) {
        if (end - p < 8) {
          framed = false;
          break;
        }
        const uint32_t raw = __builtin_bswap32(load_u32(p)), packed = __builtin_bswap32(load_u32(p + 4));
        p += 8;
        if (packed > static_cast<size_t>(end - p) || raw > size - got ||
            LZ4_decompress_safe(reinterpret_cast<const char*>(p), out + got, static_cast<int>(packed),
                                static_cast<int>(raw)) != static_cast<int>(raw)) {
          framed = false;
          break;
        }
        p += packed;
        got += raw;
      }
      if (!framed || got != size) {
        if (LZ4_decompress_safe(in, out, static_cast<int>(src.size()), static_cast<int>(size)) != static_cast<int>(size))
          fail("an LZ4 page does not decompress to its {} bytes (neither Hadoop-framed nor a bare block)", size);
      }
      break;
    }
    case Codec::Lzo:
      fail(
          "its pages are LZO-compressed, which no common writer uses and this reader does not read: "
          "rewrite the file with SNAPPY or ZSTD");
    default: fail("its pages use {}, which is not a Parquet codec", codec_name(codec));
  }
  return {buf.data(), size};
}

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed_size = -1, compressed_size = -1;
  std::optional<int32_t> crc;
  int32_t num_values = -1;  // data and dictionary pages
  int32_t encoding = 0;
  int32_t def_encoding = static_cast<int32_t>(Encoding::Rle), rep_encoding = static_cast<int32_t>(Encoding::Rle);
  int32_t v2_num_nulls = 0, v2_def_bytes = 0, v2_rep_bytes = 0;
  bool v2_compressed = true;
};

PageHeader read_page_header(CompactReader& r) {
  PageHeader h;
  auto i32 = [&](Type t) { return static_cast<int32_t>(r.read_int(t)); };
  r.read_struct([&](int16_t id, Type t) {
    switch (id) {
      case 1: h.type = i32(t); break;
      case 2: h.uncompressed_size = i32(t); break;
      case 3: h.compressed_size = i32(t); break;
      case 4: h.crc = i32(t); break;
      case 5:  // DataPageHeader
        r.read_struct(t, [&](int16_t f, Type ft) {
          if (f == 1) h.num_values = i32(ft);
          else if (f == 2) h.encoding = i32(ft);
          else if (f == 3) h.def_encoding = i32(ft);
          else if (f == 4) h.rep_encoding = i32(ft);
          else r.skip(ft);
        });
        break;
      case 7:  // DictionaryPageHeader
        r.read_struct(t, [&](int16_t f, Type ft) {
          if (f == 1) h.num_values = i32(ft);
          else if (f == 2) h.encoding = i32(ft);
          else r.skip(ft);
        });
        break;
      case 8:  // DataPageHeaderV2
        r.read_struct(t, [&](int16_t f, Type ft) {
          switch (f) {
            case 1: h.num_values = i32(ft); break;
            case 2: h.v2_num_nulls = i32(ft); break;
            case 4: h.encoding = i32(ft); break;
            case 5: h.v2_def_bytes = i32(ft); break;
            case 6: h.v2_rep_bytes = i32(ft); break;
            case 7: h.v2_compressed = r.read_bool(ft); break;
            default: r.skip(ft);
          }
        });
        break;
      default: r.skip(t);
    }
  });
  if (h.uncompressed_size < 0 || h.compressed_size < 0)
    fail("a page header without its sizes ({} compressed, {} uncompressed)", h.compressed_size, h.uncompressed_size);
  return h;
}

// A v1 page's repetition or definition levels (`what`), `count` of them at most max_level into out: RLE (a
// 4-byte length, then the hybrid runs) or the deprecated BIT_PACKED (most significant bit first). Returns the
// byte after them.
const uint8_t* v1_levels(const char* what, int32_t encoding, const uint8_t* p, const uint8_t* end, size_t count,
                         int max_level, std::vector<uint32_t>& out) {
  const int width = bit_width(static_cast<uint32_t>(max_level));
  if (encoding == static_cast<int32_t>(Encoding::Rle)) {
    if (end - p < 4) fail("a data page too short for its {} levels", what);
    const uint32_t n = load_u32(p);
    p += 4;
    if (n > static_cast<uint64_t>(end - p)) fail("{} levels of {} bytes run past their page", what, n);
    HybridDecoder(p, p + n, width).read(out.data(), count);
    return p + n;
  }
  if (encoding == static_cast<int32_t>(Encoding::BitPacked)) {
    const uint64_t bytes = (count * static_cast<uint64_t>(width) + 7) / 8;
    if (bytes > static_cast<uint64_t>(end - p)) fail("BIT_PACKED {} levels run past their page", what);
    for (size_t i = 0; i < count; ++i) {
      uint32_t v = 0;
      for (int b = 0; b < width; ++b) {
        const uint64_t bit = i * static_cast<uint64_t>(width) + static_cast<uint64_t>(b);
        v = (v << 1) | ((p[bit >> 3] >> (7 - (bit & 7))) & 1u);
      }
      out[i] = v;
    }
    return p + bytes;
  }
  fail("{} levels in {} (RLE expected)", what, encoding_name(encoding));
}

// A data page's levels, and where its values start and end: v1 (levels inside the compressed data) or v2
// (levels before it, uncompressed). Repetition levels go to rep and definition levels to def when the column
// has them (both sized to the page's num_values by the caller, and left as they are otherwise).
struct PageValues {
  const uint8_t* p;
  const uint8_t* end;
};
PageValues page_levels(const ColumnChunk& chunk, const ParquetColumn& column, const PageHeader& h,
                       std::span<const uint8_t> body, bool v2, std::vector<uint8_t>& page_buffer, std::vector<uint32_t>& rep,
                       std::vector<uint32_t>& def) {
  const auto count = static_cast<size_t>(h.num_values);
  const int max_rep = column.max_repetition_level, max_def = column.max_definition_level;
  if (!v2) {
    const auto data = decompress(chunk.codec, body, static_cast<size_t>(h.uncompressed_size), page_buffer);
    const uint8_t* p = data.data();
    const uint8_t* end = p + data.size();
    if (max_rep > 0) p = v1_levels("repetition", h.rep_encoding, p, end, count, max_rep, rep);
    if (max_def > 0) p = v1_levels("definition", h.def_encoding, p, end, count, max_def, def);
    return {p, end};
  }
  const auto levels = static_cast<int64_t>(h.v2_def_bytes) + h.v2_rep_bytes;
  if (h.v2_def_bytes < 0 || h.v2_rep_bytes < 0 || levels > h.compressed_size || levels > h.uncompressed_size)
    fail("a v2 data page whose levels ({} + {} bytes) exceed the page", h.v2_rep_bytes, h.v2_def_bytes);
  const uint8_t* r = body.data();
  if (max_rep > 0) HybridDecoder(r, r + h.v2_rep_bytes, bit_width(static_cast<uint32_t>(max_rep))).read(rep.data(), count);
  const uint8_t* d = r + h.v2_rep_bytes;
  if (max_def > 0) HybridDecoder(d, d + h.v2_def_bytes, bit_width(static_cast<uint32_t>(max_def))).read(def.data(), count);
  const auto values = body.subspan(static_cast<size_t>(levels));
  const auto size = static_cast<size_t>(h.uncompressed_size - levels);
  const auto data = h.v2_compressed ? decompress(chunk.codec, values, size, page_buffer) : values;
  if (!h.v2_compressed && data.size() != size)
    fail("an uncompressed v2 page of {} bytes says it holds {}", data.size(), size);
  return {data.data(), data.data() + data.size()};
}

// A dictionary page's values, decompressed (PLAIN: the one encoding a dictionary page has), once per chunk.
std::span<const uint8_t> dictionary_values(const ColumnChunk& chunk, const PageHeader& h, std::span<const uint8_t> body,
                                           bool have_dictionary, std::vector<uint8_t>& buffer) {
  if (have_dictionary) fail("a second dictionary page");
  if (h.encoding != static_cast<int32_t>(Encoding::Plain) && h.encoding != static_cast<int32_t>(Encoding::PlainDictionary))
    fail("a dictionary page in {} (PLAIN expected)", encoding_name(h.encoding));
  if (h.num_values < 0) fail("a dictionary page of {} values", h.num_values);
  return decompress(chunk.codec, body, static_cast<size_t>(h.uncompressed_size), buffer);
}

// How many of the page's definition levels say a value is there (max_def); each must be at most max_def, and a
// v2 page's count of nulls must agree.
size_t present_values(const std::vector<uint32_t>& def, int max_def, const PageHeader& h, bool v2) {
  size_t present = 0;
  for (const uint32_t level : def) {
    if (level > static_cast<uint32_t>(max_def)) fail("a definition level of {} (at most {})", level, max_def);
    present += level == static_cast<uint32_t>(max_def);
  }
  if (v2 && def.size() - present != static_cast<size_t>(h.v2_num_nulls))
    fail("a v2 data page of {} nulls whose levels say {}", h.v2_num_nulls, def.size() - present);
  return present;
}

// The reading of one chunk of strings: its dictionary, and the pages' buffers reused from page to page.
class ChunkReader {
 public:
  ChunkReader(const ColumnChunk& chunk, const ParquetColumn& column,
              const std::function<void(std::optional<std::string_view>)>& emit)
      : chunk_(chunk), column_(column), emit_(emit) {}

  void dictionary_page(const PageHeader& h, std::span<const uint8_t> body) {
    const auto data = dictionary_values(chunk_, h, body, have_dictionary_, dictionary_buffer_);
    plain_byte_arrays(data.data(), data.data() + data.size(), static_cast<size_t>(h.num_values), dictionary_);
    have_dictionary_ = true;
  }

  // Before the pages: the chunk is what this reader reads.
  void check(const ColumnChunk& chunk, const RowGroup& group) const {
    if (chunk.type != static_cast<int32_t>(PhysicalType::ByteArray))
      fail("the chunk holds {}, not strings", physical_type_name(chunk.type));
    if (chunk.num_values != group.num_rows) fail("{} values in a row group of {} rows", chunk.num_values, group.num_rows);
  }
  void finish(const RowGroup&) {}

  // A data page's values. `left`: the chunk's values not yet read, which bounds the page's.
  size_t data_page(const PageHeader& h, std::span<const uint8_t> body, bool v2, int64_t left) {
    if (h.num_values < 0 || h.num_values > left)
      fail("a data page of {} values where the chunk has {} left", h.num_values, left);
    const auto rows = static_cast<size_t>(h.num_values);
    const int max_def = column_.max_definition_level;
    levels_.assign(rows, static_cast<uint32_t>(max_def));
    // A string column has no repetition levels (string_column refuses lists): levels_ only takes definition ones.
    const PageValues v = page_levels(chunk_, column_, h, body, v2, page_buffer_, levels_, levels_);
    decode_values(h.encoding, v.p, v.end, present_values(levels_, max_def, h, v2));
    size_t next = 0;
    for (const uint32_t level : levels_) {
      if (level == static_cast<uint32_t>(max_def)) emit_(values_[next++]);
      else emit_(std::nullopt);
    }
    return rows;
  }

 private:
  void decode_values(int32_t encoding, const uint8_t* p, const uint8_t* end, size_t count) {
    values_.clear();
    owned_.clear();
    switch (static_cast<Encoding>(encoding)) {
      case Encoding::Plain: plain_byte_arrays(p, end, count, values_); return;
      case Encoding::PlainDictionary:
      case Encoding::RleDictionary: {
        if (!have_dictionary_) fail("a dictionary-encoded page with no dictionary page before it");
        if (count == 0) return;
        if (p >= end) fail("a dictionary-encoded page without its bit width");
        const int width = *p++;
        indices_.resize(count);
        HybridDecoder(p, end, width).read(indices_.data(), count);
        values_.reserve(count);
        for (const uint32_t i : indices_) {
          if (i >= dictionary_.size()) fail("a dictionary index of {} into {} entries", i, dictionary_.size());
          values_.push_back(dictionary_[i]);
        }
        return;
      }
      case Encoding::DeltaLengthByteArray: delta_length_byte_arrays(p, end, count, values_); return;
      case Encoding::DeltaByteArray: {
        delta_byte_arrays(p, end, count, owned_);  // each value is made: a prefix of the one before, then its suffix
        values_.assign(owned_.begin(), owned_.end());
        return;
      }
      default: fail("string values in {}, which this reader does not decode", encoding_name(encoding));
    }
  }

  const ColumnChunk& chunk_;
  const ParquetColumn& column_;
  const std::function<void(std::optional<std::string_view>)>& emit_;
  bool have_dictionary_ = false;
  std::vector<uint8_t> dictionary_buffer_, page_buffer_;
  std::vector<std::string_view> dictionary_;
  std::vector<uint32_t> levels_, indices_;
  std::vector<std::string_view> values_;  // the page's values: into the page, the dictionary, or owned_
  std::vector<std::string> owned_;
};

// PLAIN integers of the chunk's physical type (INT32 sign-extended, or INT64), `count` of them.
void plain_ints(int32_t type, const uint8_t* p, const uint8_t* end, size_t count, std::vector<int64_t>& out) {
  const size_t width = type == static_cast<int32_t>(PhysicalType::Int32) ? 4 : 8;
  if (count > static_cast<size_t>(end - p) / width) fail("{} PLAIN values of {} bytes run past their page", count, width);
  out.resize(count);
  for (size_t i = 0; i < count; ++i, p += width) {
    if (width == 4) {
      int32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], p, 8);
    }
  }
}

// The reading of one chunk of a list-of-integers column (ParquetColumn::is_id_list): each row's values
// assembled from the levels (repetition 0 starts a row; a definition level of max_def is a value, of
// repeated_definition_level - 1 an empty list, below that a null row, between a null inside the list), rows
// carried across pages, every row emitted once complete.
class IdChunkReader {
 public:
  IdChunkReader(const ColumnChunk& chunk, const ParquetColumn& column,
                const std::function<void(std::optional<std::span<const int64_t>>)>& emit)
      : chunk_(chunk), column_(column), emit_(emit) {}

  void check(const ColumnChunk& chunk, const RowGroup&) const {
    if (chunk.type != static_cast<int32_t>(PhysicalType::Int32) && chunk.type != static_cast<int32_t>(PhysicalType::Int64))
      fail("the chunk holds {}, not integers", physical_type_name(chunk.type));
  }

  void dictionary_page(const PageHeader& h, std::span<const uint8_t> body) {
    const auto data = dictionary_values(chunk_, h, body, have_dictionary_, page_buffer_);
    plain_ints(chunk_.type, data.data(), data.data() + data.size(), static_cast<size_t>(h.num_values), dictionary_);
    have_dictionary_ = true;
  }

  size_t data_page(const PageHeader& h, std::span<const uint8_t> body, bool v2, int64_t left) {
    if (h.num_values < 0 || h.num_values > left)
      fail("a data page of {} values where the chunk has {} left", h.num_values, left);
    const auto count = static_cast<size_t>(h.num_values);
    const int max_def = column_.max_definition_level, entry = column_.repeated_definition_level;
    rep_.assign(count, 0);
    def_.assign(count, static_cast<uint32_t>(max_def));
    const PageValues v = page_levels(chunk_, column_, h, body, v2, page_buffer_, rep_, def_);
    decode_values(h.encoding, v.p, v.end, present_values(def_, max_def, h, v2));
    size_t next = 0;
    for (size_t i = 0; i < count; ++i) {
      const auto def = static_cast<int>(def_[i]);
      if (rep_[i] > 1) fail("a repetition level of {} (at most 1)", rep_[i]);
      if (rep_[i] == 0) {
        flush();
        started_ = true;
      } else if (!started_ || def < entry) {
        fail("a list continues where no list has started (repetition 1, definition {})", def);
      }
      if (def == max_def) {
        row_.push_back(values_[next++]);
      } else if (def >= entry) {
        fail("row {} holds a null inside its list of ids", rows_);
      } else if (def < entry - 1) {
        null_row_ = true;
      }  // def == entry - 1: an empty list
    }
    return count;
  }

  void finish(const RowGroup& group) {
    flush();
    if (rows_ != group.num_rows) fail("its levels hold {} rows in a row group of {}", rows_, group.num_rows);
  }

 private:
  void flush() {
    if (!started_) return;
    if (null_row_) emit_(std::nullopt);
    else emit_(std::span<const int64_t>(row_));
    row_.clear();
    null_row_ = started_ = false;
    ++rows_;
  }

  void decode_values(int32_t encoding, const uint8_t* p, const uint8_t* end, size_t count) {
    const bool int32 = chunk_.type == static_cast<int32_t>(PhysicalType::Int32);
    switch (static_cast<Encoding>(encoding)) {
      case Encoding::Plain: plain_ints(chunk_.type, p, end, count, values_); return;
      case Encoding::PlainDictionary:
      case Encoding::RleDictionary: {
        if (!have_dictionary_) fail("a dictionary-encoded page with no dictionary page before it");
        values_.resize(count);
        if (count == 0) return;
        if (p >= end) fail("a dictionary-encoded page without its bit width");
        const int width = *p++;
        indices_.resize(count);
        HybridDecoder(p, end, width).read(indices_.data(), count);
        for (size_t i = 0; i < count; ++i) {
          if (indices_[i] >= dictionary_.size())
            fail("a dictionary index of {} into {} entries", indices_[i], dictionary_.size());
          values_[i] = dictionary_[indices_[i]];
        }
        return;
      }
      case Encoding::DeltaBinaryPacked:
        values_ = delta_binary_packed(p, end, count);
        if (int32)  // INT32 deltas wrap at 32 bits
          for (int64_t& v : values_) v = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v)));
        return;
      default: fail("integer values in {}, which this reader does not decode", encoding_name(encoding));
    }
  }

  const ColumnChunk& chunk_;
  const ParquetColumn& column_;
  const std::function<void(std::optional<std::span<const int64_t>>)>& emit_;
  bool have_dictionary_ = false, started_ = false, null_row_ = false;
  int64_t rows_ = 0;
  std::vector<uint8_t> page_buffer_;
  std::vector<int64_t> dictionary_, values_, row_;
  std::vector<uint32_t> rep_, def_, indices_;
};

// The pages of one column chunk, in order, to the reader (a ChunkReader or an IdChunkReader): its check
// first, the dictionary page and the data pages, then its finish. A ChunkError becomes a DataError naming the
// file, the row group, the column and the page's byte.
template <typename Reader>
void read_pages(const FileMetadata& file, size_t row_group, const ParquetColumn& column, Reader& reader,
                ParquetReadStats* stats) {
  const RowGroup& group = file.row_groups[row_group];
  const ColumnChunk& chunk = group.columns[static_cast<size_t>(column.leaf_index)];
  size_t at = 0;  // the page being read, for messages
  try {
    if (!chunk.has_metadata) fail("its metadata is encrypted, which is not supported");
    if (!chunk.external_path.empty()) fail("its data is in another file ({}), which is not supported", chunk.external_path);
    reader.check(chunk, group);
    if (chunk.num_values == 0) return reader.finish(group);
    // The chunk starts at its dictionary page when it has one (some writers record an offset of 0 for none).
    int64_t start = chunk.data_page_offset;
    if (chunk.dictionary_page_offset && *chunk.dictionary_page_offset > 0 && *chunk.dictionary_page_offset < start)
      start = *chunk.dictionary_page_offset;
    const int64_t end = start + chunk.total_compressed_size;
    if (start < 4 || chunk.total_compressed_size <= 0 || end > static_cast<int64_t>(file.footer_begin) || end < start)
      fail("its bytes [{}, {}) are not inside the file's data [4, {})", start, end, file.footer_begin);
    int64_t rows = 0;
    auto pos = static_cast<size_t>(start);
    while (rows < chunk.num_values) {
      at = pos;
      if (pos >= static_cast<size_t>(end)) fail("the chunk ends after {} of its {} values", rows, chunk.num_values);
      CompactReader r(file.file.data + pos, static_cast<size_t>(end) - pos);
      PageHeader h;
      try {
        h = read_page_header(r);
      } catch (const thrift::ThriftError& e) {
        fail("its page header cannot be read: {}", e.what());
      }
      const size_t body_at = pos + r.position();
      if (static_cast<size_t>(h.compressed_size) > static_cast<size_t>(end) - body_at)
        fail("a page of {} bytes runs past the end of the chunk", h.compressed_size);
      const std::span<const uint8_t> body(file.file.data + body_at, static_cast<size_t>(h.compressed_size));
      if (h.crc &&
          static_cast<uint32_t>(*h.crc) != static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size()))))
        fail("the page's CRC does not match its bytes: the file is corrupt");
      switch (static_cast<PageType>(h.type)) {
        case PageType::DictionaryPage:
          if (rows > 0) fail("a dictionary page after data pages");
          reader.dictionary_page(h, body);
          break;
        case PageType::DataPage:
          rows += static_cast<int64_t>(reader.data_page(h, body, false, chunk.num_values - rows));
          break;
        case PageType::DataPageV2:
          rows += static_cast<int64_t>(reader.data_page(h, body, true, chunk.num_values - rows));
          break;
        default: break;  // index pages, and page types newer than this reader, hold no values
      }
      if (stats) {
        static constexpr const char* kPageTypes[] = {"DATA_PAGE", "INDEX_PAGE", "DICTIONARY_PAGE", "DATA_PAGE_V2"};
        const char* kind = h.type >= 0 && h.type < 4 ? kPageTypes[h.type] : "UNKNOWN_PAGE";
        ++stats->pages[fmt::format("{} {} {}", kind, encoding_name(h.encoding), codec_name(chunk.codec))];
      }
      pos = body_at + body.size();
    }
    if (rows != chunk.num_values) fail("its pages hold {} values where the chunk says {}", rows, chunk.num_values);
    at = 0;
    reader.finish(group);
  } catch (const ChunkError& e) {
    throw DataError(fmt::format("{}: row group {}, column \"{}\"{}: {}", file.path, row_group, column.path,
                                at ? fmt::format(", page at byte {}", at) : std::string(), e.what()));
  }
}

}  // namespace

void read_column_chunk(const FileMetadata& file, size_t row_group, const ParquetColumn& column,
                       const std::function<void(std::optional<std::string_view>)>& emit, ParquetReadStats* stats) {
  const ColumnChunk& chunk = file.row_groups[row_group].columns[static_cast<size_t>(column.leaf_index)];
  ChunkReader reader(chunk, column, emit);
  read_pages(file, row_group, column, reader, stats);
}

void read_id_list_chunk(const FileMetadata& file, size_t row_group, const ParquetColumn& column,
                        const std::function<void(std::optional<std::span<const int64_t>>)>& emit, ParquetReadStats* stats) {
  const ColumnChunk& chunk = file.row_groups[row_group].columns[static_cast<size_t>(column.leaf_index)];
  IdChunkReader reader(chunk, column, emit);
  read_pages(file, row_group, column, reader, stats);
}

}  // namespace shardtrain::data::parquet_detail
