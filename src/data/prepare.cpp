// Dataset preparation (prepare.hpp): read the inputs (documents.cpp) on a thread of their own, tokenize the
// documents on all cores (one Encoder per thread, documents handed out in chunks) while the next batch is read,
// write the HDF5 file.
#include "shardtrain/data/prepare.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/output_file.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "thread_pool.hpp"

namespace shardtrain::data {

namespace {

// Documents as read (JSONL lines not yet parsed), with the file each came from.
struct Batch {
  std::vector<RawDocument> docs;
  std::vector<uint32_t> file;
  size_t bytes = 0;          // of the raw documents
  size_t empty_skipped = 0;  // empty text files and blank-line blocks met while reading it
  uint64_t beyond = 0;       // what the files' progress estimates counted beyond their reading, for the bar
};

// Batches from the reading thread to the tokenizing one. At most one waits, so memory holds three (one being
// read, one waiting, one being tokenized). The end comes after every batch pushed before it, and so does the
// reading's error: a bad document in an earlier batch is still the error reported, as reading and tokenizing
// one after the other would have found it.
class BatchQueue {
 public:
  // The reading side; false when the tokenizing side has stopped (it failed), so the reading stops too.
  bool push(Batch&& batch) {
    std::unique_lock lock(mutex_);
    space_.wait(lock, [&] { return waiting_.empty() || stopped_; });
    if (stopped_) return false;
    waiting_.push_back(std::move(batch));
    ready_.notify_one();
    return true;
  }
  void finish(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
    ready_.notify_one();
  }
  // The tokenizing side: the next batch, or false at the end; the reading's error is thrown in its place.
  bool pop(Batch& out) {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [&] { return !waiting_.empty() || done_; });
    if (!waiting_.empty()) {
      out = std::move(waiting_.front());
      waiting_.pop_front();
      space_.notify_one();
      return true;
    }
    if (error_) std::rethrow_exception(error_);
    return false;
  }
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    space_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable space_, ready_;
  std::deque<Batch> waiting_;
  bool done_ = false, stopped_ = false;
  std::exception_ptr error_;
};

// Turns a batch into ids on `encoders.size()` threads (documents handed out 16 at a time in order): each
// document's text (a JSONL line parsed here, off the reading thread), its byte count, and its ids; an empty
// text gets no ids and skipped[d] = 1. Pre-tokenized documents (options.token_field) give their ids instead.
// Of the documents that fail, the first in order is the error thrown, as a single thread would have found it:
// after a failure no thread takes a new chunk, and every chunk before the failing one was taken already.
void tokenize_batch(Batch& batch, const std::vector<std::string>& files, const DocumentOptions& options,
                    std::vector<std::unique_ptr<Encoder>>& encoders, std::vector<std::vector<TokenId>>& ids,
                    std::vector<uint8_t>& skipped, std::vector<size_t>& text_bytes) {
  const size_t n = batch.docs.size();
  ids.assign(n, {});
  skipped.assign(n, 0);
  text_bytes.assign(n, 0);
  std::atomic<size_t> cursor{0};
  std::atomic<bool> failed{false};
  std::vector<std::pair<size_t, std::exception_ptr>> errors(encoders.size(), {n, nullptr});
  // Small documents 16 at a time; pieces of a large one (a batch of few, large documents) one at a time, so that
  // every thread gets some.
  const size_t chunk = std::clamp<size_t>(n / (4 * encoders.size()), 1, 16);
  run_on_threads(encoders.size(), [&](size_t t) {
    size_t d = 0;
    try {
      for (size_t begin; !failed && (begin = cursor.fetch_add(chunk)) < n;) {
        for (d = begin; d < std::min(n, begin + chunk); ++d) {
          if (!options.token_field.empty()) {  // already tokenized: the ids as they are
            ids[d] = document_ids(std::move(batch.docs[d]), files[batch.file[d]], options);
            skipped[d] = ids[d].empty();
            continue;
          }
          const auto start = batch.docs[d].continues ? TextStart::Continuation : TextStart::Document;
          const std::string text = document_text(std::move(batch.docs[d]), files[batch.file[d]], options);
          text_bytes[d] = text.size();
          if (text.empty()) skipped[d] = 1;
          else ids[d] = encoders[t]->encode(text, SpecialTokenMode::AsText, start);
        }
      }
    } catch (...) {
      errors[t] = {d, std::current_exception()};
      failed = true;
    }
  });
  const auto first =
      std::min_element(errors.begin(), errors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  if (first->second) std::rethrow_exception(first->second);
}

// A write of the temporary token file that failed, with the file system's reason (ENOSPC, EDQUOT, EFBIG, EIO...), as
// exit code 8 promises; it said "(disk full?)" of every failure.
IoError token_file_failed(const std::string& path, int err) {
  return IoError(fmt::format("{}: cannot write the temporary token file: {}", path,
                             err != 0 ? std::strerror(err) : "the system gave no reason"));
}

// The files Tokenizer::load reads for `tokenizer`: the file, or those of its folder (tokenizer.json, or GPT-2's
// encoder.json and vocab.bpe).
std::vector<std::string> tokenizer_files(const std::string& tokenizer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(tokenizer, ec)) return {tokenizer};
  std::vector<std::string> files;
  for (const char* name : {"tokenizer.json", "encoder.json", "vocab.bpe"})
    if (const fs::path p = fs::path(tokenizer) / name; fs::exists(p, ec)) files.push_back(p.string());
  return files;
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& options) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  if (options.inputs.empty()) throw UsageError("prepare-data: no --input given");
  check_output_path(options.output, options.existing, "prepare-data");
  sweep_dead_output_temporaries(options.output);  // what a killed (SIGKILL) preparation of it left: its tokens
  // Written so that NaN fails too.
  if (!(options.validation_fraction >= 0 && options.validation_fraction < 1))
    throw UsageError(fmt::format("--validation-fraction {} is outside [0, 1)", options.validation_fraction));
  const int threads = resolve_thread_count(options.threads);
  // The tokenizer is read, never written: `-t tok.json -o tok.json --overwrite` replaced it with the dataset, exit 0.
  const ToolFiles tokenizer_own{tokenizer_files(options.tokenizer), "the tokenizer (--tokenizer)"};
  for (const auto& f : tokenizer_own.files)
    if (is_output_or_temporary(f, options.output))
      throw UsageError(
          fmt::format("{}: is the tokenizer (--tokenizer {}) and the output; writing the dataset would replace it, "
                      "--overwrite or not (give another --output)",
                      options.output, options.tokenizer));
  // First: an input that is the output is a UsageError. An earlier dataset at the output's name inside an input folder
  // is left out, and replaced.
  // The tokenizer's own files are left out of an input folder as the output is: a tiktoken file there was tokenized.
  const auto files =
      expand_inputs(options.inputs, options.output, {is_hdf5_file, "a dataset (an HDF5 file)"}, tokenizer_own);
  check_text_field_applies(files, options.documents);
  check_text_inputs_are_text(files, options.documents);
  const Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
  DocumentOptions documents = options.documents;
  documents.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  // A large text document goes in pieces of a sixteenth of a batch, so that memory holds batches, not documents
  // (a 433 MB file took 1.7 GB whole); a stretch without a place to cut it exactly is cut at a batch's size.
  if (documents.token_field.empty()) {
    documents.tokenizer = &tokenizer;
    documents.piece_bytes = std::clamp<size_t>(options.batch_bytes / 16, size_t{4} << 10, size_t{4} << 20);
    documents.max_piece_bytes = std::max(options.batch_bytes, 4 * documents.piece_bytes);
  }

