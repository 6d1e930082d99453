// Built without CUDA: shards are always host memory, so the device paths of AdamW and the gradient norm
// are unreachable through the engine; reaching them anyway (hand-made views) is a Device error.
#include <fmt/format.h>

#include "adamw_internal.hpp"
#include "shardtrain/optim/adamw.hpp"
#include "shardtrain/runtime/error.hpp"

namespace shardtrain::optim {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw Error(ExitCode::Device, fmt::format("{}: device shards need CUDA, and shardtrain was built without it "
                                            "(SHARDTRAIN_CUDA=OFF)",
                                            what));
}

}  // namespace

void AdamW::allocate_device_state(State&) { no_cuda("AdamW"); }
void AdamW::upload_chunk_table() { no_cuda("AdamW"); }
void AdamW::step_device(double, double, StreamRef, int64_t, int64_t) { no_cuda("AdamW::step"); }

namespace detail {

void device_copy_sync(void*, const void*, size_t) { no_cuda("AdamW state copy"); }

void device_grad_sq_sum_start(const std::vector<fsdp::ShardView>&, Communicator*, StreamRef, DeviceBuffer&, PinnedBuffer&,
                              CudaEvent&) {
  no_cuda("gradient norm");
}

}  // namespace detail
}  // namespace shardtrain::optim
