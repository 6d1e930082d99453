// The hang watchdog's bookkeeping, without a hang: each communicator's sequence numbers and world
// ranks, the survey that asks the peers of an axis how far they got (answered by their watchdog
// threads while their main threads wait elsewhere), and the message that names the missing ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/comm/watchdog.hpp"
#include "shardtrain/runtime/runtime.hpp"

using namespace shardtrain;
using namespace std::chrono_literals;

namespace {

class Watchdog : public testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    topo_ = discover_topology(MPI_COMM_WORLD, ranks_per_node_from_env());
  }
  int rank_ = 0;
  Topology topo_;
};

TEST_F(Watchdog, CommunicatorsKnowTheWorldRanksOfTheirGroup) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::HybridShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  std::vector<int> world(static_cast<size_t>(topo_.world_size));
  std::iota(world.begin(), world.end(), 0);
  EXPECT_EQ(comms.world().world_ranks(), world);
  EXPECT_EQ(comms.shard().world_ranks(), mesh.shard_groups_world()[mesh.coord().replicate]);
  EXPECT_EQ(comms.replicate().world_ranks(), mesh.replicate_groups_world()[mesh.coord().shard]);
  EXPECT_EQ(comms.shard().world_ranks()[static_cast<size_t>(comms.shard().rank())], rank_);
}

TEST_F(Watchdog, EveryCollectiveCountsOnItsCommunicator) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  EXPECT_EQ(comms.world().entered(), 0u);
  std::vector<float> v(4, 1.0f), g(4 * static_cast<size_t>(topo_.world_size));
  comms.world().all_reduce(std::span<float>(v), ReduceOp::Sum);
  comms.world().barrier();
  comms.world().broadcast(v.data(), v.size(), DType::F32, 0);
  comms.shard().all_gather(std::span<const float>(v), std::span<float>(g));
  comms.shard().reduce_scatter(g.data(), v.data(), v.size(), DType::F32, ReduceOp::Sum);
  EXPECT_EQ(comms.world().entered(), 3u);
  EXPECT_EQ(comms.shard().entered(), 2u);
  EXPECT_EQ(comms.replicate().entered(), 0u);
}

TEST_F(Watchdog, DisabledDoesNothing) {
  CollectiveWatchdog w(0s);
  EXPECT_FALSE(w.enabled());
  EXPECT_TRUE(w.survey(MeshAxis::World, 1, {0, 1}, 1s).empty());
}

// Rank 0 asks its shard group about the collective its peers have entered (arrived) and about the
// next one (not arrived), while the peers wait in an unwatched MPI_Barrier.
TEST_F(Watchdog, SurveyTellsArrivedFromBehind) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::HybridShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  CollectiveWatchdog w(600s);
  comms.set_watchdog(&w);
  w.set_step(10 + rank_);
  std::vector<int32_t> v(3, rank_);
  for (int i = 0; i < 3; ++i) comms.shard().all_reduce(std::span<int32_t>(v), ReduceOp::Sum);
  comms.world().barrier();
  const std::vector<int> group = comms.shard().world_ranks();
  if (rank_ == 0) {
    const std::vector<PeerReport> arrived = w.survey(MeshAxis::Shard, 3, group, 10s);
    ASSERT_EQ(arrived.size(), group.size() - 1);
    for (size_t i = 0; i < arrived.size(); ++i) {
      const PeerReport& p = arrived[i];
      EXPECT_EQ(p.world_rank, group[i + 1]);
      EXPECT_EQ(p.status, PeerReport::Status::Arrived) << "rank " << p.world_rank;
      EXPECT_EQ(p.entered, 3u);
      EXPECT_FALSE(p.in_collective);
      EXPECT_EQ(p.step, 10 + p.world_rank);
    }
    const std::vector<PeerReport> behind = w.survey(MeshAxis::Shard, 5, group, 10s);
    ASSERT_EQ(behind.size(), group.size() - 1);
    for (const PeerReport& p : behind) {
      EXPECT_EQ(p.status, PeerReport::Status::Behind) << "rank " << p.world_rank;
      EXPECT_EQ(p.entered, 3u);
    }
    if (group.size() == 2) {
      EXPECT_EQ(describe_peer_reports(MeshAxis::Shard, 5, behind),
                "ranks that did not arrive: 1 (at step 11, not in a collective; 2 collectives behind)");
    }
    // The world axis count is separate: one barrier entered there.
    const std::vector<PeerReport> world = w.survey(MeshAxis::World, 1, group, 10s);
    for (const PeerReport& p : world) EXPECT_EQ(p.status, PeerReport::Status::Arrived) << "rank " << p.world_rank;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the peers' watchdog threads answer meanwhile
}

