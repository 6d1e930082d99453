// TensorBoard event files beside metrics.jsonl (rank 0): <run_dir>/events.out.tfevents.<time>.<host>, which
// `tensorboard --logdir runs/` reads. Each record is TFRecord-framed (uint64 length, masked CRC-32C of the
// length, an Event protobuf, masked CRC-32C of the Event); the first Event names the file version, each later
// one holds the scalars of one metrics.jsonl line (docs/training.md, "TensorBoard").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::train {

struct TensorBoardScalar {
  std::string tag;   // "<kind>/<key>", or "<kind>/<key>/<name>" inside an object: "train/loss", "train/comm_bytes/shard"
  double value = 0;  // written as TensorBoard's simple_value, a float
};

// The scalars of one metrics.jsonl line and its step: every number of a "train" or "eval" line but the step,
// objects of numbers one level down (comm_bytes per mesh axis, val_loss_by_source per source). None for
// other kinds, for a line that is not JSON or has no step, and none for a null (a NaN loss: TensorBoard then
// shows a gap, as the plots do).
std::vector<TensorBoardScalar> tensorboard_scalars(const std::string& json_line, int64_t* step);

// The checksum of TFRecord frames: CRC-32C (Castagnoli) rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);
// One TFRecord frame around `data`: uint64 length and uint32 CRCs, little-endian.
std::string tfrecord(std::string_view data);

// One event file, appended with one write(2) per record: a record is in the file when write_scalars returns
// (flushed per record, so a preemption save or a killed job loses none), and a record the file system refuses
// (full, over a size limit) is dropped whole, cut back off, logged once, and training goes on. RAII over the
// descriptor.
class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host> (".N" added if a run started the same second has
  // one) and writes the file-version Event. Throws IoError naming the file.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);  // one Event, at wall time now
  void write_metrics_line(const std::string& json_line);                            // its tensorboard_scalars, if it has any
  const std::string& path() const { return path_; }
  bool removed() const;                         // the event file was unlinked while open
  int64_t dropped() const { return dropped_; }  // records lost since the last one written

 private:
  void append(const std::string& record);
  std::string path_;
  int fd_ = -1;
  int64_t dropped_ = 0;
};

}  // namespace shardtrain::train
