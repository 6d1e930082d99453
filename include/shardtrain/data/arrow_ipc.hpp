// Reading the text column of Apache Arrow IPC files: what the Hugging Face `datasets` library keeps on disk
// (`save_to_disk` folders and its cache are Arrow streams), and Arrow's file format (Feather v2). Our own
// reader of the published format: the encapsulated messages (FlatBuffers metadata, then a body), the schema,
// record batches and dictionary batches (deltas too), LZ4-frame and zstd body compression, and the string
// layouts: Utf8 / Binary with 32-bit offsets, their Large forms with 64-bit ones, the Utf8View / BinaryView
// views, and dictionary-encoded strings; also lists of integers, for datasets already tokenized (input_ids);
// a column inside structs is reached by its dotted path. One record batch's buffers of the column are in
// memory at a time (the file itself is mapped). Anything else is a DataError naming the file, the message and
// what was found.
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

struct ArrowColumn {
  std::string path;         // dotted, "text" or "meta.text"
  std::string type;         // "Utf8", "LargeUtf8", "Int64", "List<Int32>", "Struct", "Dictionary<Int32, Utf8>", ...
  bool is_string = false;   // a string or binary type, plain, viewed or dictionary-encoded, not inside a list
  bool is_id_list = false;  // a list (List, LargeList, FixedSizeList) of integers, not inside a list: token ids
};

// What a read went through: "record batches", "dictionary batches", "delta dictionary batches",
// "LZ4_FRAME buffers", "ZSTD buffers", "uncompressed buffers" (of a compressed batch) -> how many.
struct ArrowReadStats {
  std::map<std::string, size_t> counts;
};

namespace arrow_detail {
struct IpcFile;
}

class ArrowIpcFile {
 public:
  // Maps the file and reads its schema and the place of every message (file format: from the footer; stream
  // format: by walking the messages' headers). DataError when it is not Arrow IPC, is cut short, is big-endian,
  // or its metadata cannot be read.
  static ArrowIpcFile open(const std::string& path);
  ArrowIpcFile(ArrowIpcFile&&) noexcept;
  ArrowIpcFile& operator=(ArrowIpcFile&&) noexcept;
  ~ArrowIpcFile();

  const std::string& path() const;
  bool file_format() const;  // "ARROW1" file (Feather v2), else a stream
  int64_t num_rows() const;
  size_t num_record_batches() const;
  const std::vector<ArrowColumn>& columns() const;  // every field, depth first, in the schema's order
  // The column of that dotted path that holds strings; DataError naming the file's columns otherwise.
  const ArrowColumn& string_column(const std::string& path) const;
  // The same for a column of integer lists (what `datasets` keeps tokenized text in: input_ids).
  const ArrowColumn& id_list_column(const std::string& path) const;
  // About how many bytes of strings the column holds (a progress bar's estimate): the string data buffers'
  // lengths, decompressed where the batch is compressed.
  uint64_t string_bytes_estimate(const ArrowColumn& column) const;

  // Calls emit(value) for every row of the column (one of this file's columns(), as string_column returns it)
  // in order: the bytes, or nullopt for a null (the value's or an enclosing struct's). The view lives until
  // emit returns.
  void for_each_string(const ArrowColumn& column, const std::function<void(std::optional<std::string_view> value)>& emit,
                       ArrowReadStats* stats = nullptr) const;
  // The same for a column of integer lists: each row's values (widened; an unsigned 64-bit value past int64
  // reads as -1), or nullopt for a null list. Null values inside a list are a DataError.
  void for_each_id_list(const ArrowColumn& column,
                        const std::function<void(std::optional<std::span<const int64_t>> ids)>& emit,
                        ArrowReadStats* stats = nullptr) const;
  // How many values the lists of the column hold, from the batches' metadata (a progress bar's estimate).
  uint64_t id_count_estimate(const ArrowColumn& column) const;

 private:
  ArrowIpcFile();
  std::unique_ptr<arrow_detail::IpcFile> file_;
};

}  // namespace shardtrain::data
