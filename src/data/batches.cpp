// Packed and padded samples (batches.hpp).
#include "shardtrain/data/batches.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data {

BatchLayout parse_batch_layout(const std::string& s) {
  if (s == "packed") return BatchLayout::Packed;
  if (s == "padded") return BatchLayout::Padded;
  throw UsageError(fmt::format("unknown batch layout '{}': expected packed or padded", s));
}

const char* batch_layout_name(BatchLayout l) { return l == BatchLayout::Packed ? "packed" : "padded"; }

size_t MicroBatch::loss_tokens() const {
  return static_cast<size_t>(std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; }));
}

MicroBatch allocate_micro_batch(int batch, int seq) {
  MicroBatch mb;
  mb.batch = batch;
  mb.seq = seq;
  const size_t n = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  mb.storage = PinnedBuffer(3 * n * sizeof(int32_t));  // page-locked where CUDA runs, aligned host memory otherwise
  auto* base = static_cast<int32_t*>(mb.storage.data());
  mb.tokens = {base, n};
  mb.targets = {base + n, n};
  mb.doc_ids = {base + 2 * n, n};
  mb.samples.resize(static_cast<size_t>(batch));
  mb.sources.assign(static_cast<size_t>(batch), 0);
  return mb;
}

SampleSource::SampleSource(const TokenDataset& dataset, DatasetSplit split, BatchLayout layout, int seq_len)
    : dataset_(&dataset), docs_(dataset.split_documents(split)), layout_(layout), seq_len_(seq_len) {
  if (seq_len < 1) throw ConfigError(fmt::format("seq_len must be >= 1 (got {})", seq_len));
  const auto& info = dataset.info();
  eot_ = info.eot_id ? int64_t{*info.eot_id} : -1;
  bot_ = info.bot_id ? int64_t{*info.bot_id} : -1;
  pad_ = info.pad_id ? int64_t{*info.pad_id} : eot_;
  if (layout == BatchLayout::Packed) {
    if (eot_ < 0)
      throw DataError(fmt::format("{}: the packed layout needs an end-of-text token, and tokenizer {} has none",
                                  dataset.path(), info.tokenizer_name));
    stream_start_.reserve(docs_.size() + 1);
    uint64_t pos = 0;
    for (int64_t d : docs_) {
      stream_start_.push_back(pos);
      pos += dataset.document_size(static_cast<size_t>(d)) + 1;  // + EOT
    }
    stream_start_.push_back(pos);
    num_samples_ = pos > 1 ? (pos - 1) / static_cast<uint64_t>(seq_len) : 0;
  } else {
    if (eot_ < 0)
      throw DataError(fmt::format("{}: the padded layout needs an end-of-text token, and tokenizer {} has none",
                                  dataset.path(), info.tokenizer_name));
    num_samples_ = docs_.size();
  }
  if (num_samples_ == 0 && docs_.empty())  // not a matter of seq_len: there is nothing in it
    throw DataError(fmt::format("{}: the {} split is empty (0 documents, 0 tokens){}", dataset.path(),
                                dataset_split_name(split),
                                split == DatasetSplit::Validation && info.validation_fraction == 0
                                    ? ": prepare-data held no document out (--validation-fraction 0)"
                                    : ""));
  if (num_samples_ == 0)
    throw DataError(fmt::format("{}: the {} split has no {} sample of seq_len {}", dataset.path(), dataset_split_name(split),
                                batch_layout_name(layout), seq_len));
}

int32_t SampleSource::packed_at(uint64_t pos, int32_t* doc) const {
  const auto it = std::upper_bound(stream_start_.begin(), stream_start_.end(), pos);
  const size_t k = static_cast<size_t>(it - stream_start_.begin()) - 1;
  const size_t d = static_cast<size_t>(docs_[k]);
  *doc = static_cast<int32_t>(d);
  const auto tokens = dataset_->document(d);
  const uint64_t off = pos - stream_start_[k];
  return off < tokens.size() ? static_cast<int32_t>(tokens[off]) : static_cast<int32_t>(eot_);
}

void SampleSource::fill(uint64_t i, int32_t* tokens, int32_t* targets, int32_t* doc_ids) const {
  const auto s = static_cast<size_t>(seq_len_);
  if (layout_ == BatchLayout::Packed) {
    // Walk the window [i*S, i*S + S] document by document instead of searching every position.
    uint64_t pos = i * s;
    int32_t doc = 0;
    int32_t prev = packed_at(pos, &doc);
    size_t k =
        static_cast<size_t>(std::upper_bound(stream_start_.begin(), stream_start_.end(), pos) - stream_start_.begin()) - 1;
    size_t dk = k;  // the document dtoks holds
    auto dtoks = dataset_->document(static_cast<size_t>(docs_[k]));
    for (size_t j = 0; j < s; ++j) {
      tokens[j] = prev;
      doc_ids[j] = static_cast<int32_t>(docs_[k]);
      ++pos;
      while (pos >= stream_start_[k + 1]) ++k;
      if (k != dk) dtoks = dataset_->document(static_cast<size_t>(docs_[dk = k]));
      const uint64_t off = pos - stream_start_[k];
      prev = off < dtoks.size() ? static_cast<int32_t>(dtoks[off]) : static_cast<int32_t>(eot_);
      targets[j] = prev;
    }
    return;
  }
  // padded: [BOT] doc [EOT] then padding, s + 1 positions.
  const auto d = static_cast<size_t>(docs_[i]);
  const auto doc = dataset_->document(d);
  const size_t lead = bot_ >= 0 ? 1 : 0;
  const size_t length = lead + doc.size() + 1;  // real positions in the padded sequence
  auto at = [&](size_t p) -> int32_t {
    if (p < lead) return static_cast<int32_t>(bot_);
    if (p < lead + doc.size()) return static_cast<int32_t>(doc[p - lead]);
    if (p == lead + doc.size()) return static_cast<int32_t>(eot_);
    return static_cast<int32_t>(pad_);
  };
  for (size_t j = 0; j < s; ++j) {
    tokens[j] = at(j);
    targets[j] = j + 1 < length ? at(j + 1) : kIgnoreIndex;
    doc_ids[j] = j < length ? static_cast<int32_t>(d) : -1;
  }
}

LayoutStats layout_stats(const TokenDataset& dataset, DatasetSplit split, BatchLayout layout, int seq_len) {
  LayoutStats st;
  try {
    st.samples = SampleSource(dataset, split, layout, seq_len).num_samples();
  } catch (const DataError&) {
    return st;  // no sample in this layout
  }
  if (layout != BatchLayout::Padded) return st;
  const uint64_t lead = dataset.info().bot_id ? 1 : 0, seq = static_cast<uint64_t>(seq_len);
  uint64_t real_inputs = 0;
  for (int64_t d : dataset.split_documents(split)) {
    const uint64_t n = dataset.document_size(static_cast<size_t>(d)), length = lead + n + 1;
    if (n > seq - lead) ++st.documents_cut;                         // its EOT is past the last target
    if (n + lead > seq + 1) st.tokens_cut += n + lead - (seq + 1);  // text never an input or a target
    real_inputs += std::min(length, seq);
  }
  const double inputs = static_cast<double>(st.samples) * static_cast<double>(seq);
  st.padding_fraction = inputs > 0 ? 1.0 - static_cast<double>(real_inputs) / inputs : 0.0;
  return st;
}

}  // namespace shardtrain::data
