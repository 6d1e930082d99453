// Reading documents (documents.hpp): text, JSONL, Parquet and Arrow inputs, plain or, for text and JSONL,
// compressed with gzip or zstd (input_file.hpp); folders expanded into their files.
#include "shardtrain/data/documents.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "input_file.hpp"
#include "shardtrain/data/arrow_ipc.hpp"
#include "shardtrain/data/output_file.hpp"
#include "shardtrain/data/parquet.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "utf8.hpp"

namespace shardtrain::data {

InputFormat parse_input_format(const std::string& s) {
  if (s == "auto") return InputFormat::Auto;
  if (s == "text" || s == "txt") return InputFormat::Text;
  if (s == "jsonl" || s == "json") return InputFormat::Jsonl;
  if (s == "parquet") return InputFormat::Parquet;
  if (s == "arrow") return InputFormat::Arrow;
  throw UsageError(fmt::format("unknown input format '{}': expected auto, text, jsonl, parquet or arrow", s));
}

namespace {

// A folder written by `datasets`' save_to_disk (a state.json listing its Arrow files): those files, in the
// order state.json gives; nullopt for any other folder. A DatasetDict's folder (dataset_dict.json) is a
// DataError naming its splits, since it holds several datasets; so is a folder of the `datasets` cache (Arrow
// files and a dataset_info.json, no state.json), whose Arrow files may include cached copies of the same rows.
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
      throw DataError(
          fmt::format("{}: a folder of the datasets cache (dataset_info.json, no state.json), whose Arrow "
                      "files may repeat each other's rows (cache-*.arrow); give its NAME-SPLIT-*.arrow files, "
                      "or a folder written by save_to_disk",
                      folder));
    return std::nullopt;
  }
  const auto state = read_json(dir / "state.json");
  if (!state.contains("_data_files") || !state["_data_files"].is_array() || state["_data_files"].empty())
    throw DataError(
        fmt::format("{}: \"_data_files\" is missing or empty (expected the list of the dataset's Arrow "
                    "files that save_to_disk writes)",
                    (dir / "state.json").string()));
  std::vector<std::string> files;
  std::set<std::string> listed;
  const std::string state_path = (dir / "state.json").string();
  for (const auto& entry : state["_data_files"]) {
    if (!entry.is_object() || !entry.contains("filename") || !entry["filename"].is_string())
      throw DataError(fmt::format("{}: an entry of \"_data_files\" has no \"filename\" string", state_path));
    // save_to_disk writes its Arrow files beside state.json. A downloaded folder's state.json decides what goes
    // into a training set, so it names nothing else: no path out of the folder (../, /etc/...), no file twice.
    const std::string name = entry["filename"].get<std::string>();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      throw DataError(
          fmt::format("{}: \"_data_files\" lists '{}', which is not a file name in the folder (expected "
                      "the name of an Arrow file beside state.json, as save_to_disk writes)",
                      state_path, name));
    if (fs::path(name).extension() != ".arrow")
      throw DataError(
          fmt::format("{}: \"_data_files\" lists '{}', which is not an Arrow file (*.arrow, as "
                      "save_to_disk writes)",
                      state_path, name));
    if (!listed.insert(name).second) throw DataError(fmt::format("{}: \"_data_files\" lists '{}' twice", state_path, name));
    const fs::path file = dir / name;
    if (!fs::is_regular_file(file, ec))
      throw DataError(fmt::format("{}: lists {}, which is not there", state_path, file.string()));
    files.push_back(file.string());
  }
  return files;
}

}  // namespace

