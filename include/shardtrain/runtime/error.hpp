// Typed exceptions and the process exit codes they map to (docs/exit-codes.md).
// Library code throws; only main() turns an exception into a log line and an exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace shardtrain {

// Exit codes of every shardtrain process. Stable: job scripts branch on them.
enum class ExitCode : int {
  Ok = 0,
  Internal = 1,    // a bug: an exception nobody classified
  Usage = 2,       // bad command line
  Config = 3,      // invalid configuration (file, key, value, or a mesh that cannot be built)
  Data = 4,        // invalid dataset, tokenizer or input text
  Checkpoint = 5,  // missing, incomplete, corrupt or mismatched checkpoint
  Comm = 6,        // MPI or NCCL failure
  Device = 7,      // CUDA or cuBLAS failure, device out of memory
  Io = 8,          // file system or HDF5 failure on an output
  Diverged = 9,    // too many non-finite steps in a row
  Timeout = 10,    // the hang watchdog ended the job
  Requeue = 75,    // preempted: a checkpoint was saved, requeue the job (EX_TEMPFAIL)
};

const char* exit_code_name(ExitCode code);

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const noexcept { return code_; }
  // Raised alike on every rank, from what they all hold (a collective decision, the world's shape): rank 0 says it
  // and ends the job, and the other ranks keep quiet (see on_every_rank).
  bool raised_on_every_rank() const noexcept { return on_every_rank_; }
  void mark_raised_on_every_rank() noexcept { on_every_rank_ = true; }

 private:
  ExitCode code_;
  bool on_every_rank_ = false;
};

// `throw on_every_rank(ConfigError(...))` where every rank reaches the same error from the same gathered values. Rank 0
// logs it and aborts the job; the other ranks wait for that abort without a line of their own, however long the
// launcher takes to deliver it (a second was not always enough for mpirun inside a Slurm job). Errors not so marked
// are logged by a rank other than 0 a second after it failed, in case rank 0 did not fail the same way.
template <class E>
E on_every_rank(E e) {
  e.mark_raised_on_every_rank();
  return e;
}

// Each bad-input error names the file or field and what was expected.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& m) : Error(ExitCode::Usage, m) {}
};
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& m) : Error(ExitCode::Config, m) {}
};
class DataError : public Error {
 public:
  explicit DataError(const std::string& m) : Error(ExitCode::Data, m) {}
};
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& m) : Error(ExitCode::Checkpoint, m) {}
};
class IoError : public Error {
 public:
  explicit IoError(const std::string& m) : Error(ExitCode::Io, m) {}
};
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& m) : Error(ExitCode::Internal, m) {}
};

// Throws the typed error of `code` (CheckpointError for ExitCode::Checkpoint, IoError, DataError, ...) with `message`:
// an error carried from one rank to the others as a code and a text arrives as the type a catch clause expects.
// `every_rank`: marked on_every_rank (every rank throws it, rank 0 alone says it).
[[noreturn]] void throw_typed(ExitCode code, const std::string& message, bool every_rank);

// A failed call into MPI, NCCL, CUDA, cuBLAS or HDF5 (see check.hpp).
class LibraryError : public Error {
 public:
  LibraryError(ExitCode code, std::string library, const std::string& message)
      : Error(code, message), library_(std::move(library)) {}
  const std::string& library() const noexcept { return library_; }

 private:
  std::string library_;
};

}  // namespace shardtrain
