// Names of exit codes, and the non-CUDA half of the library error checks.
#include "shardtrain/runtime/error.hpp"

#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <string>

#include "shardtrain/runtime/check.hpp"

namespace shardtrain {

const char* exit_code_name(ExitCode code) {
  switch (code) {
    case ExitCode::Ok: return "ok";
    case ExitCode::Internal: return "internal error";
    case ExitCode::Usage: return "usage error";
    case ExitCode::Config: return "configuration error";
    case ExitCode::Data: return "data error";
    case ExitCode::Checkpoint: return "checkpoint error";
    case ExitCode::Comm: return "communication error";
    case ExitCode::Device: return "device error";
    case ExitCode::Io: return "I/O error";
    case ExitCode::Diverged: return "training diverged";
    case ExitCode::Timeout: return "collective timeout";
    case ExitCode::Requeue: return "preempted, requeue";
  }
  return "unknown";
}

namespace {

template <class E>
[[noreturn]] void throw_marked(E e, bool every_rank) {
  if (every_rank) e.mark_raised_on_every_rank();
  throw e;
}

}  // namespace

void throw_typed(ExitCode code, const std::string& message, bool every_rank) {
  switch (code) {
    case ExitCode::Usage: throw_marked(UsageError(message), every_rank);
    case ExitCode::Config: throw_marked(ConfigError(message), every_rank);
    case ExitCode::Data: throw_marked(DataError(message), every_rank);
    case ExitCode::Checkpoint: throw_marked(CheckpointError(message), every_rank);
    case ExitCode::Io: throw_marked(IoError(message), every_rank);
    case ExitCode::Internal: throw_marked(InternalError(message), every_rank);
    default: throw_marked(Error(code, message), every_rank);
  }
}

namespace detail {
namespace {

std::string where_am_i() {
  int rank = -1;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  return rank >= 0 ? fmt::format("rank {} on {}", rank, host.data()) : fmt::format("on {}", host.data());
}

// Walks the HDF5 error stack and keeps the innermost (most specific) description.
herr_t hdf5_walk(unsigned n, const H5E_error2_t* e, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (n == 0 && e->desc) *s = fmt::format("{} (in {})", e->desc, e->func_name ? e->func_name : "?");
  return 0;
}

}  // namespace

void throw_library_error(const char* library, ExitCode code, const std::string& what, const char* statement,
                         const char* file, int line) {
  throw LibraryError(
      code, library,
      fmt::format("{} call failed: {} at {}:{} ({}): {}", library, statement, file, line, where_am_i(), what));
}

void check_mpi(int status, const char* statement, const char* file, int line) {
  if (status == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(status, text.data(), &len) != MPI_SUCCESS) len = 0;
  throw_library_error("MPI", ExitCode::Comm, fmt::format("error {}: {}", status, std::string(text.data(), len)), statement,
                      file, line);
}

int64_t check_hdf5(int64_t status, const char* statement, const char* file, int line) {
  if (status >= 0) return status;
  std::string what = "no description on the HDF5 error stack";
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, hdf5_walk, &what);
  H5Eclear2(H5E_DEFAULT);
  throw_library_error("HDF5", ExitCode::Io, what, statement, file, line);
}

}  // namespace detail
}  // namespace shardtrain
