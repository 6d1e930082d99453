// Reading documents from input files: plain text (one document per file, or per blank-line-separated
// block), JSONL with a text field, Parquet with a text column (the layout the Hugging Face Hub serves
// fineweb in), and Arrow IPC with a text column (what the `datasets` library saves). Shared by prepare-data
// and the BPE trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardtrain/data/tokenizer.hpp"

namespace shardtrain::data {

// Auto: *.jsonl / *.json / *.ndjson are JSONL, *.parquet Parquet, *.arrow / *.arrows / *.feather / *.ipc
// Arrow IPC, the rest text.
enum class InputFormat { Auto, Text, Jsonl, Parquet, Arrow };
enum class DocumentSplit { PerFile, BlankLines };  // for text inputs

InputFormat parse_input_format(const std::string& s);  // auto|text|jsonl|parquet|arrow, throws UsageError

// The most threads prepare-data and tokenizer train start: a larger --threads is cut to it. Above the cores of any
// node, and below what the system's thread limits refuse (--threads 65536 could not start).
inline constexpr int kMaxThreads = 1024;

struct DocumentOptions {
  InputFormat format = InputFormat::Auto;
  DocumentSplit split = DocumentSplit::PerFile;
  std::string text_field = "text";  // JSONL field, or Parquet / Arrow column ("meta.text" inside a struct)
  bool text_field_given = false;    // named on the command line: an input must be one it applies to
  // Inputs already tokenized: a JSONL field, or Arrow or Parquet column, holding each document's token ids (a list of
  // integers), imported as they are instead of tokenizing text_field. Empty: the inputs are text.
  std::string token_field;
  int64_t vocab_size = 0;  // with token_field: every id must be below it
  // Text documents (a per-file one, a blank-line block) longer than piece_bytes are handed out in pieces of about
  // that size (RawDocument::continues), each cut at `tokenizer`'s last_safe_cut, so that the pieces' tokens are the
  // whole document's and memory holds a piece, not the document. A stretch of max_piece_bytes with no such place
  // (no letter after a space or newline: binary data, a run of digits or of another script) is cut there anyway,
  // at a character boundary, where its tokens may differ from the whole's. 0 or no tokenizer: documents whole.
  // A single line of a blank-line document is still read whole.
  size_t piece_bytes = 0;
  size_t max_piece_bytes = 0;
  const Tokenizer* tokenizer = nullptr;
};

// The documents of one file, in order, handed to `emit` as they are read: JSONL and blank-line text are read
// line by line, so a file of any size costs one document's memory (per-file text is one document: the file).
// Parquet files are read a page at a time. Throws DataError naming the file (and line for JSONL, row for
// Parquet and Arrow) when the file is missing or empty, a JSONL line is not JSON, the text field is missing or
// not a string, a Parquet or Arrow text is null, or such a file cannot be read. Arrow files are read a record
// batch at a time.
void for_each_document(const std::string& path, const DocumentOptions& options,
                       const std::function<void(std::string&& document)>& emit);
// The same, collected.
std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& options);
// What the reading hands out before the work any thread can do: a JSONL line still to parse (`line`, its
// number, > 0), or the document itself (`line` 0). prepare-data parses JSONL on its tokenizing threads, so that
// its reading is not held to one core's JSON parsing (155 MB/s here; finding the lines: 6.8 GB/s).
struct RawDocument {
  std::string bytes;
  uint64_t line = 0;
  bool continues = false;  // the next piece of the document before it (DocumentOptions::piece_bytes)
};
void for_each_raw_document(const std::string& path, const DocumentOptions& options,
                           const std::function<void(RawDocument&& document)>& emit);
// The document of a raw one: a JSONL line's text field (DataError naming path:line as for_each_document
// would), else its bytes.
std::string document_text(RawDocument&& raw, const std::string& path, const DocumentOptions& options);
// With token_field: the token ids of a raw document. A JSONL line's field must be an array of integers in
// [0, vocab_size) (DataError naming path:line otherwise); an Arrow or Parquet row was checked as it was read, and its ids
// come packed in `bytes`, 4 bytes each.
std::vector<TokenId> document_ids(RawDocument&& raw, const std::string& path, const DocumentOptions& options);
// About how many bytes the reading of the file hands out, known before reading it (for a progress bar): the
// file's size (decompressed, where the format records it), or for Parquet and Arrow what their text column
// decompresses to (with token_field: 4 bytes per id of an Arrow or Parquet column, as its rows are handed out).
uint64_t document_bytes_estimate(const std::string& path, const DocumentOptions& options);

// Expands folders into their regular files (sorted, recursively), leaving out hidden files and folders (a
// name starting with '.': .gitattributes, the .cache/ that a Hub download leaves beside the files); files
// named themselves are kept, in the given order. A folder written by `datasets`' save_to_disk stands for the
// Arrow files its state.json lists, in that order (plain file names of *.arrow files in the folder, each once;
// anything else is a DataError naming state.json and the entry); a DatasetDict's folder and a folder of the
// `datasets` cache are DataErrors that say what to give instead. A folder reached twice (a symbolic link loop, or
// two links to one folder) is a DataError naming the link, as is a folder that cannot be listed.
// `output`, when given, is the file the inputs are for: a folder's listing leaves its temporaries out
// (is_output_or_temporary), and the output itself where `own` says the file there is what the tool writes (its earlier
// output, which this run replaces: a dataset read back as a text document once). Any other file of an input folder at
// the output's name is an input the output would destroy, and naming the output as an input is one too: UsageErrors.
// `tool_files` (prepare-data's tokenizer file, or the files of its folder) are left out of a folder's listing too,
// with a note, compared by device and inode: a tiktoken file kept beside the corpus was 99.7% of a dataset.
// A symbolic link in a folder that leads nowhere (a Hugging Face cache snapshot whose blob is missing) is a DataError
// naming it, as naming it directly is: it was left out without a word, and its shard with it.
struct OwnOutput {
  std::function<bool(const std::string& file)> holds;  // the file is what the tool writes
  std::string_view kind;                               // what that is, for the message ("a prepared dataset")
};
struct ToolFiles {
  std::vector<std::string> files;  // read by the tool, never inputs
  std::string_view what;           // for the note ("the tokenizer (--tokenizer)")
};
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, const std::string& output = {},
                                       const OwnOutput& own = {}, const ToolFiles& tool_files = {});

// Every input read as text (format_of: no JSONL, Parquet or Arrow name, or --format text) must be text: one holding a
// NUL byte in its first 64 KiB (decompressed) is a DataError naming it, before any is read in full. A binary file in
// an input folder (an HDF5 dataset of an earlier run, an image) was tokenized as text without a word. Files read as
// text among JSONL, Parquet or Arrow ones (a Hub download's README.md beside data/*.jsonl) are named in a warning, with
// how to leave them out: each would be a training document.
void check_text_inputs_are_text(const std::vector<std::string>& files, const DocumentOptions& options);

// A --text-field given where every input is plain text (it would be ignored): UsageError naming it and an input.
void check_text_field_applies(const std::vector<std::string>& files, const DocumentOptions& options);

}  // namespace shardtrain::data
