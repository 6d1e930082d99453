// Failure records (runtime/failure_record.hpp) on 2 ranks: each rank plays its own Slurm node
// (SLURMD_NODENAME = "node-<rank>"), so a record can be checked to name the node of another rank.
#include <gtest/gtest.h>
#include <mpi.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "shardtrain/runtime/failure_record.hpp"

using namespace shardtrain;
namespace fs = std::filesystem;

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

class FailureRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    rank_ = world_rank();
    setenv("SLURMD_NODENAME", ("node-" + std::to_string(rank_)).c_str(), 1);
    // One directory for both ranks, named after rank 0's pid.
    int pid = static_cast<int>(getpid());
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    dir_ = (fs::temp_directory_path() / ("failure-record-test-" + std::to_string(pid))).string();
    if (rank_ == 0) fs::remove_all(dir_);
    MPI_Barrier(MPI_COMM_WORLD);
    failure_record::enable(dir_, MPI_COMM_WORLD);
    failure_record::set_step(-1);
  }
  void TearDown() override {
    failure_record::disable();
    unsetenv("SLURMD_NODENAME");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) fs::remove_all(dir_);
  }
  nlohmann::json read(int rank) const {
    std::ifstream in(fs::path(dir_) / "failures" / (rank == 0 ? "rank_00000.json" : "rank_00001.json"));
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string text = buffer.str();
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    return nlohmann::json::parse(text);
  }
  int rank_ = 0;
  std::string dir_;
};

}  // namespace

TEST_F(FailureRecord, ATimeoutNamesTheNodesOfTheRanksThatDidNotArrive) {
  failure_record::set_step(12);
  // Rank 0 fires: rank 1 did not arrive. Its message carries quotes and a newline, escaped in the JSON.
  if (rank_ == 0) failure_record::write(ExitCode::Timeout, "all_reduce \"stuck\"\non rank 0", {1});
  MPI_Barrier(MPI_COMM_WORLD);
  const nlohmann::json r = read(0);
  EXPECT_EQ(r["exit_code"], 10);
  EXPECT_EQ(r["kind"], "collective timeout");
  EXPECT_EQ(r["rank"], 0);
  EXPECT_EQ(r["node"], "node-0");
  EXPECT_EQ(r["step"], 12);
  EXPECT_EQ(r["restartable"], true);
  EXPECT_EQ(r["suspect_nodes"], nlohmann::json::array({"node-1"}));
  EXPECT_EQ(r["message"], "all_reduce \"stuck\"\non rank 0");
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "failures" / "rank_00001.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "failures" / "rank_00000.json.tmp"));
}

TEST_F(FailureRecord, ADeviceErrorNamesItsOwnNodeButOutOfMemoryNamesNone) {
  if (rank_ == 1)
    failure_record::write(ExitCode::Device, "an illegal memory access was encountered (cudaErrorIllegalAddress)");
  if (rank_ == 0)
    failure_record::write(ExitCode::Device, "out of GPU memory: 512.0 MiB requested, 10.0 MiB free of 81559.0 MiB");
  MPI_Barrier(MPI_COMM_WORLD);
  const nlohmann::json hw = read(1), oom = read(0);
  EXPECT_EQ(hw["exit_code"], 7);
  EXPECT_EQ(hw["restartable"], true);
  EXPECT_EQ(hw["suspect_nodes"], nlohmann::json::array({"node-1"}));
  EXPECT_EQ(oom["restartable"], false);  // the same batch runs out of memory again, on any node
  EXPECT_TRUE(oom["suspect_nodes"].empty());
}

