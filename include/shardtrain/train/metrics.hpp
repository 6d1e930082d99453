// What the training loop measures and writes: one JSON line per step and per evaluation
// (<run_dir>/metrics.jsonl), the FLOPs per token behind MFU, and the process's peak resident memory.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/model/spec.hpp"

namespace shardtrain::train {

// Training FLOPs per token, the project's rule (docs/training.md, "MFU"): 6 * (parameters - input embedding)
// + 12 * layers * hidden * seq_len. Untied, the parameters include lm_head's own matrix; tied, the one shared
// matrix is the input embedding and is subtracted. The recompute of activation checkpointing is not counted.
// Every MFU figure (train's log and metrics, bench step, predict, plan) takes it from here.
double flops_per_token(const model::ModelSpec& spec, int64_t seq_len);

struct StepMetrics {
  int64_t step = 0;                   // 1-based: the step just finished
  uint64_t epoch = 0;                 // of the step's micro-batches (0-based; of its first where it spans two)
  int64_t tokens = 0;                 // input tokens seen so far, all ranks
  double loss = 0;                    // mean over the global batch's counted targets
  double lr = 0;                      // the rate this step used
  double grad_norm = 0;               // before clipping
  bool skipped = false;               // no update: a non-finite loss or norm, or a loss spike
  std::string skip_reason;            // when skipped: "nonfinite" or "loss_spike"
  double step_time_s = 0;             // data, forward, backward, optimizer (no eval, no checkpoint)
  double tokens_per_s = 0;            // step tokens / step_time_s
  double mfu = 0;                     // tokens_per_s * flops_per_token / (peak per rank * ranks), the peak of mfu.hpp
                                      // (a GPU's datasheet figure), never above 1
  double mfu_measured_peak = 0;       // the same against the matmul measured at start (NaN, null, when none was)
  int64_t peak_mem_bytes = 0;         // rank 0: on a GPU every byte shardtrain allocated there (device_memory_stats);
                                      // on the CPU the ledger peak: shards, gathered units, grads, comm buffers, optimizer
                                      // state; no activations (the model's arena is not in the ledger)
  int64_t rss_peak_bytes = 0;         // rank 0's peak resident set (VmHWM)
  uint64_t comm_shard_bytes = 0;      // this step, rank 0, shard axis (all collectives)
  uint64_t comm_replicate_bytes = 0;  // this step, rank 0, replicate axis
  uint64_t comm_world_bytes = 0;      // this step, rank 0, world (loss and token counts)
  // CPU offload on a GPU (the host update runs beside the next forward): the wall time of the update that
  // finished during this step (the previous step's), and how long this step waited for it. Both 0 otherwise.
  double host_update_s = 0;
  double update_wait_s = 0;
  // On a GPU, from the second step (train/step_timeline.hpp): the previous step's time on the compute stream,
  // the stream's idle time before this step's first op, and the host's time to queue this step's forward and
  // backward. Negative: not measured (the CPU, the first step).
  double gpu_busy_s = -1, gpu_idle_before_s = -1, host_queue_s = -1;
  double elapsed_s = 0;                                           // since the loop began
  std::vector<std::pair<std::string, int64_t>> tokens_by_source;  // a data mixture's input tokens so far, per source
};

// One source's validation loss, when training on a data mixture.
struct SourceLoss {
  std::string path;
  double loss = 0;
  int64_t tokens = 0;  // counted targets, all ranks
  int64_t bytes = 0;   // those targets' bytes, when evaluate() was given each id's byte length (else 0)
};

struct EvalMetrics {
  int64_t step = 0;
  int64_t tokens = 0;      // training tokens seen when evaluated
  double val_loss = 0;     // with a mixture: the sources' losses in the mixture's weights
  int64_t val_tokens = 0;  // counted targets, all ranks
  double eval_time_s = 0;
  std::vector<SourceLoss> by_source;  // with a mixture: each source's own (else empty)
};

// A rollback (optim.on_divergence = rollback): after step `step` diverged the run went back to `checkpoint`
// at `to_step` and skipped `skipped_samples` samples (all ranks) past the checkpoint's data position.
struct RollbackMetrics {
  int64_t step = 0;
  int64_t to_step = 0;
  std::string checkpoint;
  uint64_t skipped_samples = 0;
  int64_t rollbacks = 0;  // this one included
  std::string reason;
};

std::string to_json_line(const StepMetrics& m);      // {"kind":"train",...}, no newline
std::string to_json_line(const RollbackMetrics& m);  // {"kind":"rollback",...}
std::string to_json_line(const EvalMetrics& m);      // {"kind":"eval",...}

// Appends lines, each with one write(2), so a killed job keeps every finished step. A line the file system
// refuses (full, over a size limit) is dropped whole: the file is cut back to where it was, an error is logged
// once, and training goes on; the next line that can be written is preceded by {"kind":"metrics_gap",
// "dropped":N}. Every line of the file is valid JSON, whatever happened: a file found with its last line cut off
// part-way (a process or node that died inside a write) loses that fragment when the writer opens it, with a
// warning, so the next line is not joined to it. RAII over the descriptor.
// Given a directory for TensorBoard, each train and eval line also goes to an event file there as scalars
// (tensorboard.hpp; logging.tensorboard), so the two always hold the same values.
class TensorBoardWriter;
class MetricsWriter {
 public:
  // Throws IoError naming the path (or the event file). `tensorboard_dir` "": no TensorBoard events.
  explicit MetricsWriter(const std::string& path, const std::string& tensorboard_dir = {});
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const std::string& line);
  const std::string& path() const { return path_; }
  int64_t dropped() const { return dropped_; }  // lines lost since the last one written
  // The metrics file, or the TensorBoard event file, was removed (unlinked) while open: lines written now are lost.
  bool removed() const;
  const TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }  // null when off

 private:
  bool append(const std::string& line);  // false: dropped
  std::string path_;
  int fd_ = -1;
  int64_t dropped_ = 0;
  bool pending_newline_ = false;  // a cut-off last line that could not be removed: end it before the next line
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

int64_t peak_rss_bytes();  // VmHWM of this process; 0 when /proc is unavailable

}  // namespace shardtrain::train
