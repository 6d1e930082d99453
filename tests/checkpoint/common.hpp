// Helpers shared by the checkpoint tests: a fresh directory per test (made by rank 0, known to all).
#pragma once

#include <mpi.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

namespace shardtrain::testing_ckpt {

inline std::string fresh_dir(const std::string& tag, MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  char buf[512] = {};
  if (rank == 0) {
    const auto base = std::filesystem::temp_directory_path() / ("shardtrain_test_" + std::to_string(::getpid()));
    const auto dir = base / tag;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::snprintf(buf, sizeof(buf), "%s", dir.c_str());
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, comm);
  return buf;
}

}  // namespace shardtrain::testing_ckpt

namespace shardtrain::testing_ckpt {

// Removes this run's test directories when the tests end (rank 0 made them).
class CleanupEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("shardtrain_test_" + std::to_string(::getpid())),
                                  ec);
    }
  }
};

}  // namespace shardtrain::testing_ckpt
