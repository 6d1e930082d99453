// Parquet files (parquet.hpp): the mapping, the footer (FileMetaData in Thrift's compact protocol), the
// schema flattened to its leaf columns with their definition and repetition levels, and each row group's
// column chunks. The pages themselves are read in parquet_pages.cpp.
#include "shardtrain/data/parquet.hpp"

#include <fmt/format.h>

#include <cstring>

#include "parquet_format.hpp"
#include "shardtrain/runtime/error.hpp"
#include "thrift_compact.hpp"

namespace shardtrain::data {
namespace parquet_detail {

using thrift::CompactReader;
using thrift::Type;

const char* physical_type_name(int32_t type) {
  static constexpr const char* kNames[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                           "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return type >= 0 && type < 8 ? kNames[type] : "an unknown type";
}

std::string codec_name(int32_t codec) {
  static constexpr const char* kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
  return codec >= 0 && codec < 8 ? kNames[codec] : fmt::format("codec {}", codec);
}

std::string encoding_name(int32_t encoding) {
  static constexpr const char* kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return encoding >= 0 && encoding < 10 ? kNames[encoding] : fmt::format("encoding {}", encoding);
}

namespace {

constexpr int32_t kRequired = 0, kRepeated = 2;  // FieldRepetitionType; OPTIONAL is 1

struct SchemaElement {
  std::optional<int32_t> type;  // set on leaves
  int32_t repetition = kRequired;
  std::string name;
  int32_t num_children = 0;
};

SchemaElement read_schema_element(CompactReader& r) {
  SchemaElement e;
  r.read_struct([&](int16_t id, Type t) {
    switch (id) {
      case 1: e.type = static_cast<int32_t>(r.read_int(t)); break;
      case 3: e.repetition = static_cast<int32_t>(r.read_int(t)); break;
      case 4: e.name = std::string(r.read_binary(t)); break;
      case 5: e.num_children = static_cast<int32_t>(r.read_int(t)); break;
      default: r.skip(t);
    }
  });
  return e;
}

ColumnChunk read_column_chunk_meta(CompactReader& r, std::vector<std::string>& path_in_schema) {
  ColumnChunk c;
  r.read_struct([&](int16_t id, Type t) {
    if (id == 1) {
      c.external_path = std::string(r.read_binary(t));
    } else if (id == 3) {
      c.has_metadata = true;
      r.read_struct(t, [&](int16_t mid, Type mt) {
        switch (mid) {
          case 1: c.type = static_cast<int32_t>(r.read_int(mt)); break;
          case 3: r.read_list(mt, [&](Type et) { path_in_schema.emplace_back(r.read_binary(et)); }); break;
          case 4: c.codec = static_cast<int32_t>(r.read_int(mt)); break;
          case 5: c.num_values = r.read_int(mt); break;
          case 6: c.total_uncompressed_size = r.read_int(mt); break;
          case 7: c.total_compressed_size = r.read_int(mt); break;
          case 9: c.data_page_offset = r.read_int(mt); break;
          case 11: c.dictionary_page_offset = r.read_int(mt); break;
          default: r.skip(mt);
        }
      });
    } else {
      r.skip(t);
    }
  });
  return c;
}

// The leaves of the schema tree (flattened depth-first in the file), with their levels: each optional or
// repeated field on the way adds a definition level, each repeated one a repetition level.
// `entry`: the definition level of the innermost repeated field so far (0 when none).
void collect_leaves(const std::vector<SchemaElement>& schema, size_t& next, int32_t children, const std::string& prefix,
                    int def, int rep, int entry, int depth, std::vector<ParquetColumn>& out) {
  if (depth > 64) throw thrift::ThriftError("the schema nests deeper than 64 levels");
  for (int32_t c = 0; c < children; ++c) {
    if (next >= schema.size()) throw thrift::ThriftError("the schema names more fields than it holds");
    const SchemaElement& e = schema[next++];
    const int d = def + (e.repetition != kRequired ? 1 : 0), r = rep + (e.repetition == kRepeated ? 1 : 0);
    const int at = e.repetition == kRepeated ? d : entry;
    const std::string path = prefix.empty() ? e.name : prefix + "." + e.name;
    if (!e.type) {
      if (e.num_children < 0) throw thrift::ThriftError(fmt::format("field {} has {} children", path, e.num_children));
      collect_leaves(schema, next, e.num_children, path, d, r, at, depth + 1, out);
      continue;
    }
    ParquetColumn col;
    col.path = path;
    col.physical_type = physical_type_name(*e.type);
    col.is_string = *e.type == static_cast<int32_t>(PhysicalType::ByteArray) && r == 0;
    col.is_id_list = r == 1 && (*e.type == static_cast<int32_t>(PhysicalType::Int32) ||
                                *e.type == static_cast<int32_t>(PhysicalType::Int64));
    col.max_definition_level = d;
    col.max_repetition_level = r;
    col.repeated_definition_level = at;
    col.leaf_index = static_cast<int>(out.size());
    out.push_back(std::move(col));
  }
}

Type expect_struct(Type t) {
  if (t != Type::Struct) throw thrift::ThriftError("a struct was expected");
  return t;
}

void read_file_metadata(FileMetadata& m, const uint8_t* p, size_t n) {
  CompactReader r(p, n);
  std::vector<SchemaElement> schema;
  std::vector<std::vector<std::string>> chunk_paths;  // path_in_schema of every chunk, checked below
  r.read_struct([&](int16_t id, Type t) {
    switch (id) {
      case 2:
        r.read_list(t, [&](Type et) {
          expect_struct(et);
          schema.push_back(read_schema_element(r));
        });
        break;
      case 3: m.num_rows = r.read_int(t); break;
      case 4:
        r.read_list(t, [&](Type et) {
          RowGroup g;
          r.read_struct(et, [&](int16_t gid, Type gt) {
            if (gid == 1) {
              r.read_list(gt, [&](Type ct) {
                expect_struct(ct);
                chunk_paths.emplace_back();
                g.columns.push_back(read_column_chunk_meta(r, chunk_paths.back()));
              });
            } else if (gid == 3) {
              g.num_rows = r.read_int(gt);
            } else {
              r.skip(gt);
            }
          });
          m.row_groups.push_back(std::move(g));
        });
        break;
      case 6: m.created_by = std::string(r.read_binary(t)); break;
      case 8: throw thrift::ThriftError("its footer declares encryption, which is not supported: decrypt it first");
      default: r.skip(t);
    }
  });
  if (schema.empty()) throw thrift::ThriftError("the footer has no schema");
  size_t next = 1;
  collect_leaves(schema, next, schema[0].num_children, "", 0, 0, 0, 0, m.columns);
  if (next != schema.size())
    throw thrift::ThriftError(fmt::format("the schema's root claims fewer fields than the {} it holds", schema.size()));
  if (m.num_rows < 0) throw thrift::ThriftError(fmt::format("the footer says {} rows", m.num_rows));
  int64_t rows = 0;
  size_t chunk = 0;
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    const RowGroup& group = m.row_groups[g];
    if (group.columns.size() != m.columns.size())
      throw thrift::ThriftError(
          fmt::format("row group {} has {} column chunks for {} columns", g, group.columns.size(), m.columns.size()));
    if (group.num_rows < 0) throw thrift::ThriftError(fmt::format("row group {} says {} rows", g, group.num_rows));
    for (size_t c = 0; c < group.columns.size(); ++c, ++chunk) {
      const auto& parts = chunk_paths[chunk];
      std::string joined;
      for (const auto& part : parts) joined += (joined.empty() ? "" : ".") + part;
      if (group.columns[c].has_metadata && joined != m.columns[c].path)
        throw thrift::ThriftError(fmt::format("row group {}'s column chunk {} is \"{}\" where the schema has \"{}\"", g, c,
                                              joined, m.columns[c].path));
    }
    rows += group.num_rows;
  }
  if (rows != m.num_rows)
    throw thrift::ThriftError(fmt::format("its row groups hold {} rows, its footer says {}", rows, m.num_rows));
}

}  // namespace
}  // namespace parquet_detail

using parquet_detail::FileMetadata;

ParquetFile::ParquetFile() : meta_(std::make_unique<FileMetadata>()) {}
ParquetFile::ParquetFile(ParquetFile&&) noexcept = default;
ParquetFile& ParquetFile::operator=(ParquetFile&&) noexcept = default;
ParquetFile::~ParquetFile() = default;

ParquetFile ParquetFile::open(const std::string& path) {
  ParquetFile f;
  FileMetadata& m = *f.meta_;
  m.path = path;
  m.file.map(path);
  const size_t size = m.file.size;
  const uint8_t* d = m.file.data;
  if (size >= 4 && std::memcmp(d + size - 4, "PARE", 4) == 0)
    throw DataError(fmt::format("{}: an encrypted Parquet file (its footer is encrypted), which is not supported", path));
  if (size < 12 || std::memcmp(d, "PAR1", 4) != 0 || std::memcmp(d + size - 4, "PAR1", 4) != 0)
    throw DataError(fmt::format("{}: not a Parquet file ({} bytes; a Parquet file starts and ends with \"PAR1\"{})", path,
                                size, size >= 4 && std::memcmp(d, "PAR1", 4) == 0 ? ": this one is truncated" : ""));
  uint32_t footer_len = 0;
  std::memcpy(&footer_len, d + size - 8, 4);  // little-endian, as this host
  if (footer_len > size - 12)
    throw DataError(
        fmt::format("{}: its footer claims {} bytes of a {}-byte file (truncated or corrupt)", path, footer_len, size));
  m.footer_begin = size - 8 - footer_len;
  try {
    parquet_detail::read_file_metadata(m, d + m.footer_begin, footer_len);
  } catch (const thrift::ThriftError& e) {
    throw DataError(fmt::format("{}: the Parquet footer cannot be read: {}", path, e.what()));
  }
  return f;
}

const std::string& ParquetFile::path() const { return meta_->path; }
int64_t ParquetFile::num_rows() const { return meta_->num_rows; }
size_t ParquetFile::num_row_groups() const { return meta_->row_groups.size(); }
std::string ParquetFile::created_by() const { return meta_->created_by; }
const std::vector<ParquetColumn>& ParquetFile::columns() const { return meta_->columns; }

namespace {

// The leaves of `field`: the leaf of that path, or every leaf under it.
std::vector<const ParquetColumn*> leaves_of(const std::vector<ParquetColumn>& columns, const std::string& field) {
  std::vector<const ParquetColumn*> out;
  for (const auto& c : columns)
    if (c.path == field || c.path.starts_with(field + ".")) out.push_back(&c);
  return out;
}

[[noreturn]] void no_column(const std::string& file, const std::vector<ParquetColumn>& columns, const std::string& field,
                            const char* option) {
  std::string names;
  for (size_t i = 0; i < columns.size() && i < 12; ++i) names += (i ? ", " : "") + columns[i].path;
  if (columns.size() > 12) names += fmt::format(", ... ({} in all)", columns.size());
  throw DataError(fmt::format("{}: no column \"{}\" (its columns: {}; {} picks another)", file, field,
                              names.empty() ? "none" : names, option));
}

}  // namespace

const ParquetColumn& ParquetFile::string_column(const std::string& path) const {
  for (const auto& c : meta_->columns) {
    if (c.path != path) continue;
    if (c.max_repetition_level > 0)
      throw DataError(fmt::format("{}: column \"{}\" is a list (repeated), not one string per row{}", meta_->path, path,
                                  c.is_id_list
                                      ? fmt::format("; it holds integers: --token-field {} imports them as token ids", path)
                                      : std::string()));
    if (!c.is_string)
      throw DataError(
          fmt::format("{}: column \"{}\" holds {}, not strings (BYTE_ARRAY)", meta_->path, path, c.physical_type));
    return c;
  }
  const auto under = leaves_of(meta_->columns, path);
  if (under.size() == 1 && under[0]->is_id_list)
    throw DataError(
        fmt::format("{}: column \"{}\" is a list of integers ({}), not strings; it holds token ids: "
                    "--token-field {} imports them",
                    meta_->path, path, under[0]->physical_type, path));
  no_column(meta_->path, meta_->columns, path, "--text-field");
}

const ParquetColumn& ParquetFile::id_list_column(const std::string& field) const {
  const auto under = leaves_of(meta_->columns, field);
  if (under.empty()) no_column(meta_->path, meta_->columns, field, "--token-field");
  if (under.size() > 1)
    throw DataError(fmt::format("{}: column \"{}\" has {} fields inside it (\"{}\", ...), not one list of integers",
                                meta_->path, field, under.size(), under[0]->path));
  const ParquetColumn& c = *under[0];
  if (!c.is_id_list)
    throw DataError(fmt::format("{}: column \"{}\" ({}) is {}, not a list of integers (token ids)", meta_->path, field,
                                c.path,
                                c.max_repetition_level > 1    ? "a list of lists"
                                : c.max_repetition_level == 0 ? fmt::format("one {} per row", c.physical_type)
                                                              : fmt::format("a list of {}", c.physical_type)));
  return c;
}

namespace {

// The sum over the column's chunks of one of their counts (negative ones, which a corrupt footer may hold, as 0).
uint64_t chunk_sum(const parquet_detail::FileMetadata& m, const ParquetColumn& column,
                   int64_t parquet_detail::ColumnChunk::*count) {
  uint64_t total = 0;
  for (const auto& g : m.row_groups) {
    const int64_t v = g.columns.at(static_cast<size_t>(column.leaf_index)).*count;
    if (v > 0) total += static_cast<uint64_t>(v);
  }
  return total;
}

}  // namespace

uint64_t ParquetFile::uncompressed_bytes(const ParquetColumn& column) const {
  return chunk_sum(*meta_, column, &parquet_detail::ColumnChunk::total_uncompressed_size);
}

uint64_t ParquetFile::id_count_estimate(const ParquetColumn& column) const {
  return chunk_sum(*meta_, column, &parquet_detail::ColumnChunk::num_values);
}

void ParquetFile::for_each_id_list(const ParquetColumn& column,
                                   const std::function<void(std::optional<std::span<const int64_t>>)>& emit,
                                   ParquetReadStats* stats) const {
  for (size_t g = 0; g < meta_->row_groups.size(); ++g) parquet_detail::read_id_list_chunk(*meta_, g, column, emit, stats);
}

void ParquetFile::for_each_string(const ParquetColumn& column,
                                  const std::function<void(std::optional<std::string_view>)>& emit,
                                  ParquetReadStats* stats) const {
  for (size_t g = 0; g < meta_->row_groups.size(); ++g) parquet_detail::read_column_chunk(*meta_, g, column, emit, stats);
}

}  // namespace shardtrain::data
