// Embedding forward (one block per token row) and backward (radix sort of (id, row) pairs, then one block per
// 64 sorted positions summing each run of equal ids in them in row order, and a second kernel adding up the
// pieces of runs that cross those segments, in order), 16 bytes per access where dim and alignment allow.
#if defined(__CUDACC__)
#include <cub/device/device_radix_sort.cuh>
#else
#include <algorithm>
#include <numeric>
#include <vector>
#endif

#include <climits>

#include "kernels/device_common.cuh"
#include "kernels/embedding.cuh"
#include "shardtrain/runtime/check.hpp"

namespace shardtrain::kernels {
namespace {

using detail::from_f32;
using detail::load_floats;
using detail::store_floats;
using detail::to_f32;

constexpr int kThreads = 128;
constexpr size_t kAlign = 256;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Radix-sort bits needed for keys in [0, vocab] (vocab is the sentinel of invalid ids).
int key_bits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= static_cast<uint64_t>(vocab)) ++bits;
  return bits;
}

// A stable sort of (key, row) pairs by the low `bits` bits of the keys; with temp == nullptr, only sets
// temp_bytes. cub's radix sort on the GPU; under the SIMT emulator, a host stable sort with the same contract.
int sort_pairs(void* temp, size_t& temp_bytes, const uint32_t* keys_in, uint32_t* keys_out, const int32_t* rows_in,
               int32_t* rows_out, int n, int bits, cudaStream_t stream) {
#if defined(__CUDACC__)
  return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, rows_in, rows_out, n, 0, bits, stream);
#else
  if (temp == nullptr) {
    temp_bytes = 0;
    return 0;
  }
  // Device work like cub's sort: queued on the stream (which the CUDA emulator runs when it gets to it).
  for (const void* p : {static_cast<const void*>(keys_in), static_cast<const void*>(keys_out),
                        static_cast<const void*>(rows_in), static_cast<const void*>(rows_out)})
    simt::check_device_range(p, static_cast<size_t>(n) * 4, "sort_pairs");
  simt::submit(
      stream,
      [=] {
        const uint32_t mask = bits >= 32 ? ~0u : (1u << bits) - 1;
        std::vector<int> order(static_cast<size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return (keys_in[a] & mask) < (keys_in[b] & mask); });
        for (int i = 0; i < n; ++i) {
          keys_out[i] = keys_in[order[static_cast<size_t>(i)]];
          rows_out[i] = rows_in[order[static_cast<size_t>(i)]];
        }
      },
      "sort_pairs (cub's radix sort, emulated)");
  return 0;
#endif
}

size_t radix_temp_bytes(int64_t n, int64_t vocab) {
  size_t bytes = 0;
  ST_CHECK_CUDA(sort_pairs(nullptr, bytes, nullptr, nullptr, nullptr, nullptr, static_cast<int>(n), key_bits(vocab), {}));
  return bytes;
}

// Sorted positions per block of the backward's first kernel.
constexpr int64_t kSegment = 64;

// The launcher's and the kernels'.
#if defined(__CUDACC__)
__host__ __device__
#endif
    inline int64_t
    segments_for(int64_t n) {
  return (n + kSegment - 1) / kSegment;
}

// Workspace regions, each 256-byte aligned: keys_in, keys_out (u32), rows_in, rows_out (i32), the fp32 sums of
// the pieces of runs that cross segments (head and tail, one row of dim per segment each), CUB temp.
struct Layout {
  size_t keys_in = 0, keys_out = 0, rows_in = 0, rows_out = 0, head = 0, tail = 0, temp = 0, temp_bytes = 0, total = 0;
  Layout(int64_t n, int64_t vocab, int64_t dim) {
    const size_t arr = align_up(static_cast<size_t>(n) * 4);
    const size_t pieces = align_up(static_cast<size_t>(segments_for(n) * dim) * sizeof(float));
    keys_out = arr;
    rows_in = 2 * arr;
    rows_out = 3 * arr;
    head = 4 * arr;
    tail = head + pieces;
    temp = tail + pieces;
    temp_bytes = radix_temp_bytes(n, vocab);
    total = temp + align_up(temp_bytes);
  }
};

// K elements per access: 16 bytes of the wider type when dim is a multiple of it and both arrays are 16-byte
// aligned, else 1 (the launchers decide).
template <int K, typename S, typename T>
ST_GLOBAL void embedding_forward_kernel(const int32_t* __restrict__ ids, int64_t n, const S* __restrict__ table,
                                        int64_t vocab, int64_t dim, T* __restrict__ out, DataErrorRecord* error) {
  for (int64_t row = simt::block_x(); row < n; row += simt::grid_x()) {
    const int32_t id = ids[row];
    T* dst = out + row * dim;
    const bool valid = id >= 0 && id < vocab;
    if (!valid && simt::thread_x() == 0) detail::record_data_error(error, DataErrorCode::TokenId, id, row, vocab);
    const S* src = table + static_cast<int64_t>(valid ? id : 0) * dim;
    for (int64_t j = int64_t(simt::thread_x()) * K; j < dim; j += int64_t(simt::block_dim_x()) * K) {
      float v[K] = {};
      if (valid) load_floats(src + j, v);
      store_floats(dst + j, v);
    }
  }
}

