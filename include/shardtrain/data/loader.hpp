// The training loader: a background thread fills the next micro-batches (sampler -> samples -> pinned
// host buffers) into a bounded queue, so the step never waits on data. position() is what a checkpoint
// stores; a Loader built with that position (or seek()ed to it) continues with exactly the same samples.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "shardtrain/data/batches.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/data/mixture.hpp"
#include "shardtrain/data/sampler.hpp"

namespace shardtrain::data {

struct LoaderOptions {
  DatasetSplit split = DatasetSplit::Train;
  BatchLayout layout = BatchLayout::Packed;
  int seq_len = 512;
  int micro_batch_size = 1;   // per data-parallel rank
  int global_batch_size = 1;  // micro_batch_size x dp_size x gradient accumulation steps
  int dp_rank = 0;
  int dp_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  size_t prefetch = 4;  // micro-batches kept ready
  // Micro-batches the consumer holds at most between next() and recycle() (the trainer: a step's and the next
  // step's, read ahead): with `prefetch`, how many recycled buffers are kept, so a steady run allocates none.
  size_t held = 2;
  SamplerPosition start{};  // resume here
};

class Loader {
 public:
  Loader(std::shared_ptr<const TokenDataset> dataset, LoaderOptions options);
  // Samples from several datasets in proportion to their weights (mixture.hpp); one source gives exactly
  // the samples of the constructor above.
  Loader(std::vector<MixtureComponent> sources, LoaderOptions options);
  ~Loader();  // stops and joins the thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next micro-batch (blocks only if the thread is behind); epochs roll over on their own. Rethrows
  // an exception raised on the loader thread.
  MicroBatch next();
  // Hands a consumed micro-batch's buffer back for reuse (optional; saves page-locked allocations).
  void recycle(MicroBatch&& used);
  // The position of the micro-batch the next call to next() returns: save this in a checkpoint.
  SamplerPosition position() const;
  void seek(SamplerPosition p);  // drops what is queued and restarts the thread at p

  const DistributedSampler& sampler() const { return sampler_; }
  const MixedSource& source() const { return source_; }
  const LoaderOptions& options() const { return options_; }
  size_t micro_batches_per_epoch() const { return sampler_.micro_batches_per_epoch(); }
  int accumulation_steps() const { return sampler_.accumulation_steps(); }
  uint64_t waits() const;  // times next() found the queue empty (the step waited on data)

 private:
  void start_thread();
  void stop_thread();
  void produce();

  LoaderOptions options_;
  MixedSource source_;
  DistributedSampler sampler_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<MicroBatch> queue_;
  std::vector<MicroBatch> free_;
  SamplerPosition consumer_pos_;  // next to be returned
  SamplerPosition producer_pos_;  // next to be made
  bool stop_ = false;
  std::exception_ptr error_;
  uint64_t waits_ = 0;
  std::thread thread_;
};

}  // namespace shardtrain::data
