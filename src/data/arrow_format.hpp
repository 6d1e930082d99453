// What arrow_ipc.cpp (the file, its messages, schema and batches) and arrow_columns.cpp (reading a column's
// values) share: the format's type and message numbers (Schema.fbs, Message.fbs), the schema's fields, the
// messages' places in the mapped file, and a batch's field nodes and buffers, decompressed when the batch is.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "flatbuffer.hpp"
#include "mapped_file.hpp"
#include "shardtrain/data/arrow_ipc.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data::arrow_detail {

using flat::FlatError;

// Schema.fbs's Type union, in its order.
enum TypeId : uint8_t {
  kNone = 0,
  kNull,
  kInt,
  kFloatingPoint,
  kBinary,
  kUtf8,
  kBool,
  kDecimal,
  kDate,
  kTime,
  kTimestamp,
  kInterval,
  kList,
  kStruct,
  kUnion,
  kFixedSizeBinary,
  kFixedSizeList,
  kMap,
  kDuration,
  kLargeBinary,
  kLargeUtf8,
  kLargeList,
  kRunEndEncoded,
  kBinaryView,
  kUtf8View,
  kListView,
  kLargeListView,
  kTypeCount
};
inline constexpr const char* kTypeNames[kTypeCount] = {"NONE",          "Null",      "Int",           "FloatingPoint",
                                                       "Binary",        "Utf8",      "Bool",          "Decimal",
                                                       "Date",          "Time",      "Timestamp",     "Interval",
                                                       "List",          "Struct",    "Union",         "FixedSizeBinary",
                                                       "FixedSizeList", "Map",       "Duration",      "LargeBinary",
                                                       "LargeUtf8",     "LargeList", "RunEndEncoded", "BinaryView",
                                                       "Utf8View",      "ListView",  "LargeListView"};

// Message.fbs's MessageHeader union.
enum HeaderType : uint8_t { kSchema = 1, kDictionaryBatch = 2, kRecordBatch = 3 };
inline constexpr int64_t kMaxDepth = 64;

inline bool is_offset_string(uint8_t t) { return t == kBinary || t == kUtf8 || t == kLargeBinary || t == kLargeUtf8; }
inline bool is_view_string(uint8_t t) { return t == kBinaryView || t == kUtf8View; }
inline bool is_string_type(uint8_t t) { return is_offset_string(t) || is_view_string(t); }
inline bool is_list_type(uint8_t t) { return t == kList || t == kLargeList || t == kFixedSizeList; }

struct Field {
  std::string name, path;
  uint8_t type = kNone;
  int16_t union_mode = 0;  // Sparse 0, Dense 1
  bool dictionary = false;
  int64_t dictionary_id = 0;
  int index_bits = 32;
  bool index_signed = true;
  int int_bits = 0;  // Int: its width
  bool int_signed = true;
  int32_t list_size = 0;  // FixedSizeList: values per list
  bool in_list = false;   // under a list, map, union or run-end encoding: not one value per row
  std::vector<Field> children;
};

// One encapsulated message: its FlatBuffers metadata and its body, as positions in the mapped file.
struct Message {
  size_t offset = 0;  // where its prefix starts (for errors)
  size_t meta = 0, meta_size = 0, body = 0;
  uint64_t body_size = 0;
  uint8_t header = 0;
};

struct IpcFile {
  std::string path;
  MappedFile file;
  bool file_format = false;
  std::vector<Field> fields;
  std::vector<ArrowColumn> columns;
  std::vector<const Field*> column_fields;     // beside columns
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

// Where one field's arrays lie in a record batch: field node and buffer indices, found by walking the fields
// depth first as the batch lays them out (view types add the batch's variadic buffer counts).
struct Place {
  size_t node = 0, buffer = 0, variadic = 0;
};
struct Layout {
  std::vector<Place> path;  // the enclosing structs, then the column itself
  size_t variadic_count = 0;
};

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
      if (codec != 0 && codec != 1)
        throw FlatError(fmt::format("body compression codec {} (known: LZ4_FRAME, ZSTD)", codec));
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
      throw FlatError(
          fmt::format("buffer {} ({} bytes at {}) lies outside the {}-byte body", i, size, offset, message->body_size));
    const auto* p = reinterpret_cast<const char*>(file.file.data + message->body + offset);
    std::string_view raw(p, static_cast<size_t>(size));
    if (codec < 0 || raw.empty()) return raw;
    if (raw.size() < 8)
      throw FlatError(fmt::format("compressed buffer {} has {} bytes, fewer than its length", i, raw.size()));
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
  std::vector<uint8_t> decompress(std::string_view src, uint64_t n, size_t index) const;
};

// Bit i of a validity bitmap (nullptr: every value is valid).
inline bool valid_at(const uint8_t* bits, int64_t i) { return bits == nullptr || ((bits[i >> 3] >> (i & 7)) & 1) != 0; }

// The validity bitmap of the array at `at`, checked to hold `rows` values (nullptr: no nulls).
const uint8_t* validity(Batch& batch, const IpcFile& file, const Place& at, int64_t rows, ArrowReadStats* stats);

template <typename T>
T load_at(std::string_view s, size_t i) {
  T v;
  std::memcpy(&v, s.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Buffers a field of this type has in a record batch, not counting its children's and the variadic buffers of
// the view types.
size_t own_buffers(const Field& f);

// Where `target` lies in the batch.
Layout layout_of(const IpcFile& f, const Batch& batch, const Field& target);

}  // namespace shardtrain::data::arrow_detail