// keys = ids (invalid ones replaced by the sentinel `vocab`, which sorts last and is skipped), rows = 0..n-1.
ST_GLOBAL void embedding_prepare_keys_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t vocab,
                                             uint32_t* __restrict__ keys, int32_t* __restrict__ rows,
                                             DataErrorRecord* error) {
  const int64_t stride = int64_t(simt::grid_x()) * simt::block_dim_x();
  for (int64_t i = int64_t(simt::block_x()) * simt::block_dim_x() + simt::thread_x(); i < n; i += stride) {
    const int32_t id = ids[i];
    const bool ok = id >= 0 && id < vocab;
    if (!ok) detail::record_data_error(error, DataErrorCode::TokenId, id, i, vocab);
    keys[i] = ok ? static_cast<uint32_t>(id) : static_cast<uint32_t>(vocab);
    rows[i] = static_cast<int32_t>(i);
  }
}

// Block b sums sorted positions [64 b, 64 b + 64) piece by piece (a piece: the positions of one key in the
// segment, its rows in increasing order, as the sort is stable). A piece whose run lies wholly in the segment
// is added into dtable[key, :] (the running fp32 sum starts at the table's value: the CPU's order). The first
// piece, when its run began in an earlier segment, is summed from 0 into head[b, :]; the last, when its run
// begins here and goes on past the segment, into tail[b, :]; embedding_join_runs_kernel adds those. So a
// frequent token (thousands of rows in a step) no longer leaves one block summing it alone. Each thread loads
// kRowsAhead rows before it adds them (in the same order), K columns per access.
constexpr int kRowsAhead = 8;

template <int K, typename G, typename T>
ST_GLOBAL void embedding_accumulate_segments_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ rows,
                                                    int64_t n, const G* __restrict__ dout, int64_t dim,
                                                    T* __restrict__ dtable, int64_t vocab, float* __restrict__ head,
                                                    float* __restrict__ tail) {
  const int64_t segments = segments_for(n);
  for (int64_t b = simt::block_x(); b < segments; b += simt::grid_x()) {
    const int64_t s0 = b * kSegment, s1 = s0 + kSegment < n ? s0 + kSegment : n;
    for (int64_t start = s0; start < s1;) {
      const uint32_t key = keys[start];
      if (static_cast<int64_t>(key) >= vocab) break;  // the sentinel of invalid ids sorts last
      int64_t end = start + 1;
      while (end < s1 && keys[end] == key) ++end;
      const bool is_head = start == s0 && s0 > 0 && keys[s0 - 1] == key;
      const bool is_tail = !is_head && end == s1 && s1 < n && keys[s1] == key;
      float* const piece = is_head ? head + b * dim : is_tail ? tail + b * dim : nullptr;
      T* const dst = dtable + static_cast<int64_t>(key) * dim;
      for (int64_t j = int64_t(simt::thread_x()) * K; j < dim; j += int64_t(simt::block_dim_x()) * K) {
        float acc[K] = {};
        if (piece == nullptr) load_floats(dst + j, acc);
        int64_t r = start;
        for (; r + kRowsAhead <= end; r += kRowsAhead) {
          float v[kRowsAhead][K];
          for (int u = 0; u < kRowsAhead; ++u) load_floats(dout + static_cast<int64_t>(rows[r + u]) * dim + j, v[u]);
          for (int u = 0; u < kRowsAhead; ++u)
            for (int k = 0; k < K; ++k) acc[k] += v[u][k];
        }
        for (; r < end; ++r) {
          float v[K];
          load_floats(dout + static_cast<int64_t>(rows[r]) * dim + j, v);
          for (int k = 0; k < K; ++k) acc[k] += v[k];
        }
        if (piece == nullptr) {
          store_floats(dst + j, acc);
        } else {
          for (int k = 0; k < K; ++k) piece[j + k] = acc[k];
        }
      }
      start = end;
    }
  }
}

