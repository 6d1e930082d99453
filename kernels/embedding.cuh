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

// Workspace for embedding_backward with these sizes (sorted keys and rows, the fp32 sums of pieces of runs,
// CUB's radix-sort storage).
size_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab, int64_t dim);

// dtable[ids[i], :] += dout[i, :] (accumulates). The (id, row) pairs are radix-sorted (stable); one block per 64
// sorted positions adds each id's rows there in token order into a running fp32 sum that starts at the table's
// value (the CPU backend's exact order for an id whose rows all sort into one segment); an id whose rows cross
// segments is summed piece by piece, the pieces then added in order. No atomics: the same bits every run.
void embedding_backward(const int32_t* ids, int64_t n, DType dout_dtype, const void* dout, int64_t dim, DType table_dtype,
                        void* dtable, int64_t vocab, void* workspace, size_t workspace_bytes, DataErrorRecord* error,
                        StreamRef stream);

}  // namespace shardtrain::kernels
