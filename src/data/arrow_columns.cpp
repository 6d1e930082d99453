// Reading an Arrow column's values, batch by batch (arrow_ipc.hpp): strings in their offset, view and dictionary
// layouts (dictionary batches, replacements and deltas included), and lists of integers (token ids).
#include <fmt/format.h>

#include <optional>
#include <unordered_map>

#include "arrow_format.hpp"

namespace shardtrain::data {

using namespace arrow_detail;

namespace {

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

// The values of a string array of `rows` values at `at` (its own validity not applied): offsets or views.
class StringArray {
 public:
  StringArray(Batch& batch, const IpcFile& file, const Field& f, const Place& at, size_t variadic, int64_t rows,
              ArrowReadStats* stats) {
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
        throw FlatError(fmt::format("view {} ({} bytes at {} of data buffer {}) lies outside its {} data buffers", row, size,
                                    offset, index, data_.size()));
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

// A dictionary's values as the dictionary batches gave them (a delta appends).
struct Dictionary {
  std::string bytes;
  std::vector<uint64_t> ends;  // value i is bytes[ends[i-1], ends[i])
  std::vector<bool> valid;
};

// The column of that path, if `wanted` says it is what the caller reads; DataErrors naming the file otherwise.
const ArrowColumn& column_named(const IpcFile& f, const std::string& path, bool ArrowColumn::*wanted, const char* what,
                                const char* option) {
  for (size_t i = 0; i < f.columns.size(); ++i) {
    const auto& c = f.columns[i];
    if (c.path != path) continue;
    if (f.column_fields[i]->in_list)
      throw DataError(
          fmt::format("{}: column \"{}\" lies inside a list, map or union, not one value per row", f.path, path));
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
  return column_named(*file_, path, &ArrowColumn::is_string, "strings (Utf8, LargeUtf8, Utf8View or their Binary forms)",
                      "--text-field");
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
        if (m.header == kDictionaryBatch) on_dictionary(m);
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
  PathValidity(Batch& batch, const IpcFile& f, const Layout& layout, ArrowReadStats* stats) {
    for (const auto& at : layout.path) bits_.push_back(validity(batch, f, at, batch.length, stats));
  }
  bool null_at(int64_t i) const {
    for (const uint8_t* bits : bits_)
      if (!valid_at(bits, i)) return true;
    return false;
  }

 private:
  std::vector<const uint8_t*> bits_;
};

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
      const size_t first = is_view_string(field.type) ? at.buffer + 1 : at.buffer + 2;
      const size_t last = is_view_string(field.type) ? at.buffer + 1 + layout.variadic_count : first;
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

ListValues list_values(Batch& batch, const IpcFile& f, const Field& list, const Place& at, ArrowReadStats* stats) {
  const Field& item = list.children.at(0);
  const Place child{at.node + 1, at.buffer + own_buffers(list), at.variadic};
  const auto node = batch.node(child.node);
  if (node.null_count > 0)
    throw FlatError(fmt::format("the lists of \"{}\" hold {} null values", list.path, node.null_count));
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

}  // namespace shardtrain::data