// Block b: when segment b ends in a tail piece, dtable[key, :] += tail[b, :], then head[c, :] for the segments
// c = b + 1, b + 2, ... the run goes on into, in order, in one fp32 sum rounded once.
template <typename T>
ST_GLOBAL void embedding_join_runs_kernel(const uint32_t* __restrict__ keys, int64_t n, int64_t dim, T* __restrict__ dtable,
                                          int64_t vocab, const float* __restrict__ head, const float* __restrict__ tail) {
  const int64_t segments = segments_for(n);
  for (int64_t b = simt::block_x(); b < segments; b += simt::grid_x()) {
    const int64_t s0 = b * kSegment, s1 = s0 + kSegment;
    if (s1 >= n) continue;
    const uint32_t key = keys[s1 - 1];
    if (static_cast<int64_t>(key) >= vocab || keys[s1] != key) continue;
    if (keys[s0] == key && s0 > 0 && keys[s0 - 1] == key) continue;  // the run began earlier: a head piece here
    T* const dst = dtable + static_cast<int64_t>(key) * dim;
    for (int64_t j = simt::thread_x(); j < dim; j += simt::block_dim_x()) {
      float acc = to_f32(dst[j]) + tail[b * dim + j];
      for (int64_t c = b + 1; c < segments && keys[c * kSegment] == key; ++c) acc += head[c * dim + j];
      dst[j] = from_f32<T>(acc);
    }
  }
}

constexpr int64_t kMaxBlocks = 1 << 20;

}  // namespace

void embedding_forward(const int32_t* ids, int64_t n, DType table_dtype, const void* table, int64_t vocab, int64_t dim,
                       DType out_dtype, void* out, DataErrorRecord* error, StreamRef stream) {
  if (n <= 0 || dim <= 0) return;
  const unsigned grid = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
  detail::dispatch_float(table_dtype, "embedding_forward", [&](auto stag) {
    using S = typename decltype(stag)::type;
    detail::dispatch_float(out_dtype, "embedding_forward", [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      detail::with_row_width<S, T>(
          dim,
          [&](auto width) {
            simt::launch(embedding_forward_kernel<decltype(width)::value, S, T>, grid, kThreads, 0,
                         detail::cuda_stream(stream), ids, n, static_cast<const S*>(table), vocab, dim, static_cast<T*>(out),
                         error);
            ST_CHECK_KERNEL("embedding_forward_kernel");
          },
          table, out);
    });
  });
}

size_t embedding_backward_workspace_bytes(int64_t n, int64_t vocab, int64_t dim) {
  if (n <= 0) return 0;
  if (n >= INT_MAX || vocab >= UINT32_MAX)
    throw InternalError("embedding_backward: " + std::to_string(n) + " tokens or vocabulary " + std::to_string(vocab) +
                        " exceeds the 32-bit radix sort");
  return Layout(n, vocab, dim).total;
}

void embedding_backward(const int32_t* ids, int64_t n, DType dout_dtype, const void* dout, int64_t dim, DType table_dtype,
                        void* dtable, int64_t vocab, void* workspace, size_t workspace_bytes, DataErrorRecord* error,
                        StreamRef stream) {
  if (n <= 0 || dim <= 0) return;
  const Layout L(n, vocab, dim);
  if (workspace_bytes < L.total)
    throw InternalError("embedding_backward: workspace of " + std::to_string(workspace_bytes) + " bytes, needs " +
                        std::to_string(L.total));
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(ws + L.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + L.keys_out);
  auto* rows_in = reinterpret_cast<int32_t*>(ws + L.rows_in);
  auto* rows_out = reinterpret_cast<int32_t*>(ws + L.rows_out);
  auto* head = reinterpret_cast<float*>(ws + L.head);
  auto* tail = reinterpret_cast<float*>(ws + L.tail);
  cudaStream_t s = detail::cuda_stream(stream);
  simt::launch(embedding_prepare_keys_kernel, detail::grid_for(n, 256), 256, 0, s, ids, n, vocab, keys_in, rows_in, error);
  ST_CHECK_KERNEL("embedding_prepare_keys_kernel");
  size_t temp_bytes = L.temp_bytes;
  ST_CHECK_CUDA(
      sort_pairs(ws + L.temp, temp_bytes, keys_in, keys_out, rows_in, rows_out, static_cast<int>(n), key_bits(vocab), s));
  const int64_t segments = segments_for(n);
  const unsigned grid = static_cast<unsigned>(segments < kMaxBlocks ? segments : kMaxBlocks);
  detail::dispatch_float(dout_dtype, "embedding_backward", [&](auto gtag) {
    using G = typename decltype(gtag)::type;
    detail::dispatch_float(table_dtype, "embedding_backward", [&](auto ttag) {
      using T = typename decltype(ttag)::type;
      detail::with_row_width<G, T>(
          dim,
          [&](auto width) {
            simt::launch(embedding_accumulate_segments_kernel<decltype(width)::value, G, T>, grid, kThreads, 0, s, keys_out,
                         rows_out, n, static_cast<const G*>(dout), dim, static_cast<T*>(dtable), vocab, head, tail);
            ST_CHECK_KERNEL("embedding_accumulate_segments_kernel");
          },
          dout, dtable);
      if (segments > 1) {
        simt::launch(embedding_join_runs_kernel<T>, grid, kThreads, 0, s, keys_out, n, dim, static_cast<T*>(dtable), vocab,
                     static_cast<const float*>(head), static_cast<const float*>(tail));
        ST_CHECK_KERNEL("embedding_join_runs_kernel");
      }
    });
  });
}

}  // namespace shardtrain::kernels