namespace {

// The files of a folder given whole, in expand_inputs' order. Folders are compared where they lead, so that a
// symbolic link loop (which the listing would follow 40 levels deep, reading every file at each) or a second link
// to one folder is refused instead of reading the same files again.
void list_folder(const std::string& folder, const std::string& output, const OwnOutput& own, const ToolFiles& tool,
                 std::vector<std::string>& out) {
  namespace fs = std::filesystem;
  std::set<std::pair<dev_t, ino_t>> tool_ids;
  for (const auto& f : tool.files)
    if (struct stat st{}; ::stat(f.c_str(), &st) == 0) tool_ids.emplace(st.st_dev, st.st_ino);
  std::set<fs::path> folders{fs::canonical(folder)};
  // Sorted by path; a save_to_disk folder inside keeps its own order, sorted where its folder falls.
  std::vector<std::pair<std::string, std::vector<std::string>>> found;
  for (auto it = fs::recursive_directory_iterator(folder, fs::directory_options::follow_directory_symlink);
       it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& path = it->path();
    if (path.filename().string().starts_with(".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory()) {
      if (!folders.insert(fs::canonical(path)).second) {
        it.disable_recursion_pending();
        throw DataError(
            fmt::format("{}: leads to {}, a folder already read (a symbolic link loop, or a second link to "
                        "one folder); its files would be read twice",
                        path.string(), fs::canonical(path).string()));
      }
      if (auto files = hf_dataset_files(path.string())) {
        it.disable_recursion_pending();
        found.emplace_back(path.string() + "/", std::move(*files));
      }
    } else if (it->is_regular_file()) {
      if (is_output_or_temporary(path, output)) {
        // The output itself (not a temporary of it) is left out only when it is what the tool writes: a corpus file
        // given as --output with --overwrite was replaced by the dataset, exit 0.
        std::error_code ec;
        if (fs::equivalent(path, output, ec) && !(own.holds && own.holds(path.string())))
          throw UsageError(fmt::format(
              "{}: is a file of the input folder {} (an input) and the output; writing the output would replace it, "
              "--overwrite or not{} (give another --output)",
              output, folder, own.kind.empty() ? std::string() : fmt::format(": it is not {}", own.kind)));
        log::info("{}: left out of the inputs: it is the output, or a temporary file of it", path.string());
        continue;
      }
      if (struct stat st{};
          !tool_ids.empty() && ::stat(path.c_str(), &st) == 0 && tool_ids.contains({st.st_dev, st.st_ino})) {
        log::info("{}: left out of the inputs: it is {}", path.string(), tool.what);
        continue;
      }
      found.emplace_back(path.string(), std::vector<std::string>{path.string()});
    } else if (std::error_code ec; it->is_symlink(ec) && !fs::exists(it->status(ec))) {
      std::error_code ec_target;
      const fs::path target = fs::read_symlink(path, ec_target);
      throw DataError(
          fmt::format("{}: is a symbolic link to {}, which is not there (a download cut short, or a cache cleaned up?); its "
                      "documents would be missing from the dataset: fetch the file again, or remove the link",
                      path.string(), ec_target ? std::string("?") : target.string()));
    }
  }
  if (found.empty()) throw DataError(fmt::format("{}: folder has no files", folder));
  std::sort(found.begin(), found.end());
  for (auto& [key, files] : found) out.insert(out.end(), files.begin(), files.end());
}

}  // namespace

namespace {

// What a named input that is not a file or folder is, for the message.
const char* file_type_name(std::filesystem::file_type type) {
  switch (type) {
    case std::filesystem::file_type::fifo: return "a FIFO (named pipe)";
    case std::filesystem::file_type::character: return "a character device";
    case std::filesystem::file_type::block: return "a block device";
    case std::filesystem::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

// One file reached twice (named twice, through two spellings or links, or named and in a folder given too) would
// have its documents read twice, and the validation split could hold a copy of a training document. Compared by
// device and inode, as data.mixture compares its files (std::filesystem::equivalent), once for all the files.
void refuse_files_given_twice(const std::vector<std::string>& files) {
  std::map<std::pair<dev_t, ino_t>, size_t> seen;
  for (size_t i = 0; i < files.size(); ++i) {
    struct stat st {};
    if (::stat(files[i].c_str(), &st) != 0) continue;  // its reading names what is wrong with it
    const auto [at, fresh] = seen.emplace(std::make_pair(st.st_dev, st.st_ino), i);
    if (!fresh)
      throw UsageError(fmt::format(
          "{}: is the same file as {}, given before; its documents would be read twice (and a copy could land in the "
          "validation split); give each file once",
          files[i], files[at->second]));
  }
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, const std::string& output,
                                       const OwnOutput& own, const ToolFiles& tool_files) {
  namespace fs = std::filesystem;
  // Every named input is looked at before any folder is listed: a pipe or device (which would be read without end)
  // is refused before any work, wherever it stands on the command line.
  for (const auto& in : inputs) {
    std::error_code ec;
    const auto type = fs::status(in, ec).type();
    if (type != fs::file_type::regular && type != fs::file_type::directory && type != fs::file_type::not_found &&
        type != fs::file_type::none)
      throw UsageError(
          fmt::format("{}: is {}; --input takes regular files or folders of them (a pipe or a device has no end to read to)",
                      in, file_type_name(type)));
  }
  std::vector<std::string> out;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      if (auto files = hf_dataset_files(in)) {
        out.insert(out.end(), files->begin(), files->end());
        continue;
      }
      try {
        list_folder(in, output, own, tool_files, out);
      } catch (const fs::filesystem_error& e) {  // a link to itself, a folder that cannot be read
        throw DataError(
            fmt::format("{}: cannot list it: {}", e.path1().empty() ? in : e.path1().string(), e.code().message()));
      }
    } else if (fs::exists(in, ec)) {
      if (!output.empty() && is_output_or_temporary(in, output))
        throw UsageError(fmt::format("{}: is both an input and the output; writing it would replace the input", in));
      out.push_back(in);
    } else {
      throw DataError(fmt::format("{}: input not found", in));
    }
  }
  refuse_files_given_twice(out);
  return out;
}

namespace {

InputFormat format_of(const std::string& path, const DocumentOptions& options) {
  if (options.format != InputFormat::Auto) return options.format;
  // "c4-train.00000-of-01024.json.gz" is JSONL: the extension inside the compression's
  const auto ext = lowercase_extension(without_compression_extension(path));
  if (ext == ".jsonl" || ext == ".json" || ext == ".ndjson") return InputFormat::Jsonl;
  if (ext == ".parquet") return InputFormat::Parquet;
  if (ext == ".arrow" || ext == ".arrows" || ext == ".feather" || ext == ".ipc") return InputFormat::Arrow;
  return InputFormat::Text;
}

}  // namespace

void check_text_field_applies(const std::vector<std::string>& files, const DocumentOptions& options) {
  if (!options.text_field_given || files.empty() || !options.token_field.empty()) return;
  for (const auto& f : files)
    if (format_of(f, options) != InputFormat::Text) return;
  throw UsageError(fmt::format(
      "--text-field {}: every input is plain text ({} file{}, e.g. {}), where there is no field to read; it applies "
      "to JSONL, Parquet and Arrow inputs (--format jsonl reads other names as JSONL)",
      options.text_field, files.size(), files.size() == 1 ? "" : "s", files.front()));
}

void check_text_inputs_are_text(const std::vector<std::string>& files, const DocumentOptions& options) {
  constexpr size_t kLook = 64 << 10;
  for (const auto& f : files) {
    if (format_of(f, options) != InputFormat::Text) continue;
    std::string head;
    InputFile in(f);
    while (head.size() < kLook && in.read_some(head, kLook - head.size()) > 0) {
    }
    const size_t nul = head.find('\0');
    if (nul == std::string::npos) continue;
    // Windows' "Unicode" text: every other byte of ASCII is a NUL, and the byte order mark says so.
    if (head.starts_with("\xff\xfe") || head.starts_with("\xfe\xff")) {
      const char* order = head[0] == '\xff' ? "little-endian, FF FE" : "big-endian, FE FF";
      throw DataError(fmt::format(
          "{}: is UTF-16 text (its byte order mark says {}), and inputs are read as UTF-8: convert it first, e.g. "
          "iconv -f UTF-16 -t UTF-8 '{}' > NAME.txt (and leave the UTF-16 file out of the inputs)",
          f, order, f));
    }
    throw DataError(fmt::format(
        "{}: is not text: it holds a NUL byte (byte {}){}; inputs are read as text unless their name says JSONL, "
        "Parquet or Arrow (or --format does): leave it out of the inputs (move it out of the folder), or give its "
        "format",
        f, nul, is_hdf5_file(f) ? ", and is an HDF5 file (a prepared dataset?)" : ""));
  }
  // A folder of structured data with text files beside it is most often a download's card and notes (README.md,
  // LICENSE): warned, not refused, as a corpus may mix the two on purpose and docs/data.md reads other names as text.
  std::vector<std::string> text;
  size_t structured = 0;
  for (const auto& f : files) {
    if (format_of(f, options) == InputFormat::Text) text.push_back(f);
    else ++structured;
  }
  if (options.format != InputFormat::Auto || text.empty() || structured == 0) return;
  std::string named;
  for (size_t i = 0; i < std::min<size_t>(text.size(), 5); ++i) named += (i ? ", " : "") + text[i];
  if (text.size() > 5) named += fmt::format(" and {} more", text.size() - 5);
  log::warn(
      "{} file{} read as plain text (one training document each) among {} JSONL, Parquet or Arrow file{}: {}; if "
      "{} not training text (a dataset card, a README, a license), leave {} out: give the data files or their folder "
      "(-i DOWNLOAD/data), or move {} out of the input folder",
      text.size(), text.size() == 1 ? " is" : "s are", structured, structured == 1 ? "" : "s", named,
      text.size() == 1 ? "it is" : "they are", text.size() == 1 ? "it" : "them", text.size() == 1 ? "it" : "them");
}

namespace {

// A Parquet or Arrow file's text column, row by row; a null text is an error, as a missing JSONL field is.
template <typename File>
void for_each_column_document(const std::string& path, const std::string& column,
                              const std::function<void(std::string&& document)>& emit) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == 0 && !ec) throw DataError(fmt::format("{}: input file is empty", path));
  const auto file = File::open(path);
  const auto& text = file.string_column(column);
  int64_t row = 0;
  file.for_each_string(text, [&](std::optional<std::string_view> value) {
    if (!value)
      throw DataError(fmt::format("{}: row {}: column \"{}\" is null (every row needs a text)", path, row, column));
    ++row;
    emit(std::string(*value));
  });
  // A shard that a filter left empty (its schema, no rows) holds nothing to skip; said, as an empty text file is counted.
  if (row == 0) log::warn("{}: has no rows; it adds no documents", path);
}

// A pre-tokenized Arrow or Parquet file's id column, row by row, each row's ids checked against the vocabulary and
// packed 4 bytes each; a null row is an error, as a null text is.
template <typename File>
void for_each_file_ids(const std::string& path, const DocumentOptions& options,
                       const std::function<void(std::string&& packed)>& emit) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == 0 && !ec) throw DataError(fmt::format("{}: input file is empty", path));
  const auto file = File::open(path);
  const auto& column = file.id_list_column(options.token_field);
  int64_t row = 0;
  file.for_each_id_list(column, [&](std::optional<std::span<const int64_t>> ids) {
    if (!ids)
      throw DataError(
          fmt::format("{}: row {}: column \"{}\" is null (every row needs its ids)", path, row, options.token_field));
    std::string packed(ids->size() * sizeof(TokenId), '\0');
    for (size_t j = 0; j < ids->size(); ++j) {
      const int64_t id = (*ids)[j];
      if (id < 0 || id >= options.vocab_size)
        throw DataError(
            fmt::format("{}: row {}: id {} at position {} of column \"{}\" is outside the tokenizer's "
                        "vocabulary (0 to {})",
                        path, row, id, j, options.token_field, options.vocab_size - 1));
      const auto v = static_cast<TokenId>(id);
      std::memcpy(packed.data() + j * sizeof(TokenId), &v, sizeof(TokenId));
    }
    ++row;
    emit(std::move(packed));
  });
  if (row == 0) log::warn("{}: has no rows; it adds no documents", path);
}