  // What the dataset records, stored in memory first: a metadata HDF5 cannot hold fails here, not after the work.
  DatasetInfo info = dataset_info_for(tokenizer);
  info.sources = files;
  info.validation_fraction = options.validation_fraction;
  info.split_seed = options.seed;
  info.split_by = options.split_by;
  check_dataset_metadata_fits(options.output, info);

  PrepareSummary summary;
  summary.files = files.size();
  // The progress bar counts what the reading hands out: a Parquet file's text column, the others' bytes.
  std::vector<uint64_t> file_estimate(files.size());
  uint64_t total_estimate = 0;
  for (size_t i = 0; i < files.size(); ++i)
    total_estimate += file_estimate[i] = document_bytes_estimate(files[i], documents);

  // Pass 1: documents read in batches of about batch_bytes on a thread of their own, tokenized on all cores,
  // their ids appended to a temporary file beside the output (removed however this ends) and their lengths to
  // the offsets.
  const std::string tokens_tmp_path = output_temporary(options.output, "tokens-tmp");
  const TemporaryOutput remove_tmp(tokens_tmp_path);
  std::ofstream tokens_tmp(tokens_tmp_path, std::ios::binary | std::ios::trunc);
  if (!tokens_tmp)
    throw IoError(fmt::format("{}: cannot create the temporary token file: {}", tokens_tmp_path, std::strerror(errno)));
  summary.threads = threads;
  std::vector<std::unique_ptr<Encoder>> encoders;  // kept across batches: their piece caches stay warm
  for (int t = 0; t < threads; ++t) encoders.push_back(std::make_unique<Encoder>(tokenizer));
  std::vector<int64_t> offsets{0};
  std::vector<std::vector<TokenId>> ids;
  std::vector<uint8_t> skipped;
  std::vector<size_t> text_bytes;
  // Pieces of documents cut by a tokenizer without safe cuts, at character boundaries, for one warning.
  size_t inexact_cuts = 0, cut_documents = 0, last_cut_document = 0;
  {
    ProgressBar bar({.label = documents.token_field.empty() ? "tokenize" : "import",
                     .total = total_estimate,
                     .unit = "MB",
                     .unit_scale = 1e-6,
                     .style = options.progress});
    // The reading thread: batches of about batch_bytes, handed over as they fill, so that the next batch is read
    // while the last is tokenized (on a node of many cores the serial reading would otherwise add to the time).
    BatchQueue queue;
    struct Stopped {};
    std::thread reader = start_thread("the reading thread", [&] {
      Batch batch;
      std::exception_ptr error;
      try {
        const auto hand_over = [&] {
          if (!queue.push(std::move(batch))) throw Stopped{};
          batch = Batch();
        };
        for (size_t i = 0; i < files.size(); ++i) {
          uint64_t read = 0;
          for_each_raw_document(files[i], documents, [&](RawDocument&& d) {
            if (d.bytes.empty()) {  // an empty text file or blank-line block; an empty JSONL text is found later
              ++batch.empty_skipped;
              return;
            }
            read += d.bytes.size();
            batch.bytes += d.bytes.size();
            batch.docs.push_back(std::move(d));
            batch.file.push_back(static_cast<uint32_t>(i));
            if (batch.bytes >= options.batch_bytes) hand_over();
          });
          batch.beyond += file_estimate[i] > read ? file_estimate[i] - read : 0;
        }
        hand_over();
      } catch (const Stopped&) {
        queue.finish(nullptr);
        return;
      } catch (...) {
        error = std::current_exception();
      }
      // The documents read before a reading error are tokenized first: a bad one among them is the error.
      if (error && !batch.docs.empty()) queue.push(std::move(batch));
      queue.finish(std::move(error));
    });
    struct JoinReader {  // however the tokenizing ends, the reading stops and its thread is joined
      BatchQueue& queue;
      std::thread& reader;
      ~JoinReader() {
        queue.stop();
        reader.join();
      }
    } join_reader{queue, reader};

    for (Batch batch; queue.pop(batch);) {
      summary.empty_documents_skipped += batch.empty_skipped;
      if (!batch.docs.empty()) {
        const auto t1 = std::chrono::steady_clock::now();
        tokenize_batch(batch, files, documents, encoders, ids, skipped, text_bytes);
        summary.tokenize_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      } else {
        ids.clear();
      }
      for (size_t d = 0; d < ids.size(); ++d) {
        summary.bytes += text_bytes[d];
        if (skipped[d]) {
          ++summary.empty_documents_skipped;
          continue;
        }
        errno = 0;
        tokens_tmp.write(reinterpret_cast<const char*>(ids[d].data()),
                         static_cast<std::streamsize>(ids[d].size() * sizeof(TokenId)));
        if (!tokens_tmp) throw token_file_failed(tokens_tmp_path, errno);
        const auto size = static_cast<int64_t>(ids[d].size());
        if (batch.docs[d].continues && offsets.size() > 1) offsets.back() += size;  // a piece of the one before
        else offsets.push_back(offsets.back() + size);
        if (batch.docs[d].continues && documents.tokenizer && !tokenizer.has_safe_cuts()) {
          cut_documents += offsets.size() - 1 != last_cut_document;
          last_cut_document = offsets.size() - 1;
          ++inexact_cuts;
        }
      }
      bar.advance(batch.bytes + batch.beyond);
    }
    bar.finish();
  }
  if (inexact_cuts > 0)
    log::warn(
        "prepare-data: tokenizer {} has no place where a long document can be cut with its tokens kept (its split "
        "pattern may join the text across any space or newline, it has none, or it has added tokens that are not "
        "special: Tokenizer::last_safe_cut finds no place); {} document(s) longer than a piece were cut {} time(s) at "
        "character boundaries, where their tokens may differ from the whole text's (a few tokens at each cut); a "
        "larger --batch-mb cuts less often",
        tokenizer.name(), cut_documents, inexact_cuts);
  if (offsets.size() == 1)
    throw DataError(fmt::format("prepare-data: the inputs hold no non-empty document ({} empty skipped; {} file{}: {}{})",
                                summary.empty_documents_skipped, files.size(), files.size() == 1 ? "" : "s", files.front(),
                                files.size() > 1 ? ", ..." : ""));
  errno = 0;
  tokens_tmp.close();
  if (!tokens_tmp) throw token_file_failed(tokens_tmp_path, errno);

  // Pass 2: the dataset, its tokens read back from the temporary file piece by piece.
  const size_t docs = offsets.size() - 1, num_tokens = static_cast<size_t>(offsets.back());
  if (!info.eot_id)
    log::warn("prepare-data: tokenizer {} has no end-of-text token; the packed layout will refuse this dataset",
              tokenizer.name());
  std::ifstream back(tokens_tmp_path, std::ios::binary);
  summary.validation_documents = write_dataset(
      options.output, num_tokens,
      [&](size_t, std::span<TokenId> out) {
        back.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size_bytes()));
        if (!back) throw IoError(fmt::format("{}: cannot read back the temporary token file", tokens_tmp_path));
      },
      offsets, info, options.existing);

  summary.documents = docs;
  summary.tokens = num_tokens;
  summary.train_documents = docs - summary.validation_documents;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace shardtrain::data
