// The outputs of the offline data tools (prepare-data's dataset, tokenizer train's tokenizer.json): checked before
// any work, so that a bad name costs no tokenization, and written through a temporary beside them that is renamed
// into place, so that nothing existing is lost to a half-written file.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "shardtrain/runtime/temporaries.hpp"

namespace shardtrain::data {

// What happens when the output exists: replace it (--overwrite), or refuse (UsageError naming it, nothing written over).
enum class ExistingOutput { Replace, Refuse };

// A UsageError naming `output` when it cannot be written as asked: an empty name, a folder (replaced by nothing,
// --overwrite or not), an existing file under Refuse, or a folder that does not exist (the tools make none).
// `command` ("prepare-data") names the tool in the message.
void check_output_path(const std::string& output, ExistingOutput existing, std::string_view command);

// The temporary a writer of `output` in this process uses: OUTPUT.KIND-HOST-PID (KIND "tmp": the file being written;
// "tokens-tmp": prepare-data's token file).
std::string output_temporary(const std::string& output, std::string_view kind = "tmp");
// Removes the temporaries of `output` that a killed writer of this host left (SIGKILL: the out-of-memory killer),
// with a warning for each: sweep_dead_temporaries.
void sweep_dead_output_temporaries(const std::string& output);

// Whether `path` is `output` itself or one of the temporaries a writer of it makes (OUTPUT.tmp-N or
// OUTPUT.tokens-tmp-N, with or without the host before N, of any process, a killed one's included), wherever the two
// names point (symbolic links and relative paths resolved). An input folder's listing leaves them out: an output written inside its input folder is
// not read back as text on the next run.
bool is_output_or_temporary(const std::filesystem::path& path, const std::string& output);

// Whether `path` is an HDF5 file: the format's signature at byte 0, 512, 1024, 2048, ... (after a user block).
bool is_hdf5_file(const std::string& path);

// Flushes a file, or a folder's entries, to disk; IoError naming it.
void fsync_path(const std::string& path);

// Renames the finished `tmp` to `path`. Refuse never replaces a file, not even one that appeared since the start (an
// atomic no-replace rename where the file system has one; otherwise checked just before): a UsageError saying
// `refusal` ("a dataset is not replaced unless asked (prepare-data --overwrite)"). IoError when the rename fails.
void move_into_place(const std::string& tmp, const std::string& path, ExistingOutput existing, std::string_view refusal);

// A temporary that is removed when this goes out of scope unless it was moved into place (`moved()`): a failed
// write, whatever throws, leaves nothing behind.
class TemporaryOutput {
 public:
  explicit TemporaryOutput(std::string path) : path_(std::move(path)) {}
  ~TemporaryOutput() {
    std::error_code ec;
    if (!moved_) std::filesystem::remove(path_, ec);
  }
  TemporaryOutput(const TemporaryOutput&) = delete;
  TemporaryOutput& operator=(const TemporaryOutput&) = delete;
  const std::string& path() const { return path_; }
  void moved() { moved_ = true; }

 private:
  std::string path_;
  SweptOnSignal swept_{path_};  // and by a stop signal (Ctrl-C, a time limit)
  bool moved_ = false;
};

// Writes `contents` to output_temporary(path), flushes it, and moves it into place as above; the temporary is
// removed however that fails.
void write_file_into_place(const std::string& path, std::string_view contents, ExistingOutput existing,
                           std::string_view refusal);

}  // namespace shardtrain::data