// The bytes an Arrow or Parquet file's id column hands out: 4 per id its chunks or batches count.
template <typename File>
uint64_t ids_bytes_estimate(const std::string& path, const std::string& field) {
  const auto file = File::open(path);
  return sizeof(TokenId) * file.id_count_estimate(file.id_list_column(field));
}

}  // namespace

uint64_t document_bytes_estimate(const std::string& path, const DocumentOptions& options) {
  const InputFormat format = format_of(path, options);
  if (!options.token_field.empty()) {  // ids: an Arrow or Parquet column's count; text inputs are refused when read
    if (format == InputFormat::Arrow) return ids_bytes_estimate<ArrowIpcFile>(path, options.token_field);
    if (format == InputFormat::Parquet) return ids_bytes_estimate<ParquetFile>(path, options.token_field);
    return InputFile::estimate_size(path);
  }
  if (format == InputFormat::Parquet) {
    const auto file = ParquetFile::open(path);
    return file.uncompressed_bytes(file.string_column(options.text_field));
  }
  if (format == InputFormat::Arrow) {
    const auto file = ArrowIpcFile::open(path);
    return file.string_bytes_estimate(file.string_column(options.text_field));
  }
  return InputFile::estimate_size(path);
}

namespace {

// The value of the 4 hex digits at s[at], or -1.
int hex4(std::string_view s, size_t at) {
  if (at + 4 > s.size()) return -1;
  int v = 0;
  for (size_t i = at; i < at + 4; ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// `line` with each \uD800-\uDFFF escape that is not half of a surrogate pair written as \uFFFD.
std::string replace_lone_surrogates(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  bool in_string = false;
  for (size_t i = 0; i < line.size();) {
    const char c = line[i];
    if (c == '"') in_string = !in_string;
    if (!in_string || c != '\\') {
      out += c;
      ++i;
      continue;
    }
    const int v = i + 1 < line.size() && line[i + 1] == 'u' ? hex4(line, i + 2) : -1;
    if (v < 0xD800 || v > 0xDFFF) {  // any other escape, whole (\\ included, so that its second \ starts none)
      out.append(line.substr(i, v < 0 ? 2 : 6));
      i += v < 0 ? 2 : 6;
      continue;
    }
    const int low = v <= 0xDBFF && i + 7 < line.size() && line[i + 6] == '\\' && line[i + 7] == 'u' ? hex4(line, i + 8) : -1;
    if (low >= 0xDC00 && low <= 0xDFFF) {
      out.append(line.substr(i, 12));
      i += 12;
    } else {
      out += "\\ufffd";
      i += 6;
    }
  }
  return out;
}

// One JSONL line parsed. A lone UTF-16 surrogate escape ("\ud800", which Python's json writes from a string cut
// inside a pair, and reads) is U+FFFD, as Python's errors="replace" and JavaScript's TextEncoder make it; the line
// was refused as "not a JSON object". Invalid UTF-8 inside a string is named as such, with what to do.
nlohmann::json parse_jsonl_line(const std::string& bytes, const std::string& path, uint64_t line) {
  std::string replaced;
  for (int attempt = 0;; ++attempt) {
    try {
      return nlohmann::json::parse(attempt == 0 ? bytes : replaced);
    } catch (const nlohmann::json::parse_error& e) {
      const std::string_view what = e.what();
      if (attempt == 0 && what.find("surrogate") != std::string_view::npos) {
        replaced = replace_lone_surrogates(bytes);
        continue;
      }
      if (what.find("ill-formed UTF-8") != std::string_view::npos) {
        size_t at = 0;  // the first byte that starts no valid sequence
        for (char32_t cp = 0; at < bytes.size();) {
          const size_t n = detail::utf8_decode(bytes, at, cp);
          if (n == 0) break;
          at += n;
        }
        throw DataError(fmt::format(
            "{}:{}: invalid UTF-8 inside a JSON string (byte {} of the line, 0x{:02x}): JSON text must be UTF-8; convert "
            "the file (iconv -f LATIN1 -t UTF-8, if it is latin-1) or fix what wrote it (plain text inputs, --format "
            "text, keep such bytes as they are)",
            path, line, at + 1, at < bytes.size() ? static_cast<unsigned char>(bytes[at]) : 0));
      }
      throw DataError(fmt::format("{}:{}: not a JSON object ({})", path, line, e.what()));
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}:{}: not a JSON object ({})", path, line, e.what()));
    }
  }
}

}  // namespace

std::string document_text(RawDocument&& raw, const std::string& path, const DocumentOptions& options) {
  if (raw.line == 0) return std::move(raw.bytes);
  nlohmann::json j = parse_jsonl_line(raw.bytes, path, raw.line);
  if (!j.is_object())
    throw DataError(
        fmt::format("{}:{}: not a JSON object (a JSON {}; JSONL inputs need one object per line with a "
                    "\"{}\" string)",
                    path, raw.line, j.type_name(), options.text_field));
  if (!j.contains(options.text_field))
    throw DataError(
        fmt::format("{}:{}: field \"{}\" is missing (JSONL inputs need one object per line with a \"{}\" "
                    "string; --text-field picks another)",
                    path, raw.line, options.text_field, options.text_field));
  auto& field = j[options.text_field];
  if (!field.is_string())
    throw DataError(fmt::format("{}:{}: field \"{}\" is not a string", path, raw.line, options.text_field));
  return std::move(field.get_ref<std::string&>());
}

std::vector<TokenId> document_ids(RawDocument&& raw, const std::string& path, const DocumentOptions& options) {
  std::vector<TokenId> ids;
  if (raw.line == 0) {  // packed by for_each_arrow_ids, checked there
    ids.resize(raw.bytes.size() / sizeof(TokenId));
    std::memcpy(ids.data(), raw.bytes.data(), ids.size() * sizeof(TokenId));
    return ids;
  }
  nlohmann::json j = parse_jsonl_line(raw.bytes, path, raw.line);
  const std::string& field = options.token_field;
  if (!j.is_object())
    throw DataError(
        fmt::format("{}:{}: not a JSON object (a JSON {}; pre-tokenized JSONL needs one object per line "
                    "with a \"{}\" array of token ids)",
                    path, raw.line, j.type_name(), field));
  if (!j.contains(field))
    throw DataError(
        fmt::format("{}:{}: field \"{}\" is missing (pre-tokenized JSONL needs one object per line with "
                    "a \"{}\" array of token ids)",
                    path, raw.line, field, field));
  const auto& array = j[field];
  if (!array.is_array())
    throw DataError(fmt::format("{}:{}: field \"{}\" is not an array of token ids", path, raw.line, field));
  ids.reserve(array.size());
  for (size_t k = 0; k < array.size(); ++k) {
    const auto& v = array[k];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= options.vocab_size)
      throw DataError(
          fmt::format("{}:{}: value {} at position {} of \"{}\" is not a token id of the tokenizer's "
                      "vocabulary (0 to {})",
                      path, raw.line, v.dump(), k, field, options.vocab_size - 1));
    ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
  }
  return ids;
}

