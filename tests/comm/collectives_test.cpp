// Every collective, bit-exact on small-integer data (which sums exactly in f32 and bf16), at sizes
// 1, 7, 1000 and 1000003, on every axis of the meshes, with the traffic counters checked per call.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/runtime/runtime.hpp"

using namespace shardtrain;

namespace {

// The value rank `r` contributes at element `i`: an integer in [-8, 8].
int value(int r, size_t i) { return static_cast<int>((r * 7 + i * 3) % 17) - 8; }

template <typename T>
T make(double v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <typename T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

struct AxisCase {
  Communicator* comm;
  std::vector<int> group;  // world ranks of the axis, in axis-rank order
};

class Collectives : public testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    topo_ = discover_topology(MPI_COMM_WORLD, ranks_per_node_from_env());
  }

  // Runs `body` for every axis of the HYBRID_SHARD mesh (2 x 2 on simulated nodes, 1 x W otherwise)
  // and of the NO_SHARD mesh (W x 1).
  template <typename F>
  void for_each_axis(F&& body) {
    for (ShardingStrategy s : {ShardingStrategy::HybridShard, ShardingStrategy::NoShard}) {
      DeviceMesh mesh(MPI_COMM_WORLD, topo_, {s, 0});
      MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
      std::vector<int> world(topo_.world_size);
      for (int r = 0; r < topo_.world_size; ++r) world[r] = r;
      const AxisCase cases[] = {{&comms.shard(), mesh.shard_groups_world()[mesh.coord().replicate]},
                                {&comms.replicate(), mesh.replicate_groups_world()[mesh.coord().shard]},
                                {&comms.world(), world}};
      for (const AxisCase& c : cases) {
        SCOPED_TRACE(std::string(sharding_strategy_name(s)) + " axis " + mesh_axis_name(c.comm->axis()));
        ASSERT_EQ(static_cast<int>(c.group.size()), c.comm->size());
        ASSERT_EQ(c.group[c.comm->rank()], world_rank_);
        body(c);
      }
    }
  }

  template <typename T>
  void check_all(const AxisCase& c, size_t n) {
    Communicator& comm = *c.comm;
    const int P = comm.size(), me = comm.rank();
    const DType dt = dtype_of_v<T>;
    const uint64_t esz = sizeof(T);
    auto bytes = [&](CollectiveKind k) { return comm.traffic().bytes(k); };

    // all_gather, out of place then in place.
    for (bool in_place : {false, true}) {
      std::vector<T> send(n), recv(n * P, make<T>(99));
      for (size_t i = 0; i < n; ++i) send[i] = make<T>(value(world_rank_, i));
      if (in_place) std::copy(send.begin(), send.end(), recv.begin() + me * n);
      const uint64_t before = bytes(CollectiveKind::AllGather);
      comm.all_gather(in_place ? static_cast<const void*>(recv.data() + me * n) : send.data(), recv.data(), n, dt);
      EXPECT_EQ(bytes(CollectiveKind::AllGather) - before, n * P * esz);
      size_t bad = 0;
      for (int j = 0; j < P; ++j)
        for (size_t i = 0; i < n; ++i) bad += as_double(recv[j * n + i]) != value(c.group[j], i);
      EXPECT_EQ(bad, 0u) << "all_gather in_place=" << in_place << " n=" << n;
    }

    // reduce_scatter sum and avg, out of place then in place.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      for (bool in_place : {false, true}) {
        std::vector<T> send(n * P), recv(n, make<T>(99));
        for (size_t k = 0; k < n * P; ++k) send[k] = make<T>(value(world_rank_, k));
        const uint64_t before = bytes(CollectiveKind::ReduceScatter);
        T* out = in_place ? send.data() + me * n : recv.data();
        comm.reduce_scatter(send.data(), out, n, dt, op);
        EXPECT_EQ(bytes(CollectiveKind::ReduceScatter) - before, n * P * esz);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          double want = 0;
          for (int m : c.group) want += value(m, me * n + i);
          if (op == ReduceOp::Avg) want /= P;
          bad += as_double(out[i]) != want;
        }
        EXPECT_EQ(bad, 0u) << "reduce_scatter " << reduce_op_name(op) << " in_place=" << in_place << " n=" << n;
      }
    }

    // all_reduce sum, avg, max, out of place then in place.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      for (bool in_place : {false, true}) {
        std::vector<T> send(n), recv(n, make<T>(99));
        for (size_t i = 0; i < n; ++i) send[i] = make<T>(value(world_rank_, i));
        T* out = in_place ? send.data() : recv.data();
        const uint64_t before = bytes(CollectiveKind::AllReduce);
        comm.all_reduce(send.data(), out, n, dt, op);
        EXPECT_EQ(bytes(CollectiveKind::AllReduce) - before, n * esz);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          double want = op == ReduceOp::Max ? -1e9 : 0;
          for (int m : c.group) want = op == ReduceOp::Max ? std::max<double>(want, value(m, i)) : want + value(m, i);
          if (op == ReduceOp::Avg) want /= P;
          bad += as_double(out[i]) != want;
        }
        EXPECT_EQ(bad, 0u) << "all_reduce " << reduce_op_name(op) << " in_place=" << in_place << " n=" << n;
      }
    }

    // broadcast from the last rank of the axis.
    {
      const int root = P - 1;
      std::vector<T> buf(n);
      for (size_t i = 0; i < n; ++i) buf[i] = make<T>(value(world_rank_, i));
      const uint64_t before = bytes(CollectiveKind::Broadcast);
      comm.broadcast(buf.data(), n, dt, root);
      EXPECT_EQ(bytes(CollectiveKind::Broadcast) - before, n * esz);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += as_double(buf[i]) != value(c.group[root], i);
      EXPECT_EQ(bad, 0u) << "broadcast n=" << n;
    }
  }

  int world_rank_ = 0;
  Topology topo_;
};

