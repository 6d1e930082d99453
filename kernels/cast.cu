// fp32 <-> bf16 casts: elementwise_copy's converting kernel (16-byte vectors where both pointers allow).
#include "kernels/cast.cuh"
#include "kernels/elementwise.cuh"

namespace shardtrain::kernels {

void cast_f32_to_bf16(const float* in, uint16_t* out, size_t n, StreamRef stream) {
  elementwise_copy(DType::F32, in, DType::BF16, out, static_cast<int64_t>(n), stream);
}

void cast_bf16_to_f32(const uint16_t* in, float* out, size_t n, StreamRef stream) {
  elementwise_copy(DType::BF16, in, DType::F32, out, static_cast<int64_t>(n), stream);
}

}  // namespace shardtrain::kernels