// The peers wait in a watched barrier that rank 0 has not entered yet: they arrived, and say so.
TEST_F(Watchdog, SurveySeesPeersInsideTheCollective) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  CollectiveWatchdog w(600s);
  comms.set_watchdog(&w);
  w.set_step(4);
  if (rank_ == 0 && topo_.world_size > 1) {
    std::vector<PeerReport> reports;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    bool all_in = false;
    while (!all_in && std::chrono::steady_clock::now() < deadline) {
      reports = w.survey(MeshAxis::World, 1, comms.world().world_ranks(), 5s);
      all_in = std::all_of(reports.begin(), reports.end(),
                           [](const PeerReport& p) { return p.status == PeerReport::Status::Arrived; });
      if (!all_in) std::this_thread::sleep_for(20ms);
    }
    ASSERT_TRUE(all_in) << describe_peer_reports(MeshAxis::World, 1, reports);
    ASSERT_EQ(static_cast<int>(reports.size()), topo_.world_size - 1);
    for (const PeerReport& p : reports) {
      EXPECT_TRUE(p.in_collective);
      EXPECT_EQ(p.kind, CollectiveKind::Barrier);
      EXPECT_EQ(p.axis, MeshAxis::World);
      EXPECT_EQ(p.step, 4);
    }
    EXPECT_EQ(describe_peer_reports(MeshAxis::World, 1, reports).rfind("every rank of the world axis arrived", 0), 0u);
  }
  comms.world().barrier();
  EXPECT_EQ(comms.world().entered(), 1u);
}

// Device collectives (NCCL) are handed over after they were issued, with a completion probe: the thread
// drops them in issue order once finished, and a later one finishing first does not release an earlier
// one. (The firing itself ends the process: tests/train/watchdog_cli_test.py covers that path for MPI.)
TEST_F(Watchdog, AsyncCollectivesAreDroppedInIssueOrderOnceFinished) {
  CollectiveWatchdog w(std::chrono::duration<double>(30.0));
  std::array<std::atomic<bool>, 3> finished{};
  std::atomic<int> aborts{0};
  for (size_t i = 0; i < finished.size(); ++i) {
    w.watch_async(
        {CollectiveKind::AllGather, MeshAxis::Shard, 1024, i + 1, nullptr}, [&finished, i] { return finished[i].load(); },
        [&aborts] { ++aborts; });
  }
  EXPECT_EQ(w.async_in_flight(), 3u);
  const auto wait_for = [&w](size_t n) {
    for (int i = 0; i < 200 && w.async_in_flight() != n; ++i) std::this_thread::sleep_for(10ms);
    return w.async_in_flight();
  };
  finished[1] = true;  // the second finishes first: the first still holds the queue
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(w.async_in_flight(), 3u);
  finished[0] = true;
  EXPECT_EQ(wait_for(1), 1u);
  finished[2] = true;
  EXPECT_EQ(wait_for(0), 0u);
  EXPECT_EQ(aborts.load(), 0);
}

TEST_F(Watchdog, AsyncErrorSourcesArePolledUntilRemoved) {
  CollectiveWatchdog w(std::chrono::duration<double>(30.0));
  std::atomic<int> polls{0};
  const int id = w.add_error_source(
      [&polls] {
        ++polls;
        return std::string();
      },
      [] {});
  for (int i = 0; i < 200 && polls.load() < 3; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(polls.load(), 3) << "the thread polls every tick";
  w.remove_error_source(id);
  std::this_thread::sleep_for(60ms);  // a poll in progress at removal may still finish
  const int after = polls.load();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(polls.load(), after) << "no polls after removal";
}

TEST(WatchdogMessage, NamesEveryKindOfPeer) {
  auto report = [](int rank, PeerReport::Status s, uint64_t entered, bool in, int64_t step) {
    PeerReport p;
    p.world_rank = rank;
    p.status = s;
    p.entered = entered;
    p.in_collective = in;
    p.kind = CollectiveKind::AllGather;
    p.axis = MeshAxis::Shard;
    p.step = step;
    return p;
  };
  using S = PeerReport::Status;
  const std::vector<PeerReport> reports = {
      report(0, S::Arrived, 7, true, 3),    report(1, S::Behind, 5, true, 3),     report(2, S::Arrived, 7, true, 3),
      report(3, S::NoAnswer, 0, false, -1), report(4, S::NoAnswer, 0, false, -1), report(6, S::Behind, 6, false, -1),
      report(7, S::Ahead, 9, false, 4),     report(5, S::NoAnswer, 0, false, -1), report(9, S::Arrived, 7, true, 3)};
  EXPECT_EQ(
      describe_peer_reports(MeshAxis::World, 7, reports),
      "ranks that did not arrive: 1 (at step 3, in all_gather on the shard axis; 2 collectives behind), "
      "6 (not in a collective; 1 collective behind); "
      "ranks that did not answer (dead, stopped, or not making MPI progress): 3-5; "
      "ranks past this collective (another code path): 7 (at step 4, not in a collective; entered #9 on the world axis); "
      "arrived: 0, 2, 9");
}

}  // namespace