namespace {

// A text document handed out in pieces as it is read (DocumentOptions::piece_bytes): `text` is what is held; each
// time it passes piece_bytes, the part before its last safe cut goes out. Without a tokenizer it only collects.
class DocumentPieces {
 public:
  DocumentPieces(const std::string& path, const DocumentOptions& options,
                 const std::function<void(RawDocument&& document)>& emit)
      : path_(path), options_(options), emit_(emit) {}

  std::string text;

  // Whether the document has begun: text held, or pieces of it handed out already (all of it, when a stretch with no
  // character boundary was cut at its end).
  bool begun() const { return !text.empty() || started_; }

  void cut_when_full() {
    if (options_.piece_bytes == 0 || !options_.tokenizer) return;
    while (text.size() >= options_.piece_bytes) {
      const size_t from = scanned_ >= 4 ? scanned_ - 4 : 0;  // the places before were looked at already
      size_t at = options_.tokenizer->last_safe_cut(std::string_view(text).substr(from));
      if (at > 0) {
        at += from;
      } else if (text.size() >= std::max(options_.max_piece_bytes, options_.piece_bytes)) {
        // Before the last character (it may be cut short by the reading), never inside a UTF-8 sequence.
        at = text.size() - 1;
        while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
        if (at == 0) at = text.size();
        // A tokenizer with no such place at all is said once a run by prepare-data, not blamed on each document.
        if (!warned_ && options_.tokenizer->has_safe_cuts())
          log::warn(
              "{}: no place to cut the document exactly (an ASCII letter after a space or newline) in the {} bytes "
              "from byte {}; cut at a character boundary instead, where its tokens may differ from the whole "
              "text's (said once a document)",
              path_, text.size(), offset_);
        warned_ = true;
      } else {
        scanned_ = text.size();
        return;
      }
      emit_({text.substr(0, at), 0, started_});
      text.erase(0, at);
      offset_ += at;
      started_ = true;
      scanned_ = 0;
    }
  }

