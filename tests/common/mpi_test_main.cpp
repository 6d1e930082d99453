// gtest main for tests run under mpirun: every rank runs every test; rank 0 prints the usual report,
// other ranks print only their failures; the exit code is non-zero if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

// After every test, rank 0 names the ranks on which it failed: its own report would say OK for a
// test that failed only elsewhere. Every rank runs every test in the same order, so this collective
// is matched.
class CrossRankStatus : public testing::EmptyTestEventListener {
 public:
  CrossRankStatus(int rank, int size) : rank_(rank), size_(size) {}
  void OnTestEnd(const testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0;
    std::vector<int> all(static_cast<size_t>(size_));
    MPI_Gather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank_ != 0) return;
    for (int r = 1; r < size_; ++r) {
      if (all[static_cast<size_t>(r)])
        std::fprintf(stderr, "[  FAILED  ] %s.%s on rank %d\n", info.test_suite_name(), info.name(), r);
    }
  }

 private:
  int rank_, size_;
};

}  // namespace

int main(int argc, char** argv) {
  shardtrain::MpiSession session(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  shardtrain::log::configure({session.world_rank(), session.world_size(), shardtrain::LogLevel::Warn, false});
  if (session.world_rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(session.world_rank()));
  }
  testing::UnitTest::GetInstance()->listeners().Append(new CrossRankStatus(session.world_rank(), session.world_size()));
  int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return global;
}
