// Which ranks share a physical GPU, from the seats the machine's ranks exchange (select_device's last step),
// and how they are named in the backend's reason.
#include <gtest/gtest.h>

#include "shardtrain/runtime/device.hpp"

using namespace shardtrain;

TEST(DeviceIdentity, RanksOnAGpuAreMatchedByUuidWhateverTheirOrdinal) {
  // Ranks 4-7 of one machine: 4 and 6 each see one GPU (cuda:0 for both), the same physical one; 5 sees all
  // and took another; 7 runs on the CPU.
  const std::vector<GpuSeat> seats{{6, "GPU-aaaa"}, {5, "GPU-bbbb"}, {4, "GPU-aaaa"}, {7, ""}};
  EXPECT_EQ(ranks_on_gpu(seats, "GPU-aaaa"), (std::vector<int>{4, 6}));
  EXPECT_EQ(ranks_on_gpu(seats, "GPU-bbbb"), (std::vector<int>{5}));
  EXPECT_TRUE(ranks_on_gpu(seats, "").empty()) << "ranks without a GPU share nothing";
  EXPECT_TRUE(ranks_on_gpu(seats, "GPU-cccc").empty());
}

TEST(DeviceIdentity, RanksInWords) {
  EXPECT_EQ(describe_ranks({3}), "rank 3");
  EXPECT_EQ(describe_ranks({0, 1}), "ranks 0 and 1");
  EXPECT_EQ(describe_ranks({0, 2, 5}), "ranks 0, 2 and 5");
  EXPECT_EQ(describe_ranks({}), "no rank");
}
