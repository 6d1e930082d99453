// Arrow IPC files and streams (arrow_ipc.hpp), read from the format's specification (the columnar format and
// the Schema.fbs / Message.fbs / File.fbs definitions): encapsulated messages, the schema's fields, record
// batches and dictionary batches, body compression, and the string layouts.
#include "shardtrain/data/arrow_ipc.hpp"

#include <fmt/format.h>
#include <lz4frame.h>
#include <zstd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "flatbuffer.hpp"
#include "mapped_file.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data {
namespace arrow_detail {
namespace {

using flat::FlatError;

// Schema.fbs's Type union, in its order.
enum TypeId : uint8_t {
  kNone = 0, kNull, kInt, kFloatingPoint, kBinary, kUtf8, kBool, kDecimal, kDate, kTime, kTimestamp, kInterval, kList,
  kStruct, kUnion, kFixedSizeBinary, kFixedSizeList, kMap, kDuration, kLargeBinary, kLargeUtf8, kLargeList,
  kRunEndEncoded, kBinaryView, kUtf8View, kListView, kLargeListView, kTypeCount
};
constexpr const char* kTypeNames[kTypeCount] = {
    "NONE", "Null", "Int", "FloatingPoint", "Binary", "Utf8", "Bool", "Decimal", "Date", "Time", "Timestamp",
    "Interval", "List", "Struct", "Union", "FixedSizeBinary", "FixedSizeList", "Map", "Duration", "LargeBinary",
    "LargeUtf8", "LargeList", "RunEndEncoded", "BinaryView", "Utf8View", "ListView", "LargeListView"};

// Message.fbs's MessageHeader union.
enum HeaderType : uint8_t { kSchema = 1, kDictionaryBatch = 2, kRecordBatch = 3 };
constexpr int64_t kMaxDepth = 64;

bool is_offset_string(uint8_t t) { return t == kBinary || t == kUtf8 || t == kLargeBinary || t == kLargeUtf8; }
bool is_view_string(uint8_t t) { return t == kBinaryView || t == kUtf8View; }
bool is_string_type(uint8_t t) { return is_offset_string(t) || is_view_string(t); }

}  // namespace

struct Field {
  std::string name, path;
  uint8_t type = kNone;
  int16_t union_mode = 0;  // Sparse 0, Dense 1
  bool dictionary = false;
  int64_t dictionary_id = 0;
  int index_bits = 32;
  bool index_signed = true;
  int int_bits = 0;       // Int: its width
  bool int_signed = true;
  int32_t list_size = 0;  // FixedSizeList: values per list
  bool in_list = false;  // under a list, map, union or run-end encoding: not one value per row
  std::vector<Field> children;
};

// One encapsulated message: its FlatBuffers metadata and its body, as positions in the mapped file.
struct Message {
  size_t offset = 0;  // where its prefix starts (for errors)
  size_t meta = 0, meta_size = 0, body = 0;
  uint64_t body_size = 0;
  uint8_t header = 0;
};

struct Dictionary {
  std::string bytes;
  std::vector<uint64_t> ends;  // value i is bytes[ends[i-1], ends[i])
  std::vector<bool> valid;
};

struct IpcFile {
  std::string path;
  MappedFile file;
  bool file_format = false;
  std::vector<Field> fields;
  std::vector<ArrowColumn> columns;
  std::vector<const Field*> column_fields;  // beside columns
  std::vector<Message> dictionaries, batches;  // in the order they apply
  std::vector<Message> stream;                 // stream format: every batch message, in order
  int64_t num_rows = 0;

  template <typename... Args>
  [[noreturn]] void fail(const Message* m, fmt::format_string<Args...> f, Args&&... args) const {
    const std::string what = fmt::format(f, std::forward<Args>(args)...);
    if (m == nullptr) throw DataError(fmt::format("{}: {}", path, what));
    throw DataError(fmt::format("{}: the message at byte {}: {}", path, m->offset, what));
  }
};

namespace {

bool is_list_type(uint8_t t) { return t == kList || t == kLargeList || t == kFixedSizeList; }

// A list of integers, not inside another list: a column of token ids.
bool is_id_list(const Field& f) {
  return is_list_type(f.type) && !f.dictionary && !f.in_list && f.children.size() == 1 && f.children[0].type == kInt &&
         !f.children[0].dictionary;
}

std::string type_name(const Field& f) {
  std::string value = f.type < kTypeCount ? kTypeNames[f.type] : fmt::format("type {}", f.type);
  if (f.type == kInt) value = fmt::format("{}Int{}", f.int_signed ? "" : "U", f.int_bits);
  if (is_list_type(f.type) && f.children.size() == 1) value = fmt::format("{}<{}>", value, type_name(f.children[0]));
  if (!f.dictionary) return value;
  return fmt::format("Dictionary<{}Int{}, {}>", f.index_signed ? "" : "U", f.index_bits, value);
}

// Value k of a buffer of integers of that width (in bits) and signedness; an unsigned 64-bit value past
// int64's range reads as -1 (an impossible id or index either way).
int64_t load_int(std::string_view buf, size_t k, int bits, bool is_signed) {
  const char* p = buf.data() + k * static_cast<size_t>(bits / 8);
  const auto get = [p]<typename T>(T) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  };
  switch (bits) {
    case 8: return is_signed ? get(int8_t{}) : get(uint8_t{});
    case 16: return is_signed ? get(int16_t{}) : get(uint16_t{});
    case 32: return is_signed ? get(int32_t{}) : get(uint32_t{});
    default: {
      if (is_signed) return get(int64_t{});
      const uint64_t v = get(uint64_t{});
      return v > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v);
    }
  }
}

