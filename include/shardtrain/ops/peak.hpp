// Measured ceilings for "% of peak" figures, taken through the Ops interface on the backend's own device:
// the rate of one large square matmul (the MFU peak the trainer uses on GPUs) and the bandwidth of a large
// copy (the ceiling of memory-bound ops). Also the two pieces every op benchmark needs: memory on the
// backend's device and random contents for it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/ops/host_buffer.hpp"
#include "shardtrain/ops/ops.hpp"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::ops {

// Memory on an Ops backend's device: a DeviceBuffer on CUDA, a HostBuffer on the CPU. Move-only.
class OpsBuffer {
 public:
  OpsBuffer() = default;
  OpsBuffer(DeviceKind device, size_t bytes);
  void* data() const { return device_ == DeviceKind::Cuda ? device_buf_.data() : host_buf_.data(); }
  size_t size() const { return bytes_; }
  DeviceKind device() const { return device_; }
  // The whole buffer (or its start) seen as a tensor; throws InternalError when the shape does not fit.
  Tensor view(DType dtype, Shape shape) const;

 private:
  DeviceKind device_ = DeviceKind::Cpu;
  size_t bytes_ = 0;
  DeviceBuffer device_buf_;
  HostBuffer host_buf_;
};

// Fills a tensor on either device from `seed`: float dtypes uniform in [-scale, scale), I32 uniform in
// [0, scale). A host pattern of up to 1 Mi elements is generated once and copied over the tensor tile by
// tile on `stream`, which is synchronized before returning.
void fill_uniform(const Tensor& t, uint64_t seed, double scale, StreamRef stream = {});

// FLOP/s of c (n, n) = a (n, n) @ b^T (n, n) through ops.matmul (a linear layer's layout), 2 n^3 FLOPs per
// call, every operand in `dtype` (bf16 on CUDA, f32 on the CPU), accumulation in fp32; the median of `reps`
// timed calls after two untimed ones. `stream` must be the stream the ops were given with set_stream (the
// default stream when they never were). About n = 8192, reps = 10 on a GPU (well under a second on an
// H100) and n = 1024 on the CPU.
double measure_matmul_flops(Ops& ops, DType dtype, int64_t n, int reps, StreamRef stream = {});

// Bytes read + written per second by ops.copy between two f32 buffers of `bytes` each (2 * bytes per
// call); the median of `reps` timed calls after one untimed one.
double measure_copy_bandwidth(Ops& ops, size_t bytes, int reps, StreamRef stream = {});

}  // namespace shardtrain::ops
