// Uniform and normal draws from Philox, and slice filling (see init.hpp).
#include "shardtrain/model/init.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::model {
namespace {

// 53-bit uniform in (0, 1): never 0, so log() is finite.
double unit_open(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi >> 5) << 26) | (lo >> 6);  // 27 + 26 bits
  return (static_cast<double>(bits) + 0.5) * 0x1p-53;
}

}  // namespace

double init_value(InitKind kind, double scale, uint64_t seed, uint64_t param_id, int64_t element) {
  if (kind == InitKind::Ones) return 1.0;
  const auto e = static_cast<uint64_t>(element);
  const auto r = philox4x32_10({static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(param_id),
                                static_cast<uint32_t>(param_id >> 32)},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const double u1 = unit_open(r[0], r[1]);
  if (kind == InitKind::Uniform) return scale * (2.0 * u1 - 1.0);
  const double u2 = unit_open(r[2], r[3]);
  return scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void init_param_slice(const ParamInfo& param, uint64_t seed, int64_t first, const ops::Tensor& out) {
  const int64_t count = out.numel();
  if (first < 0 || first + count > param.numel)
    throw InternalError(
        fmt::format("init {}: slice [{}, {}) is outside its {} elements", param.name, first, first + count, param.numel));
  if (out.device != DeviceKind::Cpu) throw InternalError(fmt::format("init {}: output is not in host memory", param.name));
  const auto fill = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; ++i) {
      const double v = init_value(param.init, param.init_scale, seed, param.stable_id, first + i);
      if constexpr (std::is_same_v<T, bf16>) dst[i] = bf16(static_cast<float>(v));
      else dst[i] = static_cast<T>(v);
    }
  };
  switch (out.dtype) {
    case DType::F32: fill(out.as<float>()); break;
    case DType::BF16: fill(out.as<bf16>()); break;
    case DType::F64: fill(out.as<double>()); break;
    default:
      throw InternalError(fmt::format("init {}: output dtype {} is not a float type", param.name, dtype_name(out.dtype)));
  }
}

}  // namespace shardtrain::model
