// What parquet.cpp reads from a Parquet footer and parquet_pages.cpp needs to read a column chunk: the
// mapped file, each row group's column chunks, and the format's enum values (parquet-format's
// parquet.thrift numbers them; these are the numbers as written in files).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mapped_file.hpp"
#include "shardtrain/data/parquet.hpp"

namespace shardtrain::data::parquet_detail {

enum class PhysicalType : int32_t {
  Boolean = 0,
  Int32 = 1,
  Int64 = 2,
  Int96 = 3,
  Float = 4,
  Double = 5,
  ByteArray = 6,
  FixedLenByteArray = 7,
};
enum class Codec : int32_t { Uncompressed = 0, Snappy = 1, Gzip = 2, Lzo = 3, Brotli = 4, Lz4 = 5, Zstd = 6, Lz4Raw = 7 };
enum class Encoding : int32_t {
  Plain = 0,
  PlainDictionary = 2,
  Rle = 3,
  BitPacked = 4,
  DeltaBinaryPacked = 5,
  DeltaLengthByteArray = 6,
  DeltaByteArray = 7,
  RleDictionary = 8,
  ByteStreamSplit = 9,
};
enum class PageType : int32_t { DataPage = 0, IndexPage = 1, DictionaryPage = 2, DataPageV2 = 3 };

const char* physical_type_name(int32_t type);
std::string codec_name(int32_t codec);
std::string encoding_name(int32_t encoding);

struct ColumnChunk {
  int32_t type = -1;
  int32_t codec = 0;
  int64_t num_values = 0;
  int64_t total_compressed_size = 0;
  int64_t total_uncompressed_size = 0;
  int64_t data_page_offset = -1;
  std::optional<int64_t> dictionary_page_offset;
  bool has_metadata = false;  // false: encrypted column metadata
  std::string external_path;  // ColumnChunk.file_path: the data lives in another file
};

struct RowGroup {
  int64_t num_rows = 0;
  std::vector<ColumnChunk> columns;  // one per leaf column
};

struct FileMetadata {
  std::string path;
  MappedFile file;          // mapped for as long as the ParquetFile lives
  size_t footer_begin = 0;  // where the column data ends
  int64_t num_rows = 0;
  std::string created_by;
  std::vector<ParquetColumn> columns;
  std::vector<RowGroup> row_groups;
};

// Every value of one column chunk, rows in order: the bytes, or nullopt for a null (parquet_pages.cpp).
void read_column_chunk(const FileMetadata& file, size_t row_group, const ParquetColumn& column,
                       const std::function<void(std::optional<std::string_view>)>& emit, ParquetReadStats* stats);
// Every row of one chunk of a list-of-integers column, in order: its values, or nullopt for a null row.
void read_id_list_chunk(const FileMetadata& file, size_t row_group, const ParquetColumn& column,
                        const std::function<void(std::optional<std::span<const int64_t>>)>& emit, ParquetReadStats* stats);

}  // namespace shardtrain::data::parquet_detail