Field read_field(const flat::Table& t, const std::string& prefix, bool in_list, int depth) {
  if (depth > kMaxDepth) throw FlatError("the schema nests deeper than 64 levels");
  Field f;
  f.name = std::string(t.string(0));
  f.path = prefix.empty() ? f.name : prefix + "." + f.name;
  f.type = t.scalar<uint8_t>(2, kNone);
  if (f.type == kNone || f.type >= kTypeCount)
    throw FlatError(fmt::format("field \"{}\" has type {}, which this reader does not know", f.path, f.type));
  if (f.type == kUnion) f.union_mode = t.table(3).scalar<int16_t>(0, 0);
  if (f.type == kInt) {
    f.int_bits = t.table(3).scalar<int32_t>(0, 0);
    f.int_signed = t.table(3).scalar<uint8_t>(1, 0) != 0;
    if (f.int_bits != 8 && f.int_bits != 16 && f.int_bits != 32 && f.int_bits != 64)
      throw FlatError(fmt::format("field \"{}\" is a {}-bit integer", f.path, f.int_bits));
  }
  if (f.type == kFixedSizeList) {
    f.list_size = t.table(3).scalar<int32_t>(0, 0);
    if (f.list_size < 0) throw FlatError(fmt::format("field \"{}\" is a list of {} values", f.path, f.list_size));
  }
  const flat::Table dict = t.table(4);
  if (dict.valid()) {
    f.dictionary = true;
    f.dictionary_id = dict.scalar<int64_t>(0, 0);
    const flat::Table index = dict.table(1);
    f.index_bits = index.valid() ? index.scalar<int32_t>(0, 32) : 32;
    f.index_signed = index.valid() ? index.scalar<uint8_t>(1, 0) != 0 : true;
    if (f.index_bits != 8 && f.index_bits != 16 && f.index_bits != 32 && f.index_bits != 64)
      throw FlatError(fmt::format("field \"{}\" has {}-bit dictionary indices", f.path, f.index_bits));
  }
  f.in_list = in_list;
  const bool listy = f.type == kList || f.type == kLargeList || f.type == kFixedSizeList || f.type == kMap ||
                     f.type == kUnion || f.type == kRunEndEncoded || f.type == kListView || f.type == kLargeListView;
  const flat::Vector children = t.vector(5);
  children.check(4);
  for (size_t i = 0; i < children.size(); ++i)
    f.children.push_back(read_field(children.table(i), f.path, in_list || listy || f.dictionary, depth + 1));
  return f;
}

// Buffers a field of this type has in a record batch, not counting its children's and the variadic buffers of
// the view types.
size_t own_buffers(const Field& f) {
  if (f.dictionary) return 2;  // validity and indices
  switch (f.type) {
    case kNull:
    case kRunEndEncoded: return 0;
    case kStruct:
    case kFixedSizeList: return 1;
    case kUnion: return f.union_mode == 1 ? 2 : 1;
    case kBinary:
    case kUtf8:
    case kLargeBinary:
    case kLargeUtf8:
    case kListView:
    case kLargeListView: return 3;
    default: return 2;  // validity and data (or offsets: List, LargeList, Map; views: BinaryView, Utf8View)
  }
}

void flatten(const Field& f, std::vector<ArrowColumn>& columns, std::vector<const Field*>& fields) {
  columns.push_back({f.path, type_name(f), is_string_type(f.type) && !f.in_list, is_id_list(f)});
  fields.push_back(&f);
  if (f.dictionary) return;  // its children describe the dictionary's values
  for (const auto& c : f.children) flatten(c, columns, fields);
}

// Where one field's arrays lie in a record batch: field node and buffer indices, found by walking the fields
// depth first as the batch lays them out (view types add the batch's variadic buffer counts).
struct Place {
  size_t node = 0, buffer = 0, variadic = 0;
};
struct Layout {
  std::vector<Place> path;  // the enclosing structs, then the column itself
  size_t variadic_count = 0;
};

bool locate(const Field& f, const Field* target, Place& at, const flat::Vector& variadic, std::vector<Place>& path,
            size_t& variadic_count) {
  const Place here = at;
  ++at.node;
  at.buffer += own_buffers(f);
  size_t count = 0;
  if (!f.dictionary && is_view_string(f.type)) {
    if (at.variadic >= variadic.size()) throw FlatError("the batch gives fewer variadic buffer counts than it has views");
    const int64_t n = variadic.scalar<int64_t>(at.variadic++);
    if (n < 0 || n > (int64_t{1} << 32)) throw FlatError(fmt::format("a view column claims {} data buffers", n));
    count = static_cast<size_t>(n);
    at.buffer += count;
  }
  if (&f == target) {
    path.push_back(here);
    variadic_count = count;
    return true;
  }
  if (f.dictionary) return false;
  for (const auto& c : f.children) {
    if (locate(c, target, at, variadic, path, variadic_count)) {
      path.insert(path.begin(), here);
      return true;
    }
  }
  return false;
}

