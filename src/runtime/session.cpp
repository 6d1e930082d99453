// MPI session and communicator handles.
#include "shardtrain/runtime/session.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "shardtrain/runtime/check.hpp"

namespace shardtrain {

namespace {

// Started by no launcher (mpirun, srun, any PMI): `shardtrain train` typed alone, an MPI singleton. Read before
// MPI_Init, which starts the singleton's own daemon.
bool g_singleton = false;

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  g_singleton = true;
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_STEP_ID"})
    if (std::getenv(name)) g_singleton = false;
  ST_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
  // Errors come back as codes so ST_CHECK_MPI can name the call; the default would abort silently.
  ST_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ST_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  ST_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  if (world_size_ != 1) g_singleton = false;
  if (thread_level_ < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw LibraryError(ExitCode::Comm, "MPI",
                       fmt::format("MPI_Init_thread provided thread level {} but shardtrain needs MPI_THREAD_MULTIPLE "
                                   "({}): use an MPI built with thread support",
                                   thread_level_, MPI_THREAD_MULTIPLE));
  }
}

MpiSession::~MpiSession() {
  if (active()) MPI_Finalize();
}

bool MpiSession::active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void MpiSession::abort(ExitCode code) {
  const int status = static_cast<int>(code);
  if (active() && g_singleton) {
    // A singleton has no other rank to end: MPI_Abort would only add Open MPI's MPI_ABORT banner under the error (and
    // at times an "ORTE_ERROR_LOG: Data unpack would read past end of buffer" line from its help system). MPI_Finalize
    // has its daemon remove the session directory (an exit without it left TMPDIR/ompi.HOST.UID/jf.N behind), within
    // a bound: a thread still inside an MPI call could hold it.
    try {
      std::thread([status] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::fflush(nullptr);
        std::_Exit(status);
      }).detach();
      MPI_Finalize();
    } catch (const std::system_error&) {  // no thread for the bound: no MPI_Finalize either
    }
  } else if (active()) {
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  std::fflush(nullptr);
  std::_Exit(status);
}

MpiComm MpiComm::duplicate(MPI_Comm comm) {
  MPI_Comm out = MPI_COMM_NULL;
  ST_CHECK_MPI(MPI_Comm_dup(comm, &out));
  ST_CHECK_MPI(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return MpiComm(out);
}

MpiComm MpiComm::split(MPI_Comm comm, int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  ST_CHECK_MPI(MPI_Comm_split(comm, color, key, &out));
  if (out != MPI_COMM_NULL) ST_CHECK_MPI(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return MpiComm(out);
}

int MpiComm::rank() const {
  int r = 0;
  ST_CHECK_MPI(MPI_Comm_rank(comm_, &r));
  return r;
}

int MpiComm::size() const {
  int s = 0;
  ST_CHECK_MPI(MPI_Comm_size(comm_, &s));
  return s;
}

void MpiComm::reset() {
  if (comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && MpiSession::active()) {
    MPI_Comm_free(&comm_);
  }
  comm_ = MPI_COMM_NULL;
}

std::string broadcast_text(MPI_Comm comm, int root, std::string text) {
  int length = static_cast<int>(text.size());
  ST_CHECK_MPI(MPI_Bcast(&length, 1, MPI_INT, root, comm));
  text.resize(static_cast<size_t>(length));
  ST_CHECK_MPI(MPI_Bcast(text.data(), length, MPI_CHAR, root, comm));
  return text;
}

}  // namespace shardtrain
