// fp32 <-> bf16 casts on the device (round-to-nearest-even, as the CPU's shardtrain::bf16).
// FSDP uses the f32 -> bf16 cast to turn a master shard into the param_dtype shard it all-gathers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/runtime/device.hpp"

namespace shardtrain::kernels {

void cast_f32_to_bf16(const float* in, uint16_t* out, size_t n, StreamRef stream);
void cast_bf16_to_f32(const uint16_t* in, float* out, size_t n, StreamRef stream);

}  // namespace shardtrain::kernels