// The metadata of the message at `pos`; nullopt at the end-of-stream marker or the end of the file.
std::optional<Message> message_at(const IpcFile& file, size_t pos, size_t end) {
  const uint8_t* d = file.file.data;
  Message m;
  m.offset = pos;
  if (pos == end) return std::nullopt;  // a stream may end without its marker
  if (end - pos < 4) file.fail(&m, "cut short: {} bytes where a message starts", end - pos);
  int32_t first = 0;
  std::memcpy(&first, d + pos, 4);
  size_t meta_size = 0, prefix = 4;
  if (first == -1) {  // the continuation marker, then the length
    if (end - pos < 8) file.fail(&m, "cut short after the continuation marker");
    int32_t len = 0;
    std::memcpy(&len, d + pos + 4, 4);
    if (len < 0) file.fail(&m, "its metadata length is {}", len);
    meta_size = static_cast<size_t>(len);
    prefix = 8;
  } else if (first >= 0) {  // the format before Arrow 0.15: the length alone
    meta_size = static_cast<size_t>(first);
  } else if (pos == 0) {
    file.fail(nullptr, "not an Arrow IPC file or stream ({} bytes; it starts neither with \"ARROW1\" nor with a message)",
              end);
  } else {
    file.fail(&m, "not an Arrow message (it starts with {:#010x})", static_cast<uint32_t>(first));
  }
  if (meta_size == 0) return std::nullopt;  // end of stream
  if (meta_size > end - pos - prefix) {
    if (pos == 0 && prefix == 4)
      file.fail(nullptr, "not an Arrow IPC file or stream ({} bytes; it starts neither with \"ARROW1\" nor with a message)",
                end);
    file.fail(&m, "its {}-byte metadata runs past the end of the file (cut short?)", meta_size);
  }
  m.meta = pos + prefix;
  m.meta_size = meta_size;
  m.body = m.meta + meta_size;
  try {
    flat::Buffer buf(d + m.meta, m.meta_size);
    const flat::Table msg = flat::Table::root(&buf);
    const int16_t version = msg.scalar<int16_t>(0, 0);
    if (version < 0 || version > 4) file.fail(&m, "metadata version {} (this reader knows V1 to V5)", version + 1);
    m.header = msg.scalar<uint8_t>(1, 0);
    const int64_t body = msg.scalar<int64_t>(3, 0);
    if (body < 0 || static_cast<uint64_t>(body) > end - m.body)
      file.fail(&m, "its {}-byte body runs past the end of the file (cut short?)", body);
    m.body_size = static_cast<uint64_t>(body);
  } catch (const FlatError& e) {
    file.fail(&m, "its metadata cannot be read: {}", e.what());
  }
  return m;
}

void read_schema(IpcFile& file, const flat::Table& schema) {
  if (!schema.valid()) throw FlatError("there is no schema");
  if (schema.scalar<int16_t>(0, 0) != 0) throw FlatError("it is big-endian, which this reader does not read");
  const flat::Vector fields = schema.vector(1);
  fields.check(4);
  for (size_t i = 0; i < fields.size(); ++i) file.fields.push_back(read_field(fields.table(i), "", false, 0));
  for (const auto& f : file.fields) flatten(f, file.columns, file.column_fields);
}

// The RecordBatch table of a record batch or dictionary batch message, with the buffers' bodies.
struct Batch {
  const Message* message = nullptr;
  flat::Buffer meta{nullptr, 0};
  flat::Table record;
  int64_t length = 0;
  int8_t codec = -1;  // -1: uncompressed; 0: LZ4_FRAME; 1: ZSTD
  std::vector<std::vector<uint8_t>> scratch;

  Batch(const Batch&) = delete;  // record points into meta
  Batch& operator=(const Batch&) = delete;
  Batch(const IpcFile& file, const Message& m, flat::Table* dictionary_batch = nullptr) : message(&m) {
    meta = flat::Buffer(file.file.data + m.meta, m.meta_size);
    const flat::Table msg = flat::Table::root(&meta);
    record = msg.table(2);
    if (dictionary_batch != nullptr) {
      *dictionary_batch = record;
      record = record.table(1);
    }
    if (!record.valid()) throw FlatError("the batch has no RecordBatch");
    length = record.scalar<int64_t>(0, 0);
    if (length < 0) throw FlatError(fmt::format("the batch says {} rows", length));
    const flat::Table compression = record.table(3);
    if (compression.valid()) {
      codec = compression.scalar<int8_t>(0, 0);
      if (codec != 0 && codec != 1) throw FlatError(fmt::format("body compression codec {} (known: LZ4_FRAME, ZSTD)", codec));
      if (compression.scalar<int8_t>(1, 0) != 0) throw FlatError("body compression other than per buffer");
    }
  }

  struct Node {
    int64_t length, null_count;
  };
  Node node(size_t i) const {
    const flat::Vector nodes = record.vector(1);
    if (i >= nodes.size()) throw FlatError(fmt::format("field node {} of {}", i, nodes.size()));
    const size_t at = nodes.struct_at(i, 16);
    Node n{meta.load<int64_t>(at), meta.load<int64_t>(at + 8)};
    if (n.length < 0 || n.null_count < 0 || n.null_count > n.length)
      throw FlatError(fmt::format("field node {} says {} values, {} null", i, n.length, n.null_count));
    return n;
  }

  // Buffer i of the body, decompressed when the batch is.
  std::string_view buffer(const IpcFile& file, size_t i, ArrowReadStats* stats) {
    const flat::Vector buffers = record.vector(2);
    if (i >= buffers.size()) throw FlatError(fmt::format("buffer {} of {}", i, buffers.size()));
    const size_t at = buffers.struct_at(i, 16);
    const int64_t offset = meta.load<int64_t>(at), size = meta.load<int64_t>(at + 8);
    if (offset < 0 || size < 0 || static_cast<uint64_t>(offset) > message->body_size ||
        static_cast<uint64_t>(size) > message->body_size - static_cast<uint64_t>(offset))
      throw FlatError(fmt::format("buffer {} ({} bytes at {}) lies outside the {}-byte body", i, size, offset,
                                  message->body_size));
    const auto* p = reinterpret_cast<const char*>(file.file.data + message->body + offset);
    std::string_view raw(p, static_cast<size_t>(size));
    if (codec < 0 || raw.empty()) return raw;
    if (raw.size() < 8) throw FlatError(fmt::format("compressed buffer {} has {} bytes, fewer than its length", i, raw.size()));
    int64_t n = 0;
    std::memcpy(&n, raw.data(), 8);
    raw.remove_prefix(8);
    if (n == -1) {  // left uncompressed by the writer
      if (stats) ++stats->counts["uncompressed buffers"];
      return raw;
    }
    if (n < 0) throw FlatError(fmt::format("compressed buffer {} says it holds {} bytes", i, n));
    scratch.push_back(decompress(raw, static_cast<uint64_t>(n), i));
    if (stats) ++stats->counts[codec == 0 ? "LZ4_FRAME buffers" : "ZSTD buffers"];
    return {reinterpret_cast<const char*>(scratch.back().data()), scratch.back().size()};
  }

