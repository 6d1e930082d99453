// Embedding lookup and its deterministic backward. ids (n) i32; table and dtable (vocab, dim); out and
// dout (n, dim); f32 or bf16 storage on either side. An id outside [0, vocab) is recorded in `error`
// (DataErrorCode::TokenId); forward writes a zero row for it and backward skips it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/data_error.cuh"
#include "shardtrain/runtime/device.hpp"
#include "shardtrain/runtime/dtype.hpp"

namespace shardtrain::kernels {

// out[i, :] = table[ids[i], :]
void embedding_forward(const int32_t* ids, int64_t n, DType table_dtype, const void* table, int64_t vocab, int64_t dim,
                       DType out_dtype, void* out, DataErrorRecord* error, StreamRef stream);

// Workspace for embedding_backward with these sizes (sorted keys and rows, CUB's radix-sort storage).
size_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab);

// dtable[ids[i], :] += dout[i, :] (accumulates). The (id, row) pairs are radix-sorted (stable), then one
// block per distinct id adds that id's rows in token order into a running fp32 sum that starts at the
// table's value: no atomics, the same bits every run, and for f32 the CPU backend's exact order.
void embedding_backward(const int32_t* ids, int64_t n, DType dout_dtype, const void* dout, int64_t dim,
                        DType table_dtype, void* dtable, int64_t vocab, void* workspace, size_t workspace_bytes,
                        DataErrorRecord* error, StreamRef stream);

}  // namespace shardtrain::kernels
