// Batch layouts (docs/data.md). A sample is one row of seq_len inputs and seq_len targets:
//   packed: a split's documents joined as doc0 EOT doc1 EOT ... and cut into windows of seq_len + 1
//           tokens with stride seq_len (window i starts at token i*seq_len), so the inputs of
//           consecutive windows cover the stream without gaps; doc_ids give each position's document
//           (the EOT after a document belongs to it), so attention can be masked per document.
//   padded: the seed's layout, one document per sample: [BOT] doc [EOT] [PAD]..., cut to seq_len + 1;
//           targets that are padding are kIgnoreIndex; doc_ids are the document, -1 on padding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/sampler.hpp"
#include "shardtrain/runtime/device.hpp"

namespace shardtrain::data {

enum class BatchLayout { Packed, Padded };
BatchLayout parse_batch_layout(const std::string& s);  // packed|padded, throws UsageError
const char* batch_layout_name(BatchLayout l);

inline constexpr int32_t kIgnoreIndex = -100;

// One micro-batch, row-major (batch, seq) int32 arrays in one host buffer (runtime's PinnedBuffer:
// page-locked when CUDA is built and a device exists, so host-to-device copies are asynchronous). Move-only.
struct MicroBatch {
  int batch = 0, seq = 0;
  PinnedBuffer storage;           // tokens | targets | doc_ids
  std::span<int32_t> tokens;      // (B, S) input ids
  std::span<int32_t> targets;     // (B, S) next-token ids, kIgnoreIndex where no loss is taken
  std::span<int32_t> doc_ids;     // (B, S) document index per position (-1: padding)
  SamplerPosition position;       // the sampler position this micro-batch was taken at
  std::vector<uint64_t> samples;  // sample indices of the rows (in the loader's mixture, mixture.hpp)
  std::vector<uint32_t> sources;  // the mixture source of each row (0 with one dataset)
  size_t loss_tokens() const;     // targets that are not kIgnoreIndex
};

MicroBatch allocate_micro_batch(int batch, int seq);

// The samples of one split in one layout.
class SampleSource {
 public:
  SampleSource(const TokenDataset& dataset, DatasetSplit split, BatchLayout layout, int seq_len);
  size_t num_samples() const { return num_samples_; }
  int seq_len() const { return seq_len_; }
  BatchLayout layout() const { return layout_; }
  // Writes sample `i` into row pointers of length seq_len.
  void fill(uint64_t i, int32_t* tokens, int32_t* targets, int32_t* doc_ids) const;

 private:
  int32_t packed_at(uint64_t pos, int32_t* doc) const;  // token and document at a packed stream position

  const TokenDataset* dataset_;
  std::span<const int64_t> docs_;
  BatchLayout layout_;
  int seq_len_;
  int64_t eot_ = -1, bot_ = -1, pad_ = -1;
  std::vector<uint64_t> stream_start_;  // packed: stream offset of each split document (+ total at the end)
  size_t num_samples_ = 0;
};

// What a layout makes of a split at seq_len (`shardtrain dataset info`). Padded: documents whose
// [BOT] doc [EOT] does not fit seq_len + 1 positions (their EOT and possibly text is cut), the text tokens
// that never appear, and the share of input positions that are padding.
struct LayoutStats {
  size_t samples = 0;
  size_t documents_cut = 0;
  uint64_t tokens_cut = 0;
  double padding_fraction = 0;
};
LayoutStats layout_stats(const TokenDataset& dataset, DatasetSplit split, BatchLayout layout, int seq_len);

}  // namespace shardtrain::data
