// Collectives on device memory: the NCCL backend (one rank per GPU) and the MPI backend staging
// through pinned host memory (several ranks sharing one GPU). Skipped without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "shardtrain/comm/mesh_comms.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "tests/common/gpu_required.hpp"

using namespace shardtrain;

namespace {

class GpuCollectives : public testing::Test {
 protected:
  void SetUp() override {
    ST_SKIP_WITHOUT_GPU("GPU collective tests");
    topo_ = discover_topology(MPI_COMM_WORLD, 0);
    device_ = select_device(topo_, DevicePreference::Cuda, machine_comm(MPI_COMM_WORLD).get());
  }

  // all_gather, reduce_scatter (sum), all_reduce (avg) and broadcast on device buffers, checked on the host.
  void run(Communicator& comm) {
    const int P = comm.size(), me = comm.rank();
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000003}}) {
      std::vector<float> host(n * P);
      for (size_t k = 0; k < host.size(); ++k) host[k] = static_cast<float>((me * 5 + k) % 13);
      DeviceBuffer send(n * P * sizeof(float)), recv(n * P * sizeof(float));
      CudaStream stream;
      copy_async(send.data(), host.data(), n * sizeof(float), stream.ref());
      comm.all_gather(send.data(), recv.data(), n, DType::F32, stream.ref());
      std::vector<float> out(n * P);
      copy_async(out.data(), recv.data(), out.size() * sizeof(float), stream.ref());
      stream.synchronize();
      for (int j = 0; j < P; ++j)
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[j * n + i], static_cast<float>((j * 5 + i) % 13));

      copy_async(send.data(), host.data(), host.size() * sizeof(float), stream.ref());
      comm.reduce_scatter(send.data(), recv.data(), n, DType::F32, ReduceOp::Sum, stream.ref());
      copy_async(out.data(), recv.data(), n * sizeof(float), stream.ref());
      stream.synchronize();
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < P; ++r) want += static_cast<float>((r * 5 + me * n + i) % 13);
        ASSERT_EQ(out[i], want);
      }

      comm.all_reduce(send.data(), recv.data(), n, DType::F32, ReduceOp::Avg, stream.ref());
      copy_async(out.data(), recv.data(), n * sizeof(float), stream.ref());
      stream.synchronize();
      for (size_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < P; ++r) want += static_cast<float>((r * 5 + i) % 13);
        ASSERT_EQ(out[i], want / P);
      }
    }
  }

  Topology topo_;
  Device device_;
};

TEST_F(GpuCollectives, NcclOnOwnGpu) {
  if (device_.ranks_sharing > 1) GTEST_SKIP() << "ranks share a GPU: NCCL needs one GPU per rank";
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  MeshComms comms(mesh, CommBackend::Nccl, MemorySpace::Device);
  EXPECT_STREQ(comm_backend_name(comms.shard().backend()), "nccl");
  EXPECT_STREQ(comm_backend_name(comms.replicate().backend()), "nccl");
  // The world axis carries the trainer's host values only: MPI, no NCCL communicator of its own. Device
  // buffers given to it still arrive (staged through the host).
  EXPECT_STREQ(comm_backend_name(comms.world().backend()), "mpi");
  run(comms.shard());
  run(comms.world());
}

// Host values (the trainer's token counts and loss sums) through device-space communicators: over MPI, never
// handed to NCCL (which reads device memory only) nor staged as if they were device buffers.
TEST_F(GpuCollectives, HostValuesThroughDeviceSpaceCommunicators) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  std::vector<CommBackend> backends{CommBackend::Mpi};
  if (device_.ranks_sharing == 1) backends.push_back(CommBackend::Nccl);
  for (CommBackend b : backends) {
    MeshComms comms(mesh, b, MemorySpace::Device);
    const int P = comms.world().size(), me = comms.world().rank();
    int64_t count = me + 1;
    double sums[2] = {0.5 * me, 1.0};
    comms.world().all_reduce(std::span<int64_t>(&count, 1), ReduceOp::Sum);
    comms.world().all_reduce(std::span<double>(sums, 2), ReduceOp::Sum);
    EXPECT_EQ(count, int64_t{P} * (P + 1) / 2) << comm_backend_name(b);
    EXPECT_DOUBLE_EQ(sums[0], 0.25 * P * (P - 1)) << comm_backend_name(b);
    EXPECT_DOUBLE_EQ(sums[1], static_cast<double>(P)) << comm_backend_name(b);
    std::vector<int32_t> mine{me, 7 * me}, all(2 * static_cast<size_t>(P));
    comms.world().all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all));
    for (int r = 0; r < P; ++r) {
      EXPECT_EQ(all[2 * static_cast<size_t>(r)], r);
      EXPECT_EQ(all[2 * static_cast<size_t>(r) + 1], 7 * r);
    }
    EXPECT_EQ(comms.world().entered(), 3u) << "host collectives count like the others";
  }
}

TEST_F(GpuCollectives, MpiStagingThroughPinnedHost) {
  DeviceMesh mesh(MPI_COMM_WORLD, topo_, {ShardingStrategy::FullShard, 0});
  MeshComms comms(mesh, CommBackend::Mpi, MemorySpace::Device);
  run(comms.shard());
}

}  // namespace