  // Streaming decompression into a buffer that grows with what is produced, so that a corrupt length cannot
  // make it allocate more than the data really holds.
  std::vector<uint8_t> decompress(std::string_view src, uint64_t n, size_t index) const {
    std::vector<uint8_t> out(static_cast<size_t>(std::min<uint64_t>(n, 64 * src.size() + 4096)));
    size_t produced = 0, consumed = 0;
    const auto grow = [&] { out.resize(static_cast<size_t>(std::min<uint64_t>(n, 2 * out.size() + 4096))); };
    const auto stuck = [&] {
      throw FlatError(produced == n ? fmt::format("buffer {} decompresses to more than the {} bytes it says", index, n)
                                    : fmt::format("the compressed data of buffer {} is cut short", index));
    };
    if (codec == 0) {
      LZ4F_dctx* ctx = nullptr;
      if (LZ4F_isError(LZ4F_createDecompressionContext(&ctx, LZ4F_VERSION))) throw FlatError("no LZ4 context");
      std::unique_ptr<LZ4F_dctx, decltype(&LZ4F_freeDecompressionContext)> guard(ctx, LZ4F_freeDecompressionContext);
      for (;;) {
        if (produced == out.size() && out.size() < n) grow();
        size_t dst = out.size() - produced, srcn = src.size() - consumed;
        const size_t hint = LZ4F_decompress(ctx, out.data() + produced, &dst, src.data() + consumed, &srcn, nullptr);
        if (LZ4F_isError(hint))
          throw FlatError(fmt::format("the LZ4 frame of buffer {}: {}", index, LZ4F_getErrorName(hint)));
        produced += dst;
        consumed += srcn;
        if (hint == 0) break;  // the frame is complete
        if (dst == 0 && srcn == 0) stuck();
      }
    } else {
      std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
      if (!ctx) throw FlatError("no zstd context");
      for (;;) {
        if (produced == out.size() && out.size() < n) grow();
        ZSTD_inBuffer in{src.data(), src.size(), consumed};
        ZSTD_outBuffer o{out.data(), out.size(), produced};
        const size_t rc = ZSTD_decompressStream(ctx.get(), &o, &in);
        if (ZSTD_isError(rc)) throw FlatError(fmt::format("the zstd frame of buffer {}: {}", index, ZSTD_getErrorName(rc)));
        const bool moved = o.pos != produced || in.pos != consumed;
        produced = o.pos;
        consumed = in.pos;
        if (rc == 0) break;  // the frame is complete
        if (!moved) stuck();
      }
    }
    if (produced != n || consumed != src.size())
      throw FlatError(fmt::format("buffer {} decompresses to {} bytes, not the {} it says", index, produced, n));
    out.resize(produced);
    return out;
  }
};

// Bit i of a validity bitmap (nullptr: every value is valid).
bool valid_at(const uint8_t* bits, int64_t i) { return bits == nullptr || ((bits[i >> 3] >> (i & 7)) & 1) != 0; }

const uint8_t* validity(Batch& batch, const IpcFile& file, const Place& at, int64_t rows, ArrowReadStats* stats) {
  const auto node = batch.node(at.node);
  if (node.length != rows)
    throw FlatError(fmt::format("field node {} has {} values for the batch's {} rows", at.node, node.length, rows));
  if (node.null_count == 0) return nullptr;
  const std::string_view bits = batch.buffer(file, at.buffer, stats);
  if (bits.size() < static_cast<size_t>((rows + 7) / 8))
    throw FlatError(fmt::format("field node {} has nulls but a {}-byte validity bitmap for {} rows", at.node,
                                bits.size(), rows));
  return reinterpret_cast<const uint8_t*>(bits.data());
}

template <typename T>
T load_at(std::string_view s, size_t i) {
  T v;
  std::memcpy(&v, s.data() + i * sizeof(T), sizeof(T));
  return v;
}

// The values of a string array of `rows` values at `at` (its own validity not applied): offsets or views.
class StringArray {
 public:
  StringArray(Batch& batch, const IpcFile& file, const Field& f, const Place& at, size_t variadic, int64_t rows,
              ArrowReadStats* stats)
  {
    const size_t n = static_cast<size_t>(rows);
    if (is_view_string(f.type)) {
      views_ = batch.buffer(file, at.buffer + 1, stats);
      if (views_.size() / 16 < n) throw FlatError(fmt::format("{} views in a {}-byte buffer", rows, views_.size()));
      for (size_t k = 0; k < variadic; ++k) data_.push_back(batch.buffer(file, at.buffer + 2 + k, stats));
      return;
    }
    offsets_ = batch.buffer(file, at.buffer + 1, stats);
    const size_t width = (f.type == kLargeUtf8 || f.type == kLargeBinary) ? 8 : 4;
    if (rows > 0 && offsets_.size() / width < n + 1)
      throw FlatError(fmt::format("{} offsets in a {}-byte buffer", rows + 1, offsets_.size()));
    data_.push_back(batch.buffer(file, at.buffer + 2, stats));
    wide_ = width == 8;
  }

