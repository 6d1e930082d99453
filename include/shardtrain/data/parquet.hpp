// Reading the text column of Apache Parquet files: the format the Hugging Face Hub serves datasets in
// (fineweb, the seed's corpus, is Parquet only), so prepare-data takes them as they are downloaded.
// Our own reader: the footer (Thrift compact), the schema, data pages v1 and v2, dictionary, PLAIN and
// DELTA encodings of byte arrays, definition levels, page CRCs, and the codecs writers use (snappy, gzip,
// zstd, brotli, LZ4). It reads one string column, or one list-of-integers column (token ids, as a tokenized
// dataset holds them: input_ids), row group by row group and page by page, so memory holds one page (and a
// dictionary) whatever the file's size. Anything else (encryption, nested lists, LZO) is a DataError that
// names the file and says what it found.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::data {

struct ParquetColumn {
  std::string path;           // dotted, "text" or "meta.text"
  std::string physical_type;  // BYTE_ARRAY, INT64, ...
  bool is_string = false;     // BYTE_ARRAY (text or binary), not repeated
  bool is_id_list = false;    // INT32 or INT64 inside one repeated field (a list of integers): token ids
  int max_definition_level = 0;
  int max_repetition_level = 0;
  int repeated_definition_level = 0;  // lists: the definition level at which the list has an entry
  int leaf_index = 0;                 // the column chunk's index in each row group
};

// The pages a read went through, by kind: "DATA_PAGE_V2 RLE_DICTIONARY ZSTD" -> how many.
struct ParquetReadStats {
  std::map<std::string, size_t> pages;
};

namespace parquet_detail {
struct FileMetadata;
}

class ParquetFile {
 public:
  // Maps the file and reads its footer. DataError when it is not Parquet, truncated or encrypted.
  static ParquetFile open(const std::string& path);
  ParquetFile(ParquetFile&&) noexcept;
  ParquetFile& operator=(ParquetFile&&) noexcept;
  ~ParquetFile();

  const std::string& path() const;
  int64_t num_rows() const;
  size_t num_row_groups() const;
  std::string created_by() const;
  const std::vector<ParquetColumn>& columns() const;  // the leaves, in the file's order
  // The column of that dotted path that holds strings; DataError naming the file's columns otherwise.
  const ParquetColumn& string_column(const std::string& path) const;
  // The list-of-integers column of that field (its leaf: "input_ids.list.element" for the field "input_ids", or
  // the field itself when written as a bare repeated integer); DataError naming the file's columns otherwise.
  const ParquetColumn& id_list_column(const std::string& field) const;
  // Bytes of the column's values once decompressed (the writers' own count, page headers included).
  uint64_t uncompressed_bytes(const ParquetColumn& column) const;
  // Values (ids, empty and null rows counted once each) the column's chunks say they hold.
  uint64_t id_count_estimate(const ParquetColumn& column) const;

  // Calls emit(value) for every row of the column in order: the bytes, or nullopt for a null. The view
  // lives until emit returns. `stats`, when given, counts the pages read.
  void for_each_string(const ParquetColumn& column, const std::function<void(std::optional<std::string_view> value)>& emit,
                       ParquetReadStats* stats = nullptr) const;
  // Calls emit(ids) for every row of an id_list_column in order: its integers, or nullopt for a null row (a
  // null inside a list is a DataError). The span lives until emit returns.
  void for_each_id_list(const ParquetColumn& column,
                        const std::function<void(std::optional<std::span<const int64_t>> ids)>& emit,
                        ParquetReadStats* stats = nullptr) const;

 private:
  ParquetFile();
  std::unique_ptr<parquet_detail::FileMetadata> meta_;
};

}  // namespace shardtrain::data
