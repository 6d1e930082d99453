// The error-check macros: a failing call becomes a LibraryError naming the statement, file:line,
// the library's own message, and the right exit code.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/log.hpp"

using namespace shardtrain;

namespace {
template <typename F>
LibraryError catch_library_error(F&& f) {
  try {
    f();
  } catch (const LibraryError& e) {
    return e;
  }
  ADD_FAILURE() << "no LibraryError thrown";
  return LibraryError(ExitCode::Ok, "", "");
}
}  // namespace

TEST(Check, MpiErrorCarriesStatementAndMessage) {
  const LibraryError e = catch_library_error([] { ST_CHECK_MPI(MPI_ERR_COUNT); });
  const std::string what = e.what();
  EXPECT_EQ(e.code(), ExitCode::Comm);
  EXPECT_EQ(e.library(), "MPI");
  EXPECT_NE(what.find("MPI_ERR_COUNT"), std::string::npos) << what;
  EXPECT_NE(what.find("check_test.cpp:"), std::string::npos) << what;
  EXPECT_NE(what.find("count"), std::string::npos) << what;  // MPI's own description of the error
}

TEST(Check, Hdf5ErrorNamesTheFailingCall) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // keep HDF5 from printing its own stack
  const LibraryError e =
      catch_library_error([] { ST_CHECK_HDF5(H5Fopen("/nonexistent/shardtrain.h5", H5F_ACC_RDONLY, H5P_DEFAULT)); });
  const std::string what = e.what();
  EXPECT_EQ(e.code(), ExitCode::Io);
  EXPECT_NE(what.find("H5Fopen"), std::string::npos) << what;
  EXPECT_NE(what.find("/nonexistent/shardtrain.h5"), std::string::npos) << what;
}

TEST(Check, Hdf5PassesValidHandlesThrough) {
  const int64_t id = ST_CHECK_HDF5(H5Pcreate(H5P_FILE_ACCESS));
  EXPECT_GT(id, 0);
  H5Pclose(id);
}

TEST(Check, CudaCheckReportsTheLibrary) {
  const LibraryError e = catch_library_error([] { ST_CHECK_CUDA(2); });  // cudaErrorMemoryAllocation
  EXPECT_EQ(e.code(), ExitCode::Device);
  EXPECT_EQ(e.library(), "CUDA");
  if (cuda_built()) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
}

// Without a device the reason is the runtime's own words (or the build's); with one there is none.
TEST(Device, UnavailableReasonSaysWhy) {
  const std::string reason = cuda_unavailable_reason();
  if (cuda_device_count() > 0) {
    EXPECT_EQ(reason, "");
  } else if (!cuda_built()) {
    EXPECT_EQ(reason, "shardtrain was built without CUDA");
  } else {
    const bool runtime_error = reason.rfind("cudaGetDeviceCount: cudaError", 0) == 0;
    const bool empty_list = reason.rfind("the driver lists no device", 0) == 0;
    EXPECT_TRUE(runtime_error || empty_list) << reason;
  }
}

// --device auto falls back to the CPU only where no NVIDIA driver lists a GPU, or the GPUs are hidden on purpose.
TEST(Device, AutoRefusesTheCpuWhereTheDriverListsGpus) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("shardtrain-gpus-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(gpus_present_but_unreachable(dir.string(), nullptr), "");  // no driver: a CPU machine
  std::filesystem::create_directories(dir);
  EXPECT_EQ(gpus_present_but_unreachable(dir.string(), nullptr), "");  // a driver without GPUs
  std::filesystem::create_directories(dir / "0000:18:00.0");
  std::filesystem::create_directories(dir / "0000:2a:00.0");
  EXPECT_EQ(gpus_present_but_unreachable(dir.string(), nullptr), "the NVIDIA driver lists 2 GPUs (" + dir.string() + ")");
  EXPECT_EQ(gpus_present_but_unreachable(dir.string(), "0,1"),
            "the NVIDIA driver lists 2 GPUs (" + dir.string() + ") and CUDA_VISIBLE_DEVICES=\"0,1\"");
  for (const char* hidden : {"", "-1", "NoDevFiles"}) {
    EXPECT_EQ(gpus_present_but_unreachable(dir.string(), hidden), "") << hidden;
  }
  std::filesystem::remove_all(dir);
}

TEST(Check, NcclAndCublasChecks) {
  EXPECT_NO_THROW(ST_CHECK_NCCL(0));
  EXPECT_NO_THROW(ST_CHECK_CUBLAS(0));
  const LibraryError n = catch_library_error([] { ST_CHECK_NCCL(3); });  // ncclInternalError
  EXPECT_EQ(n.code(), ExitCode::Comm);
  EXPECT_EQ(n.library(), "NCCL");
  const LibraryError b = catch_library_error([] { ST_CHECK_CUBLAS(3); });  // CUBLAS_STATUS_ALLOC_FAILED
  EXPECT_EQ(b.code(), ExitCode::Device);
  EXPECT_EQ(b.library(), "cuBLAS");
}

TEST(Log, LevelsParseAndFilterByRank) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
  EXPECT_THROW(parse_log_level("loud"), UsageError);
  log::configure({3, 4, LogLevel::Info, false});
  EXPECT_FALSE(log::enabled(LogLevel::Info));  // other ranks: warnings and errors only
  EXPECT_TRUE(log::enabled(LogLevel::Warn));
  log::configure({0, 4, LogLevel::Info, false});
  EXPECT_TRUE(log::enabled(LogLevel::Info));
  EXPECT_FALSE(log::enabled(LogLevel::Debug));
  log::configure({3, 4, LogLevel::Debug, true});
  EXPECT_TRUE(log::enabled(LogLevel::Debug));
}

// An error every rank raises alike keeps its type through on_every_rank and a rethrow, and says so: main() leaves it to
// rank 0 however slowly rank 0's abort reaches the others (under mpirun in a Slurm job it took over a second).
TEST(ErrorTest, RaisedOnEveryRankKeepsTypeAndMark) {
  try {
    try {
      throw on_every_rank(ConfigError("fsdp.comm_backend: shared GPU"));
    } catch (Error& e) {
      EXPECT_TRUE(e.raised_on_every_rank());
      throw;
    }
  } catch (const ConfigError& e) {
    EXPECT_TRUE(e.raised_on_every_rank());
    EXPECT_EQ(e.code(), ExitCode::Config);
    EXPECT_STREQ(e.what(), "fsdp.comm_backend: shared GPU");
  }
  EXPECT_FALSE(ConfigError("one rank's file").raised_on_every_rank());
  EXPECT_FALSE(DataError("one rank's shard").raised_on_every_rank());
}
