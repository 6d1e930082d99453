// Reading documents from input files: plain text (one document per file, or per blank-line-separated
// block) and JSONL with a text field (the fineweb layout). Shared by prepare-data and the BPE trainer.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace shardtrain::data {

enum class InputFormat { Auto, Text, Jsonl };          // Auto: *.jsonl / *.json are JSONL, the rest text
enum class DocumentSplit { PerFile, BlankLines };      // for text inputs

InputFormat parse_input_format(const std::string& s);  // auto|text|jsonl, throws UsageError

struct DocumentOptions {
  InputFormat format = InputFormat::Auto;
  DocumentSplit split = DocumentSplit::PerFile;
  std::string text_field = "text";
};

// The documents of one file, in order, handed to `emit` as they are read: JSONL and blank-line text are read
// line by line, so a file of any size costs one document's memory (per-file text is one document: the file).
// Throws DataError naming the file (and line for JSONL) when the file is missing or empty, a JSONL line is not
// JSON, or the text field is missing or not a string.
void for_each_document(const std::string& path, const DocumentOptions& options,
                       const std::function<void(std::string&& document)>& emit);
// The same, collected.
std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& options);

// Expands folders into their regular files (sorted, recursively); files are kept in the given order.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

}  // namespace shardtrain::data
