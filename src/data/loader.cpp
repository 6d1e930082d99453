// Background loader (loader.hpp): one producer thread, a bounded queue, buffer recycling.
#include "shardtrain/data/loader.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::data {

namespace {
SamplerOptions sampler_options(const MixedSource& src, const LoaderOptions& o) {
  src.require_global_batch(o.global_batch_size);
  return SamplerOptions{src.num_samples(), o.micro_batch_size, o.global_batch_size, o.dp_rank, o.dp_size, o.seed, o.shuffle};
}
}  // namespace

Loader::Loader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options)
    : Loader(std::vector<MixtureComponent>{{std::move(dataset), 1.0}}, options) {}

Loader::Loader(std::vector<MixtureComponent> sources, LoaderOptions options)
    : options_(options),
      source_(std::move(sources), options.split, options.layout, options.seq_len, options.seed, options.shuffle),
      sampler_(sampler_options(source_, options)) {
  if (options_.prefetch < 1) options_.prefetch = 1;
  if (options_.start.index >= sampler_.micro_batches_per_epoch())
    throw CheckpointError(
        fmt::format("loader: saved position {} is past the epoch's {} micro-batches (different dataset, "
                    "batch size or world size?)",
                    to_string(options_.start), sampler_.micro_batches_per_epoch()));
  consumer_pos_ = producer_pos_ = options_.start;
  // Every buffer a steady run has in flight at once (the queue and what the consumer holds), made here: with
  // them made on demand, how many exist by step N depended on how far ahead the thread ran, and a later step
  // could still allocate page-locked memory (a host synchronization on a GPU).
  for (size_t i = 0; i < options_.prefetch + options_.held; ++i)
    free_.push_back(allocate_micro_batch(options_.micro_batch_size, options_.seq_len));
  start_thread();
}

Loader::~Loader() { stop_thread(); }

void Loader::start_thread() {
  stop_ = false;
  thread_ = std::thread([this] { produce(); });
}

void Loader::stop_thread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Loader::produce() {
  try {
    while (true) {
      MicroBatch mb;
      SamplerPosition pos;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < options_.prefetch; });
        if (stop_) return;
        pos = producer_pos_;
        producer_pos_ = sampler_.advance(producer_pos_);
        if (!free_.empty()) {
          mb = std::move(free_.back());
          free_.pop_back();
        }
      }
      if (mb.tokens.empty()) mb = allocate_micro_batch(options_.micro_batch_size, options_.seq_len);
      mb.position = pos;
      source_.check_unchanged();  // a file written in place stops the run here, not with SIGBUS or other tokens
      sampler_.micro_batch(pos.epoch, pos.index, mb.samples);
      const auto s = static_cast<size_t>(options_.seq_len);
      for (size_t r = 0; r < mb.samples.size(); ++r)
        mb.sources[r] = source_.fill(pos.epoch, mb.samples[r], mb.tokens.data() + r * s, mb.targets.data() + r * s,
                                     mb.doc_ids.data() + r * s);
      {
        std::lock_guard lock(mutex_);
        if (stop_) return;
        queue_.push_back(std::move(mb));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

MicroBatch Loader::next() {
  std::unique_lock lock(mutex_);
  if (queue_.empty()) ++waits_;
  cv_.wait(lock, [&] { return !queue_.empty() || error_; });
  if (queue_.empty() && error_) std::rethrow_exception(error_);
  MicroBatch mb = std::move(queue_.front());
  queue_.pop_front();
  consumer_pos_ = sampler_.advance(mb.position);
  lock.unlock();
  cv_.notify_all();
  return mb;
}

void Loader::recycle(MicroBatch&& used) {
  std::lock_guard lock(mutex_);
  if (used.batch == options_.micro_batch_size && used.seq == options_.seq_len &&
      free_.size() < options_.prefetch + options_.held)
    free_.push_back(std::move(used));
}

SamplerPosition Loader::position() const {
  std::lock_guard lock(mutex_);
  return consumer_pos_;
}

void Loader::seek(SamplerPosition p) {
  if (p.index >= sampler_.micro_batches_per_epoch())
    throw CheckpointError(fmt::format("loader: position {} is past the epoch's {} micro-batches", to_string(p),
                                      sampler_.micro_batches_per_epoch()));
  stop_thread();
  {
    std::lock_guard lock(mutex_);
    while (!queue_.empty()) {
      if (free_.size() < options_.prefetch + options_.held) free_.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    consumer_pos_ = producer_pos_ = p;
    error_ = nullptr;
  }
  start_thread();
}

uint64_t Loader::waits() const {
  std::lock_guard lock(mutex_);
  return waits_;
}

}  // namespace shardtrain::data
