// Sum of squares: a first pass with a grid fixed by n (each thread squares in fp32 and sums in double, 16
// bytes per load where x is 16-byte aligned; each block writes one partial), then one block adds the partials
// in order.
#include "kernels/device_common.cuh"
#include "kernels/sum_squares.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

template <typename T>
ST_GLOBAL void sum_squares_partial_kernel(const T* __restrict__ x, int64_t n, bool vec, double* __restrict__ partial) {
  ST_SHARED(double, shared, 32);
  double acc = 0.0;
  detail::for_each_vector<detail::vector_width<T>()>(n, vec, [&](int64_t i, auto width) {
    float v[decltype(width)::value];
    detail::load_floats(x + i, v);
    for (float e : v) acc += static_cast<double>(e * e);
  });
  acc = detail::block_sum<kThreads>(acc, shared);
  if (simt::thread_x() == 0) partial[simt::block_x()] = acc;
}

ST_GLOBAL void sum_squares_final_kernel(const double* __restrict__ partial, int blocks, double* __restrict__ out,
                                        bool accumulate) {
  ST_SHARED(double, shared, 32);
  double acc = 0.0;
  for (int i = simt::thread_x(); i < blocks; i += simt::block_dim_x()) acc += partial[i];
  acc = detail::block_sum<kThreads>(acc, shared);
  if (simt::thread_x() == 0) *out = accumulate ? *out + acc : acc;
}

}  // namespace

size_t sum_squares_workspace_bytes() { return kMaxBlocks * sizeof(double); }

void sum_squares(DType dtype, const void* x, int64_t n, double* out, ReduceInto mode, void* workspace,
                 size_t workspace_bytes, StreamRef stream) {
  if (workspace_bytes < sum_squares_workspace_bytes())
    throw InternalError("sum_squares: workspace of " + std::to_string(workspace_bytes) + " bytes is too small");
  cudaStream_t s = detail::cuda_stream(stream);
  auto* partial = static_cast<double*>(workspace);
  const unsigned blocks = n > 0 ? detail::grid_for(n, kThreads * 4, kMaxBlocks) : 0;
  if (blocks > 0) {
    detail::dispatch_float(dtype, "sum_squares", [&](auto tag) {
      using T = typename decltype(tag)::type;
      simt::launch(sum_squares_partial_kernel<T>, blocks, kThreads, 0, s, static_cast<const T*>(x), n, detail::aligned16(x),
                   partial);
      ST_CHECK_KERNEL("sum_squares_partial_kernel");
    });
  }
  simt::launch(sum_squares_final_kernel, 1, kThreads, 0, s, partial, static_cast<int>(blocks), out,
               mode == ReduceInto::Accumulate);
  ST_CHECK_KERNEL("sum_squares_final_kernel");
}

}  // namespace shardtrain::kernels