TEST_F(Collectives, FloatAndBf16AreBitExactOnEveryAxis) {
  for_each_axis([&](const AxisCase& c) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{1000003}}) {
      check_all<float>(c, n);
      check_all<bf16>(c, n);
    }
  });
}

TEST_F(Collectives, IntegersSumAndMax) {
  for_each_axis([&](const AxisCase& c) {
    Communicator& comm = *c.comm;
    for (size_t n : {size_t{1}, size_t{1000}}) {
      std::vector<int64_t> a(n);
      std::vector<int32_t> b(n);
      for (size_t i = 0; i < n; ++i) a[i] = b[i] = value(world_rank_, i);
      comm.all_reduce(std::span<int64_t>(a), ReduceOp::Sum);
      comm.all_reduce(std::span<int32_t>(b), ReduceOp::Max);
      std::vector<int32_t> gathered(n * comm.size());
      std::vector<int32_t> mine(n);
      for (size_t i = 0; i < n; ++i) mine[i] = value(world_rank_, i) * 1000;
      comm.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(gathered));
      for (size_t i = 0; i < n; ++i) {
        int64_t sum = 0;
        int32_t mx = -100;
        for (int m : c.group) sum += value(m, i), mx = std::max(mx, value(m, i));
        ASSERT_EQ(a[i], sum);
        ASSERT_EQ(b[i], mx);
        for (int j = 0; j < comm.size(); ++j) ASSERT_EQ(gathered[j * n + i], value(c.group[j], i) * 1000);
      }
    }
  });
}

TEST_F(Collectives, AvgOnIntegersIsRejected) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  int32_t x = 1;
  EXPECT_THROW(comms.shard().all_reduce(&x, &x, 1, DType::I32, ReduceOp::Avg), InternalError);
  EXPECT_EQ(comms.shard().traffic().calls(CollectiveKind::AllReduce), 0u);
}

TEST_F(Collectives, BarrierAndCountersPerAxis) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::HybridShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Host);
  comms.world().barrier();
  std::vector<float> x(10, 1.0f);
  comms.replicate().all_reduce(std::span<float>(x), ReduceOp::Sum);
  EXPECT_EQ(comms.world().traffic().calls(CollectiveKind::Barrier), 1u);
  EXPECT_EQ(comms.bytes(MeshAxis::Replicate, CollectiveKind::AllReduce), 40u);
  EXPECT_EQ(comms.bytes(MeshAxis::Shard, CollectiveKind::AllReduce), 0u);
  EXPECT_EQ(comms.world().traffic().total_bytes(), 0u);
  comms.reset_traffic();
  EXPECT_EQ(comms.replicate().traffic().total_bytes(), 0u);
}

}  // namespace