  // The rest of the document (none when nothing is held), and the next starts anew.
  void finish() {
    if (!text.empty()) emit_({std::move(text), 0, started_});
    text = std::string();
    started_ = warned_ = false;
    offset_ = scanned_ = 0;
  }

 private:
  const std::string& path_;
  const DocumentOptions& options_;
  const std::function<void(RawDocument&& document)>& emit_;
  bool started_ = false, warned_ = false;
  uint64_t offset_ = 0;  // of text in the document
  size_t scanned_ = 0;   // of text, looked at for a cut
};

}  // namespace

void for_each_document(const std::string& path, const DocumentOptions& options,
                       const std::function<void(std::string&& document)>& emit) {
  for_each_raw_document(path, options, [&](RawDocument&& raw) { emit(document_text(std::move(raw), path, options)); });
}

void for_each_raw_document(const std::string& path, const DocumentOptions& options,
                           const std::function<void(RawDocument&& document)>& emit) {
  const InputFormat format = format_of(path, options);
  if (format == InputFormat::Parquet || format == InputFormat::Arrow) {
    const auto as_raw = [&](std::string&& text) { emit({std::move(text), 0}); };
    if (!options.token_field.empty()) {
      if (format == InputFormat::Arrow) return for_each_file_ids<ArrowIpcFile>(path, options, as_raw);
      return for_each_file_ids<ParquetFile>(path, options, as_raw);
    }
    if (format == InputFormat::Parquet) for_each_column_document<ParquetFile>(path, options.text_field, as_raw);
    else for_each_column_document<ArrowIpcFile>(path, options.text_field, as_raw);
    return;
  }
  if (!options.token_field.empty() && format != InputFormat::Jsonl)
    throw DataError(fmt::format("{}: --token-field reads JSONL, Arrow and Parquet inputs, and this is text", path));
  InputFile in(path);
  if (in.empty()) {
    // An empty text file is an empty document, skipped and counted as such; a JSONL file holds no line to read.
    if (format != InputFormat::Text) throw DataError(fmt::format("{}: input file is empty", path));
    emit({std::string(), 0});
    return;
  }
  if (format == InputFormat::Text && options.split == DocumentSplit::PerFile) {  // the file is the document
    if (options.piece_bytes == 0 || !options.tokenizer) {
      emit({in.read_all(), 0});
      return;
    }
    DocumentPieces pieces(path, options, emit);
    while (in.read_some(pieces.text, options.piece_bytes) > 0) pieces.cut_when_full();
    pieces.finish();
    return;
  }
  std::string line;
  if (format == InputFormat::Jsonl) {
    uint64_t lineno = 0, found = 0;
    while (in.read_line(line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++found;
      emit({std::move(line), lineno});
      line = std::string();
    }
    if (found == 0) throw DataError(fmt::format("{}: no JSON lines found", path));
  } else {
    // Blocks separated by lines that are empty or only whitespace; the block's own newlines are kept, also after a
    // piece that took all the text held (1 MiB of bytes with no character boundary: the newline was dropped).
    DocumentPieces block(path, options, emit);
    while (in.read_line(line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        block.finish();
      } else {
        if (block.begun()) block.text.push_back('\n');
        block.text.append(line);
        block.cut_when_full();
      }
    }
    block.finish();
  }
}

std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& options) {
  std::vector<std::string> docs;
  for_each_document(path, options, [&](std::string&& d) { docs.push_back(std::move(d)); });
  return docs;
}

}  // namespace shardtrain::data
