// Document reading (documents.hpp) and dataset preparation (prepare.hpp): read the inputs, tokenize the
// documents on all cores (one Encoder per thread, documents handed out in chunks), write the HDF5 file.
#include "shardtrain/data/prepare.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "tokenizer_model.hpp"

namespace shardtrain::data {

InputFormat parse_input_format(const std::string& s) {
  if (s == "auto") return InputFormat::Auto;
  if (s == "text" || s == "txt") return InputFormat::Text;
  if (s == "jsonl" || s == "json") return InputFormat::Jsonl;
  throw UsageError(fmt::format("unknown input format '{}': expected auto, text or jsonl", s));
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in, fs::directory_options::follow_directory_symlink))
        if (e.is_regular_file()) found.push_back(e.path().string());
      if (found.empty()) throw DataError(fmt::format("{}: folder has no files", in));
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      out.push_back(in);
    } else {
      throw DataError(fmt::format("{}: input not found", in));
    }
  }
  return out;
}

std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& options) {
  const std::string text = detail::read_file(path);
  if (text.empty()) throw DataError(fmt::format("{}: input file is empty", path));
  InputFormat format = options.format;
  if (format == InputFormat::Auto) {
    const auto ext = std::filesystem::path(path).extension().string();
    format = ext == ".jsonl" || ext == ".json" || ext == ".ndjson" ? InputFormat::Jsonl : InputFormat::Text;
  }
  std::vector<std::string> docs;
  if (format == InputFormat::Jsonl) {
    std::istringstream in(text);
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw DataError(fmt::format("{}:{}: not a JSON object ({})", path, lineno, e.what()));
      }
      if (!j.is_object() || !j.contains(options.text_field))
        throw DataError(fmt::format("{}:{}: field \"{}\" is missing (JSONL inputs need one object per line with a \"{}\" "
                                    "string; --text-field picks another)",
                                    path, lineno, options.text_field, options.text_field));
      if (!j[options.text_field].is_string())
        throw DataError(fmt::format("{}:{}: field \"{}\" is not a string", path, lineno, options.text_field));
      docs.push_back(j[options.text_field].get<std::string>());
    }
    if (docs.empty()) throw DataError(fmt::format("{}: no JSON lines found", path));
  } else if (options.split == DocumentSplit::BlankLines) {
    // Blocks separated by lines that are empty or only whitespace; the block's own newlines are kept.
    std::string block;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      const std::string_view line(text.data() + pos, end - pos);
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
        if (!block.empty()) docs.push_back(std::move(block));
        block.clear();
      } else {
        if (!block.empty()) block.push_back('\n');
        block.append(line);
      }
      pos = end + 1;
    }
    if (!block.empty()) docs.push_back(std::move(block));
  } else {
    docs.push_back(text);
  }
  return docs;
}

PrepareSummary prepare_dataset(const PrepareOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  if (options.inputs.empty()) throw UsageError("prepare-data: no --input given");
  if (options.validation_fraction < 0 || options.validation_fraction >= 1)
    throw UsageError(fmt::format("--validation-fraction {} is outside [0, 1)", options.validation_fraction));
  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
  const auto files = expand_inputs(options.inputs);

  PrepareSummary summary;
  summary.files = files.size();
  std::vector<std::string> docs;
  for (const auto& f : files) {
    for (auto& d : read_documents(f, options.documents)) {
      if (d.empty()) {
        ++summary.empty_documents_skipped;
        continue;
      }
      summary.bytes += d.size();
      docs.push_back(std::move(d));
    }
  }
  if (docs.empty()) throw DataError("prepare-data: the inputs hold no non-empty document");

  // Tokenize: documents in chunks of 16 from a shared cursor; each thread has its own Encoder.
  const auto t1 = std::chrono::steady_clock::now();
  const int threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::vector<TokenId>> ids(docs.size());
  std::atomic<size_t> cursor{0};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  {
    ProgressBar bar({.label = "tokenize", .total = summary.bytes, .unit = "MB", .unit_scale = 1e-6, .style = options.progress});
    std::vector<std::thread> pool;
    constexpr size_t chunk = 16;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          Encoder enc(tokenizer);
          for (size_t begin; (begin = cursor.fetch_add(chunk)) < docs.size();) {
            uint64_t done = 0;
            for (size_t d = begin; d < std::min(docs.size(), begin + chunk); ++d) {
              ids[d] = enc.encode(docs[d]);
              done += docs[d].size();
            }
            bar.advance(done);
          }
        } catch (...) {
          errors[static_cast<size_t>(t)] = std::current_exception();
        }
      });
    }
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    bar.finish();
  }
  summary.tokenize_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();

  std::vector<int64_t> offsets(docs.size() + 1, 0);
  for (size_t d = 0; d < docs.size(); ++d) offsets[d + 1] = offsets[d] + static_cast<int64_t>(ids[d].size());
  std::vector<TokenId> tokens;
  tokens.reserve(static_cast<size_t>(offsets.back()));
  for (auto& v : ids) {
    tokens.insert(tokens.end(), v.begin(), v.end());
    std::vector<TokenId>().swap(v);
  }
  DatasetInfo info = dataset_info_for(tokenizer);
  info.sources = files;
  info.validation_fraction = options.validation_fraction;
  info.split_seed = options.seed;
  if (!info.eot_id) log::warn("prepare-data: tokenizer {} has no end-of-text token; the packed layout will refuse this dataset",
                              tokenizer.name());
  if (const auto dir = std::filesystem::path(options.output).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir);
  write_dataset(options.output, tokens, offsets, info);

  summary.documents = docs.size();
  summary.tokens = tokens.size();
  summary.validation_documents = choose_validation_documents(docs.size(), options.validation_fraction, options.seed).size();
  summary.train_documents = docs.size() - summary.validation_documents;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace shardtrain::data