  std::string_view at(int64_t row) const {
    const auto i = static_cast<size_t>(row);
    if (!views_.empty()) {
      const int32_t size = load_at<int32_t>(views_.substr(i * 16, 4), 0);
      if (size < 0) throw FlatError(fmt::format("view {} has length {}", row, size));
      if (size <= 12) return views_.substr(i * 16 + 4, static_cast<size_t>(size));
      const int32_t index = load_at<int32_t>(views_.substr(i * 16 + 8, 4), 0);
      const int32_t offset = load_at<int32_t>(views_.substr(i * 16 + 12, 4), 0);
      if (index < 0 || static_cast<size_t>(index) >= data_.size() || offset < 0 ||
          static_cast<size_t>(offset) + static_cast<size_t>(size) > data_[static_cast<size_t>(index)].size())
        throw FlatError(fmt::format("view {} ({} bytes at {} of data buffer {}) lies outside its {} data buffers", row,
                                    size, offset, index, data_.size()));
      return data_[static_cast<size_t>(index)].substr(static_cast<size_t>(offset), static_cast<size_t>(size));
    }
    const int64_t begin = wide_ ? load_at<int64_t>(offsets_, i) : load_at<int32_t>(offsets_, i);
    const int64_t end = wide_ ? load_at<int64_t>(offsets_, i + 1) : load_at<int32_t>(offsets_, i + 1);
    if (begin < 0 || end < begin || static_cast<uint64_t>(end) > data_[0].size())
      throw FlatError(fmt::format("value {} has offsets {} to {} in {} bytes of data", row, begin, end, data_[0].size()));
    return data_[0].substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  }

 private:
  bool wide_ = false;
  std::string_view offsets_, views_;
  std::vector<std::string_view> data_;
};

}  // namespace
}  // namespace arrow_detail

using arrow_detail::Batch;
using arrow_detail::Field;
using arrow_detail::IpcFile;
using arrow_detail::Message;
using flat::FlatError;

ArrowIpcFile::ArrowIpcFile() : file_(std::make_unique<IpcFile>()) {}
ArrowIpcFile::ArrowIpcFile(ArrowIpcFile&&) noexcept = default;
ArrowIpcFile& ArrowIpcFile::operator=(ArrowIpcFile&&) noexcept = default;
ArrowIpcFile::~ArrowIpcFile() = default;

ArrowIpcFile ArrowIpcFile::open(const std::string& path) {
  using namespace arrow_detail;
  ArrowIpcFile result;
  IpcFile& f = *result.file_;
  f.path = path;
  f.file.map(path);
  const uint8_t* d = f.file.data;
  const size_t size = f.file.size;
  constexpr std::string_view kMagic = "ARROW1";
  const bool starts_magic = size >= 6 && std::memcmp(d, kMagic.data(), 6) == 0;
  const Message* current = nullptr;
  try {
    if (starts_magic) {  // the file format: magic, padding, the stream, the footer, its length, magic
      f.file_format = true;
      if (size < 18 || std::memcmp(d + size - 6, kMagic.data(), 6) != 0)
        f.fail(nullptr, "an Arrow IPC file without its closing \"ARROW1\" ({} bytes): cut short", size);
      int32_t footer_len = 0;
      std::memcpy(&footer_len, d + size - 10, 4);
      if (footer_len <= 0 || static_cast<size_t>(footer_len) > size - 18)
        f.fail(nullptr, "its footer claims {} bytes of a {}-byte file (cut short or corrupt)", footer_len, size);
      const size_t footer_at = size - 10 - static_cast<size_t>(footer_len);
      flat::Buffer buf(d + footer_at, static_cast<size_t>(footer_len));
      const flat::Table footer = flat::Table::root(&buf);
      read_schema(f, footer.table(1));
      const auto blocks = [&](int field, std::vector<Message>& out, uint8_t header) {
        const flat::Vector v = footer.vector(field);
        for (size_t i = 0; i < v.size(); ++i) {
          const size_t at = v.struct_at(i, 24);
          const int64_t offset = buf.load<int64_t>(at);
          if (offset < 8 || static_cast<uint64_t>(offset) >= footer_at)
            f.fail(nullptr, "the footer places a message at byte {}, outside the file's messages", offset);
          const auto m = message_at(f, static_cast<size_t>(offset), footer_at);
          if (!m || m->header != header)
            f.fail(nullptr, "the footer's block at byte {} is not a {} message", offset,
                   header == kRecordBatch ? "record batch" : "dictionary batch");
          out.push_back(*m);
        }
      };
      blocks(2, f.dictionaries, kDictionaryBatch);
      blocks(3, f.batches, kRecordBatch);
    } else {  // a stream: the schema message, then dictionary and record batches
      size_t pos = 0;
      bool schema = false;
      while (auto m = message_at(f, pos, size)) {
        f.stream.push_back(*m);
        current = &f.stream.back();
        if (!schema) {
          if (m->header != kSchema)
            f.fail(current, "the first message of an Arrow stream must be its schema (header type {})", m->header);
          flat::Buffer buf(d + m->meta, m->meta_size);
          read_schema(f, flat::Table::root(&buf).table(2));
          schema = true;
          f.stream.pop_back();
        } else if (m->header != kRecordBatch && m->header != kDictionaryBatch) {
          f.fail(current, "header type {} inside a stream (expected record or dictionary batches)", m->header);
        }
        pos = static_cast<size_t>(m->body + m->body_size);
      }
      if (!schema)
        f.fail(nullptr, "not an Arrow IPC stream or file ({} bytes; no schema message{})", size,
               size == 0 ? "" : ", and it does not start with \"ARROW1\"");
      for (const auto& m : f.stream) (m.header == kRecordBatch ? f.batches : f.dictionaries).push_back(m);
    }
    current = nullptr;
    for (const auto& m : f.batches) {
      current = &m;
      f.num_rows += Batch(f, m).length;
    }
  } catch (const FlatError& e) {
    f.fail(current, "its metadata cannot be read: {}", e.what());
  }
  return result;
}

