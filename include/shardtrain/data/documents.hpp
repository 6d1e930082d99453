// Reading documents from input files: plain text (one document per file, or per blank-line-separated
// block) and JSONL with a text field (the fineweb layout). Shared by prepare-data and the BPE trainer.
#pragma once

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

// The documents of one file, in order. Throws DataError naming the file (and line for JSONL) when the
// file is missing or empty, a JSONL line is not JSON, or the text field is missing or not a string.
std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& options);

// Expands folders into their regular files (sorted, recursively); files are kept in the given order.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

}  // namespace shardtrain::data
