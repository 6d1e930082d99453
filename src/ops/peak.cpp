// Measured matmul and copy ceilings, and the benchmark memory helpers (peak.hpp).
#include "shardtrain/ops/peak.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "shardtrain/runtime/dtype.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/timer.hpp"

namespace shardtrain::ops {

OpsBuffer::OpsBuffer(DeviceKind device, size_t bytes) : device_(device), bytes_(bytes) {
  if (device == DeviceKind::Cuda) device_buf_ = DeviceBuffer(bytes);
  else host_buf_ = HostBuffer(bytes);
}

Tensor OpsBuffer::view(DType dtype, Shape shape) const {
  const size_t need = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (need > bytes_)
    throw InternalError(fmt::format("OpsBuffer::view: {} {} needs {} bytes, the buffer has {}", dtype_name(dtype),
                                    shape.str(), need, bytes_));
  return make_tensor(data(), dtype, shape, device_);
}

void fill_uniform(const Tensor& t, uint64_t seed, double scale, StreamRef stream) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const int64_t tile = std::min<int64_t>(n, int64_t{1} << 20);
  const size_t esize = dtype_size(t.dtype);
  std::vector<char> pattern(static_cast<size_t>(tile) * esize);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  for (int64_t i = 0; i < tile; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;                    // xorshift64
    const double u = static_cast<double>(x >> 11) * 0x1.0p-53;  // [0, 1)
    char* p = pattern.data() + static_cast<size_t>(i) * esize;
    switch (t.dtype) {
      case DType::F32: *reinterpret_cast<float*>(p) = static_cast<float>((2 * u - 1) * scale); break;
      case DType::BF16: *reinterpret_cast<bf16*>(p) = bf16(static_cast<float>((2 * u - 1) * scale)); break;
      case DType::F64: *reinterpret_cast<double*>(p) = (2 * u - 1) * scale; break;
      case DType::I32: *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(u * scale); break;
      default: throw InternalError(fmt::format("fill_uniform: {} tensors are not supported", dtype_name(t.dtype)));
    }
  }
  for (int64_t first = 0; first < n; first += tile) {
    const int64_t count = std::min(tile, n - first);
    copy_async(static_cast<char*>(t.data) + static_cast<size_t>(first) * esize, pattern.data(),
               static_cast<size_t>(count) * esize, stream);
  }
  stream_synchronize(stream);  // the pattern goes out of scope
}

double measure_matmul_flops(Ops& ops, DType dtype, int64_t n, int reps, StreamRef stream) {
  if (n < 1 || reps < 1)
    throw InternalError(fmt::format("measure_matmul_flops: n = {} and reps = {} must be positive", n, reps));
  const size_t bytes = static_cast<size_t>(n * n) * dtype_size(dtype);
  const OpsBuffer a(ops.device(), bytes), b(ops.device(), bytes), c(ops.device(), bytes);
  const Tensor ta = a.view(dtype, {n, n}), tb = b.view(dtype, {n, n}), tc = c.view(dtype, {n, n});
  fill_uniform(ta, 1, 1.0, stream);
  fill_uniform(tb, 2, 1.0, stream);
  const double s = median_call_seconds(ops.device(), stream, 2, reps,
                                       [&] { ops.matmul(Transpose::No, Transpose::Yes, 1.0, ta, tb, 0.0, tc); });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s;
}

double measure_copy_bandwidth(Ops& ops, size_t bytes, int reps, StreamRef stream) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  if (n < 1 || reps < 1)
    throw InternalError(fmt::format("measure_copy_bandwidth: {} bytes and reps = {} must be positive", bytes, reps));
  const OpsBuffer src(ops.device(), bytes), dst(ops.device(), bytes);
  const Tensor ts = src.view(DType::F32, {n}), td = dst.view(DType::F32, {n});
  ops.fill(ts, 1.0);
  ops.fill(td, 0.0);
  const double s = median_call_seconds(ops.device(), stream, 1, reps, [&] { ops.copy(ts, td); });
  return 2.0 * static_cast<double>(n) * sizeof(float) / s;
}

}  // namespace shardtrain::ops
