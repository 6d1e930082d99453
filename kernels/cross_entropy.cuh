// Cross-entropy over rows of logits (rows, vocab) with fp32 math, ignore_index, and optionally the scaled
// gradient; and the deterministic sum of the per-row losses. The fused lm_head loss (src/ops/cuda) calls
// both on chunks of rows.
#pragma once

#include <cstdint>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

// What cross_entropy_sum writes (device memory).
struct LossSumsDevice {
  double loss_sum = 0;  // sum of -log p(target) over counted rows
  int64_t tokens = 0;   // rows whose target is not ignore_index
};

// One block per row i: row_loss[i] = logsumexp(z_i) - z_i[t_i] (online max/sum), 0 when t_i == ignore_index.
// When dlogits is non-null it receives grad_scale * (softmax(z_i) - onehot(t_i)), a zero row for ignored
// targets. dlogits may be the same memory as logits (same dtype): each element is read before it is
// overwritten, by the same thread. A target outside [0, vocab) that is not ignore_index is recorded in
// `error` (DataErrorCode::Target, index = first_row + i, aux = ignore_index); its loss is 0 and its
// gradient row zero.
void cross_entropy_rows(DType logits_dtype, const void* logits, int64_t rows, int64_t vocab, const int32_t* targets,
                        int32_t ignore_index, float grad_scale, DType dlogits_dtype, void* dlogits, float* row_loss,
                        int64_t first_row, DataErrorRecord* error, StreamRef stream);

// out->loss_sum = sum of row_loss[i] (in double, fixed order) and out->tokens = count, over the n rows
// whose target is not ignore_index; when total is non-null the same sums are also added into *total (the
// deferred loss of several calls, in call order). One block.
void cross_entropy_sum(const float* row_loss, const int32_t* targets, int64_t n, int32_t ignore_index, LossSumsDevice* out,
                       LossSumsDevice* total, StreamRef stream);

}  // namespace shardtrain::kernels
