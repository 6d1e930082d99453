// The MPI session: created first in main, destroyed last. Owns MPI_Init_thread/MPI_Finalize
// and the move-only MPI communicator handle every layer above uses.
#pragma once

#include <mpi.h>

#include <string>
#include <utility>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

class MpiSession {
 public:
  // MPI_Init_thread with MPI_THREAD_MULTIPLE (the loader and the watchdog run beside the step).
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return thread_level_; }

  // Ends every rank of the job with this exit code (MPI_Abort; a singleton, started without a launcher, just exits);
  // never returns.
  [[noreturn]] static void abort(ExitCode code);
  static bool active();  // initialized and not yet finalized

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
};

// A move-only owner of an MPI communicator (freed unless it is a predefined one).
class MpiComm {
 public:
  MpiComm() = default;
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}
  ~MpiComm() { reset(); }
  MpiComm(MpiComm&& o) noexcept : comm_(std::exchange(o.comm_, MPI_COMM_NULL)) {}
  MpiComm& operator=(MpiComm&& o) noexcept {
    if (this != &o) {
      reset();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  static MpiComm duplicate(MPI_Comm comm);  // MPI_Comm_dup, errors returned instead of aborting
  static MpiComm split(MPI_Comm comm, int color, int key);

  MPI_Comm get() const { return comm_; }
  int rank() const;
  int size() const;
  explicit operator bool() const { return comm_ != MPI_COMM_NULL; }

 private:
  void reset();
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Collective over `comm`: `text` as rank `root` holds it, returned on every rank (the others' `text` is ignored).
std::string broadcast_text(MPI_Comm comm, int root, std::string text);

}  // namespace shardtrain