TEST_F(FailureRecord, OnlyCommunicationTimeoutsAndDeviceFaultsAreRestartable) {
  EXPECT_TRUE(failure_record::restartable(ExitCode::Comm, "NCCL: remote process exited"));
  EXPECT_TRUE(failure_record::restartable(ExitCode::Timeout, ""));
  EXPECT_TRUE(
      failure_record::restartable(ExitCode::Device, "uncorrectable ECC error encountered (cudaErrorECCUncorrectable)"));
  for (const char* m :
       {"out of memory (cudaErrorMemoryAllocation)", "resource allocation failed (CUBLAS_STATUS_ALLOC_FAILED)",
        "out of host memory in step 3 (std::bad_alloc): a micro-batch of 8 x 2048 tokens needs more than this rank has",
        "out of host memory while allocating the model and its FSDP buffers (std::bad_alloc)",
        "host allocation of 1073741824 bytes failed"}) {
    EXPECT_FALSE(failure_record::restartable(ExitCode::Device, m)) << m;
    EXPECT_TRUE(failure_record::suspects(ExitCode::Device, m, {}).empty()) << m;  // no node to blame either
  }
  // A hung save may go through on a restart; a full disk does not empty itself.
  EXPECT_TRUE(failure_record::restartable(
      ExitCode::Io,
      "checkpoint: the save of step 4 has not finished after 2 s (checkpoint.save_timeout): the file system may ..."));
  EXPECT_FALSE(failure_record::restartable(ExitCode::Io, "checkpoint: 3 periodic saves in a row failed: no room"));
  for (ExitCode c :
       {ExitCode::Internal, ExitCode::Config, ExitCode::Data, ExitCode::Checkpoint, ExitCode::Io, ExitCode::Diverged})
    EXPECT_FALSE(failure_record::restartable(c, "x")) << static_cast<int>(c);
  // A communication error names no node: the rank that reports it is usually the victim of a peer.
  EXPECT_TRUE(failure_record::suspects(ExitCode::Comm, "x", {1}).empty());
  // Ranks outside the world are ignored, a node is named once.
  EXPECT_EQ(failure_record::suspects(ExitCode::Timeout, "x", {1, 1, 7, -1}), std::vector<std::string>{"node-1"});
}

// A mapped dataset cut short under the run: reading past the file's new end is a SIGBUS (BUS_ADRERR) inside the
// mapping. A child process (forked from rank 0, after enable() installed the handler) maps a two-page file, notes it,
// truncates it and reads its second page; its record and stderr name the file, and it is not restartable.
TEST_F(FailureRecord, ASigbusInAMappedFileNamesTheFileCutShort) {
  // Rank 0's part in a lambda: a failed ASSERT returns from it, not past the barrier rank 1 waits in.
  const auto on_rank0 = [&] {
    fs::create_directories(dir_);
    const std::string file = (fs::path(dir_) / "tokens \"x\".bin").string();
    const std::string err = (fs::path(dir_) / "child.stderr").string();
    const long page = sysconf(_SC_PAGESIZE);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(e, STDERR_FILENO);
      const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ftruncate(fd, 2 * page) != 0) _exit(3);
      void* m = mmap(nullptr, static_cast<size_t>(2 * page), PROT_READ, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) _exit(4);
      failure_record::set_step(7);
      failure_record::note_mapped_file(m, static_cast<size_t>(2 * page), file);
      if (ftruncate(fd, 0) != 0) _exit(5);
      const volatile char c = static_cast<const volatile char*>(m)[page];  // past the new end: SIGBUS
      _exit(c == 0 ? 6 : 7);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), SIGBUS);
    const nlohmann::json r = read(0);
    EXPECT_EQ(r["exit_code"], 128 + SIGBUS);
    EXPECT_EQ(r["kind"], "crash");
    EXPECT_EQ(r["step"], 7);
    EXPECT_EQ(r["restartable"], false);  // the same file meets the restart
    EXPECT_TRUE(r["suspect_nodes"].empty());
    const std::string message = r["message"];
    EXPECT_EQ(message.rfind("killed by SIGBUS reading " + file + " past its end: the file was cut short", 0), 0u) << message;
    EXPECT_NE(message.find("during step 7"), std::string::npos) << message;
    std::ifstream in(err);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("shardtrain: killed by SIGBUS reading "), std::string::npos) << text.str();
    fs::remove(fs::path(dir_) / "failures" / "rank_00000.json");
  };
  if (rank_ == 0) on_rank0();
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(FailureRecordDisabled, WritesNothingAndNamesTheHostWithoutSlurm) {
  failure_record::disable();
  unsetenv("SLURMD_NODENAME");
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(failure_record::node_name(), std::string(host));
  const fs::path cwd = fs::current_path();
  failure_record::write(ExitCode::Timeout, "x", {0});  // must not create ./failures or throw
  EXPECT_FALSE(fs::exists(cwd / "failures"));
}