const std::string& ArrowIpcFile::path() const { return file_->path; }
bool ArrowIpcFile::file_format() const { return file_->file_format; }
int64_t ArrowIpcFile::num_rows() const { return file_->num_rows; }
size_t ArrowIpcFile::num_record_batches() const { return file_->batches.size(); }
const std::vector<ArrowColumn>& ArrowIpcFile::columns() const { return file_->columns; }

namespace {

// The column of that path, if `wanted` says it is what the caller reads; DataErrors naming the file otherwise.
const ArrowColumn& column_named(const IpcFile& f, const std::string& path, bool ArrowColumn::*wanted, const char* what,
                                const char* option) {
  for (size_t i = 0; i < f.columns.size(); ++i) {
    const auto& c = f.columns[i];
    if (c.path != path) continue;
    if (f.column_fields[i]->in_list)
      throw DataError(fmt::format("{}: column \"{}\" lies inside a list, map or union, not one value per row", f.path, path));
    if (!(c.*wanted)) throw DataError(fmt::format("{}: column \"{}\" holds {}, not {}", f.path, path, c.type, what));
    return c;
  }
  std::string names;
  for (size_t i = 0; i < f.columns.size() && i < 12; ++i) names += (i ? ", " : "") + f.columns[i].path;
  if (f.columns.size() > 12) names += fmt::format(", ... ({} in all)", f.columns.size());
  std::string hint;  // a tokenized dataset read for its text: say how it is imported
  for (const auto& c : f.columns)
    if (wanted == &ArrowColumn::is_string && c.is_id_list && hint.empty())
      hint = fmt::format("; it holds token ids: --token-field {} imports them", c.path);
  throw DataError(fmt::format("{}: no column \"{}\" (its columns: {}; {} picks another{})", f.path, path,
                              names.empty() ? "none" : names, option, hint));
}

}  // namespace

const ArrowColumn& ArrowIpcFile::string_column(const std::string& path) const {
  return column_named(*file_, path, &ArrowColumn::is_string,
                      "strings (Utf8, LargeUtf8, Utf8View or their Binary forms)", "--text-field");
}

const ArrowColumn& ArrowIpcFile::id_list_column(const std::string& path) const {
  return column_named(*file_, path, &ArrowColumn::is_id_list, "lists of integers (token ids)", "--token-field");
}

namespace {

const Field& field_of(const IpcFile& f, const ArrowColumn& column) {
  for (size_t i = 0; i < f.columns.size(); ++i)
    if (&f.columns[i] == &column) return *f.column_fields[i];
  throw InternalError("ArrowIpcFile: a column of another file");
}

// Every dictionary and record batch message, in the order they apply (file format: the dictionaries first), with
// a message's FlatError turned into a DataError naming it.
void for_each_batch_message(const IpcFile& f, const std::function<void(const Message&)>& on_dictionary,
                            const std::function<void(const Message&)>& on_batch) {
  const Message* current = nullptr;
  try {
    if (f.file_format) {
      for (const auto& m : f.dictionaries) on_dictionary(*(current = &m));
      for (const auto& m : f.batches) on_batch(*(current = &m));
    } else {
      for (const auto& m : f.stream) {
        current = &m;
        if (m.header == arrow_detail::kDictionaryBatch) on_dictionary(m);
        else on_batch(m);
      }
    }
  } catch (const FlatError& e) {
    f.fail(current, "{}", e.what());
  }
}

// The validity bitmaps of a column and the structs around it: a row is null when any of them says so.
class PathValidity {
 public:
  PathValidity(Batch& batch, const IpcFile& f, const arrow_detail::Layout& layout, ArrowReadStats* stats) {
    for (const auto& at : layout.path) bits_.push_back(arrow_detail::validity(batch, f, at, batch.length, stats));
  }
  bool null_at(int64_t i) const {
    for (const uint8_t* bits : bits_)
      if (!arrow_detail::valid_at(bits, i)) return true;
    return false;
  }

 private:
  std::vector<const uint8_t*> bits_;
};

arrow_detail::Layout layout_of(const IpcFile& f, const Batch& batch, const Field& target) {
  arrow_detail::Layout layout;
  arrow_detail::Place at;
  const flat::Vector variadic = batch.record.vector(4);
  for (const auto& field : f.fields)
    if (arrow_detail::locate(field, &target, at, variadic, layout.path, layout.variadic_count)) return layout;
  throw InternalError("ArrowIpcFile: a column outside its schema");
}

}  // namespace

