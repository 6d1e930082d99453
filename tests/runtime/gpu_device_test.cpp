// The selected GPU's identity and the ranks found on it (select_device), and high-priority streams. On a GPU
// machine and on the CUDA emulator (two ranks: a device each there); skipped without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/device.hpp"
#include "tests/common/gpu_required.hpp"

using namespace shardtrain;

namespace {

class GpuDevice : public testing::Test {
 protected:
  void SetUp() override {
    ST_SKIP_WITHOUT_GPU("GPU device test");
    topo_ = discover_topology(MPI_COMM_WORLD, 0);
    machine_ = machine_comm(MPI_COMM_WORLD);
    device_ = select_device(topo_, DevicePreference::Cuda, machine_.get());
  }
  Topology topo_;
  MpiComm machine_;
  Device device_;
};

TEST_F(GpuDevice, IdentityAsNvidiaSmiPrintsIt) {
  EXPECT_TRUE(std::regex_match(device_.uuid, std::regex("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")))
      << device_.uuid;
  EXPECT_TRUE(std::regex_match(device_.pci_bus_id, std::regex("[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9a-f]")))
      << device_.pci_bus_id;
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, device_.index) << "the selected device is made current";
}

// ranks_sharing and sharing_ranks against every rank's (host, UUID), gathered over the world here.
TEST_F(GpuDevice, RanksOnTheSameGpuAreFoundByIdentity) {
  struct Row {
    std::array<char, 256> host;
    std::array<char, 64> uuid;
  };
  Row mine{};
  std::snprintf(mine.host.data(), mine.host.size(), "%s", topo_.hostname.c_str());
  std::snprintf(mine.uuid.data(), mine.uuid.size(), "%s", device_.uuid.c_str());
  std::vector<Row> all(static_cast<size_t>(topo_.world_size));
  ASSERT_EQ(MPI_Allgather(&mine, sizeof(Row), MPI_BYTE, all.data(), sizeof(Row), MPI_BYTE, MPI_COMM_WORLD), MPI_SUCCESS);
  std::vector<int> want;
  for (int r = 0; r < topo_.world_size; ++r)
    if (std::string(all[r].host.data()) == topo_.hostname && std::string(all[r].uuid.data()) == device_.uuid)
      want.push_back(r);
  EXPECT_EQ(device_.sharing_ranks, want);
  EXPECT_EQ(device_.ranks_sharing, static_cast<int>(want.size()));
}

TEST_F(GpuDevice, CommunicationStreamsAtTheGreatestPriority) {
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  EXPECT_LT(greatest, least) << "the device has priorities to give";
  CudaStream high(StreamPriority::High), normal;
  int p = 1;
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(high.ref().handle), &p), cudaSuccess);
  EXPECT_EQ(p, greatest);
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(normal.ref().handle), &p), cudaSuccess);
  EXPECT_EQ(p, least);
}

}  // namespace
