// Arrow IPC files and streams (arrow_ipc.hpp), read from the format's specification (the columnar format and
// the Schema.fbs / Message.fbs / File.fbs definitions): encapsulated messages, the schema's fields, and record
// and dictionary batches with their body compression. Reading a column's values: arrow_columns.cpp.
#include <fmt/format.h>
#include <lz4frame.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "arrow_format.hpp"

namespace shardtrain::data {
namespace arrow_detail {
namespace {

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

void flatten(const Field& f, std::vector<ArrowColumn>& columns, std::vector<const Field*>& fields) {
  columns.push_back({f.path, type_name(f), is_string_type(f.type) && !f.in_list, is_id_list(f)});
  fields.push_back(&f);
  if (f.dictionary) return;  // its children describe the dictionary's values
  for (const auto& c : f.children) flatten(c, columns, fields);
}

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

}  // namespace

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

std::vector<uint8_t> Batch::decompress(std::string_view src, uint64_t n, size_t index) const {
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
      if (LZ4F_isError(hint)) throw FlatError(fmt::format("the LZ4 frame of buffer {}: {}", index, LZ4F_getErrorName(hint)));
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

const uint8_t* validity(Batch& batch, const IpcFile& file, const Place& at, int64_t rows, ArrowReadStats* stats) {
  const auto node = batch.node(at.node);
  if (node.length != rows)
    throw FlatError(fmt::format("field node {} has {} values for the batch's {} rows", at.node, node.length, rows));
  if (node.null_count == 0) return nullptr;
  const std::string_view bits = batch.buffer(file, at.buffer, stats);
  if (bits.size() < static_cast<size_t>((rows + 7) / 8))
    throw FlatError(
        fmt::format("field node {} has nulls but a {}-byte validity bitmap for {} rows", at.node, bits.size(), rows));
  return reinterpret_cast<const uint8_t*>(bits.data());
}

Layout layout_of(const IpcFile& f, const Batch& batch, const Field& target) {
  Layout layout;
  Place at;
  const flat::Vector variadic = batch.record.vector(4);
  for (const auto& field : f.fields)
    if (locate(field, &target, at, variadic, layout.path, layout.variadic_count)) return layout;
  throw InternalError("ArrowIpcFile: a column outside its schema");
}

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

}  // namespace shardtrain::data