uint64_t ArrowIpcFile::string_bytes_estimate(const ArrowColumn& column) const {
  const auto& f = *file_;
  const Field& field = field_of(f, column);
  if (field.dictionary) return f.file.size;
  uint64_t total = 0;
  try {
    for (const auto& m : f.batches) {
      Batch batch(f, m);
      const auto layout = layout_of(f, batch, field);
      const auto& at = layout.path.back();
      const size_t first = arrow_detail::is_view_string(field.type) ? at.buffer + 1 : at.buffer + 2;
      const size_t last = arrow_detail::is_view_string(field.type) ? at.buffer + 1 + layout.variadic_count : first;
      const flat::Vector buffers = batch.record.vector(2);
      for (size_t b = first; b <= last && b < buffers.size(); ++b) {
        const size_t pos = buffers.struct_at(b, 16);
        const int64_t offset = batch.meta.load<int64_t>(pos), size = batch.meta.load<int64_t>(pos + 8);
        if (size <= 0 || offset < 0 || static_cast<uint64_t>(offset) + static_cast<uint64_t>(size) > m.body_size) continue;
        int64_t n = size;
        if (batch.codec >= 0 && size >= 8) {
          std::memcpy(&n, f.file.data + m.body + offset, 8);
          if (n < 0) n = size - 8;
        }
        total += static_cast<uint64_t>(n);
      }
    }
  } catch (const FlatError&) {
    return f.file.size;  // the read reports what is wrong
  }
  return total;
}

void ArrowIpcFile::for_each_string(const ArrowColumn& column,
                                   const std::function<void(std::optional<std::string_view>)>& emit,
                                   ArrowReadStats* stats) const {
  using namespace arrow_detail;
  const auto& f = *file_;
  const Field& target = field_of(f, column);
  std::unordered_map<int64_t, Dictionary> dictionaries;
  const auto read_dictionary = [&](const Message& m) {
    flat::Table header;
    Batch batch(f, m, &header);
    const int64_t id = header.scalar<int64_t>(0, 0);
    const bool delta = header.scalar<uint8_t>(2, 0) != 0;
    if (stats) ++stats->counts[delta ? "delta dictionary batches" : "dictionary batches"];
    if (!target.dictionary || id != target.dictionary_id) return;
    Dictionary& dict = dictionaries[id];
    if (!delta) dict = Dictionary();
    Field values = target;  // the dictionary batch holds one column of the value type
    values.dictionary = false;
    const Place at{};
    const uint8_t* bits = validity(batch, f, at, batch.length, stats);
    size_t variadic = 0;
    if (is_view_string(values.type)) {
      const flat::Vector counts = batch.record.vector(4);
      const int64_t n = counts.size() == 1 ? counts.scalar<int64_t>(0) : -1;
      if (n < 0 || n > (int64_t{1} << 32)) throw FlatError("a dictionary of views without its variadic buffer count");
      variadic = static_cast<size_t>(n);
    }
    const StringArray strings(batch, f, values, at, variadic, batch.length, stats);
    for (int64_t i = 0; i < batch.length; ++i) {
      const bool ok = valid_at(bits, i);
      if (ok) dict.bytes.append(strings.at(i));
      dict.ends.push_back(dict.bytes.size());
      dict.valid.push_back(ok);
    }
  };
  const auto read_batch = [&](const Message& m) {
    Batch batch(f, m);
    if (stats) ++stats->counts["record batches"];
    const auto layout = layout_of(f, batch, target);
    const PathValidity valid(batch, f, layout, stats);
    const Place& at = layout.path.back();
    if (batch.length == 0) return;
    if (!target.dictionary) {
      const StringArray strings(batch, f, target, at, layout.variadic_count, batch.length, stats);
      for (int64_t i = 0; i < batch.length; ++i) emit(valid.null_at(i) ? std::nullopt : std::optional(strings.at(i)));
      return;
    }
    const auto it = dictionaries.find(target.dictionary_id);
    if (it == dictionaries.end())
      throw FlatError(fmt::format("the batch uses dictionary {} before any dictionary batch gave it", target.dictionary_id));
    const Dictionary& dict = it->second;
    const std::string_view indices = batch.buffer(f, at.buffer + 1, stats);
    if (indices.size() / static_cast<size_t>(target.index_bits / 8) < static_cast<size_t>(batch.length))
      throw FlatError(fmt::format("{} dictionary indices in a {}-byte buffer", batch.length, indices.size()));
    for (int64_t i = 0; i < batch.length; ++i) {
      if (valid.null_at(i)) {
        emit(std::nullopt);
        continue;
      }
      const int64_t index = load_int(indices, static_cast<size_t>(i), target.index_bits, target.index_signed);
      if (index < 0 || static_cast<uint64_t>(index) >= dict.ends.size())
        throw FlatError(fmt::format("row {} of the batch has dictionary index {} of {}", i, index, dict.ends.size()));
      const auto j = static_cast<size_t>(index);
      if (!dict.valid[j]) {
        emit(std::nullopt);
        continue;
      }
      const uint64_t begin = j == 0 ? 0 : dict.ends[j - 1];
      emit(std::string_view(dict.bytes).substr(begin, dict.ends[j] - begin));
    }
  };
  for_each_batch_message(f, read_dictionary, read_batch);
}

namespace {

// Where a list column's values lie in a batch: the list's offsets (or its fixed size) and its child's array.
struct ListValues {
  std::string_view offsets, values;
  int64_t child_length = 0;
};

ListValues list_values(Batch& batch, const IpcFile& f, const Field& list, const arrow_detail::Place& at,
                       ArrowReadStats* stats) {
  using namespace arrow_detail;
  const Field& item = list.children.at(0);
  const Place child{at.node + 1, at.buffer + own_buffers(list), at.variadic};
  const auto node = batch.node(child.node);
  if (node.null_count > 0) throw FlatError(fmt::format("the lists of \"{}\" hold {} null values", list.path, node.null_count));
  ListValues v;
  v.child_length = node.length;
  const auto rows = static_cast<size_t>(batch.length);
  if (list.type != kFixedSizeList) {
    v.offsets = batch.buffer(f, at.buffer + 1, stats);
    const size_t width = list.type == kLargeList ? 8 : 4;
    if (v.offsets.size() / width < rows + 1)
      throw FlatError(fmt::format("{} list offsets in a {}-byte buffer", rows + 1, v.offsets.size()));
  } else if (list.list_size == 0 || rows > static_cast<uint64_t>(node.length) / static_cast<uint64_t>(list.list_size)) {
    throw FlatError(fmt::format("{} lists of {} in {} values", rows, list.list_size, node.length));  // bounds rows too
  }
  v.values = batch.buffer(f, child.buffer + 1, stats);
  if (v.values.size() / static_cast<size_t>(item.int_bits / 8) < static_cast<uint64_t>(node.length))
    throw FlatError(fmt::format("{} values in a {}-byte buffer", node.length, v.values.size()));
  return v;
}

}  // namespace

uint64_t ArrowIpcFile::id_count_estimate(const ArrowColumn& column) const {
  const auto& f = *file_;
  const Field& field = field_of(f, column);
  uint64_t total = 0;
  try {
    for (const auto& m : f.batches) {
      Batch batch(f, m);
      const auto layout = layout_of(f, batch, field);
      const int64_t n = batch.node(layout.path.back().node + 1).length;
      if (n > 0) total += static_cast<uint64_t>(n);
    }
  } catch (const FlatError&) {
    return f.file.size / 4;  // the read reports what is wrong
  }
  return total;
}

void ArrowIpcFile::for_each_id_list(const ArrowColumn& column,
                                    const std::function<void(std::optional<std::span<const int64_t>>)>& emit,
                                    ArrowReadStats* stats) const {
  using namespace arrow_detail;
  const auto& f = *file_;
  const Field& target = field_of(f, column);
  const Field& item = target.children.at(0);
  std::vector<int64_t> ids;
  const auto skip_dictionary = [&](const Message&) {
    if (stats) ++stats->counts["dictionary batches"];
  };
  const auto read_batch = [&](const Message& m) {
    Batch batch(f, m);
    if (stats) ++stats->counts["record batches"];
    const auto layout = layout_of(f, batch, target);
    const PathValidity valid(batch, f, layout, stats);
    if (batch.length == 0) return;
    const ListValues lists = list_values(batch, f, target, layout.path.back(), stats);
    for (int64_t i = 0; i < batch.length; ++i) {
      if (valid.null_at(i)) {
        emit(std::nullopt);
        continue;
      }
      const auto k = static_cast<size_t>(i);
      int64_t begin = i * target.list_size, end = (i + 1) * target.list_size;
      if (target.type != kFixedSizeList) {
        const bool wide = target.type == kLargeList;
        begin = wide ? load_at<int64_t>(lists.offsets, k) : load_at<int32_t>(lists.offsets, k);
        end = wide ? load_at<int64_t>(lists.offsets, k + 1) : load_at<int32_t>(lists.offsets, k + 1);
      }
      if (begin < 0 || end < begin || end > lists.child_length)
        throw FlatError(fmt::format("list {} has offsets {} to {} in {} values", i, begin, end, lists.child_length));
      ids.resize(static_cast<size_t>(end - begin));
      for (size_t j = 0; j < ids.size(); ++j)
        ids[j] = load_int(lists.values, static_cast<size_t>(begin) + j, item.int_bits, item.int_signed);
      emit(std::span<const int64_t>(ids));
    }
  };
  for_each_batch_message(f, skip_dictionary, read_batch);
}

std::optional<std::vector<std::string>> hf_dataset_files(const std::string& folder) {
  namespace fs = std::filesystem;
  const fs::path dir(folder);
  const auto read_json = [&](const fs::path& p) {
    std::ifstream in(p);
    try {
      return nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: not JSON ({})", p.string(), e.what()));
    }
  };
  std::error_code ec;
  if (fs::exists(dir / "dataset_dict.json", ec)) {
    const auto j = read_json(dir / "dataset_dict.json");
    std::string splits;
    if (j.contains("splits") && j["splits"].is_array())
      for (const auto& s : j["splits"])
        if (s.is_string()) splits += (splits.empty() ? "" : ", ") + (dir / s.get<std::string>()).string();
    throw DataError(fmt::format("{}: a DatasetDict saved by datasets' save_to_disk; give one split's folder ({})", folder,
                                splits.empty() ? "none listed" : splits));
  }
  if (!fs::exists(dir / "state.json", ec)) {
    const auto has_arrow_files = [&] {
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".arrow") return true;
      return false;
    };
    if (fs::exists(dir / "dataset_info.json", ec) && has_arrow_files())
      throw DataError(fmt::format("{}: a folder of the datasets cache (dataset_info.json, no state.json), whose Arrow "
                                  "files may repeat each other's rows (cache-*.arrow); give its NAME-SPLIT-*.arrow files, "
                                  "or a folder written by save_to_disk",
                                  folder));
    return std::nullopt;
  }
  const auto state = read_json(dir / "state.json");
  if (!state.contains("_data_files") || !state["_data_files"].is_array() || state["_data_files"].empty())
    throw DataError(fmt::format("{}: \"_data_files\" is missing or empty (expected the list of the dataset's Arrow "
                                "files that save_to_disk writes)",
                                (dir / "state.json").string()));
  std::vector<std::string> files;
  for (const auto& entry : state["_data_files"]) {
    if (!entry.is_object() || !entry.contains("filename") || !entry["filename"].is_string())
      throw DataError(fmt::format("{}: an entry of \"_data_files\" has no \"filename\" string",
                                  (dir / "state.json").string()));
    const fs::path file = dir / entry["filename"].get<std::string>();
    if (!fs::is_regular_file(file, ec))
      throw DataError(fmt::format("{}: lists {}, which is not there", (dir / "state.json").string(), file.string()));
    files.push_back(file.string());
  }
  return files;
}

}  // namespace shardtrain::data
