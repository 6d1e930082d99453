// Metrics lines, FLOPs per token and peak RSS (metrics.hpp).
#include "shardtrain/train/metrics.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "file_append.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/train/tensorboard.hpp"

namespace shardtrain::train {

double flops_per_token(const model::ModelSpec& spec, int64_t seq_len) {
  const auto& c = spec.config();
  const double embed = static_cast<double>(spec.param(spec.embed_param()).numel);
  // The rule (docs/training.md, "MFU"): 6 * (parameters - input embedding), tied or not. Tied, num_params counts
  // the shared matrix once and the input embedding is that matrix, so the lm_head's matmul is not counted either
  // (it was, as 6 * num_params: Llama 3.2 1B's shape read 8.22 GFLOP a token instead of 6.64, audit I1).
  const double matmul_params = static_cast<double>(spec.num_params()) - embed;
  return 6.0 * matmul_params + 12.0 * static_cast<double>(c.num_hidden_layers * c.hidden_size * seq_len);
}

namespace {
// JSON numbers cannot be NaN or infinity: those become null (a skipped step's loss, say).
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

std::string to_json_line(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["kind"] = "train";
  j["step"] = m.step;
  j["epoch"] = m.epoch;
  j["tokens"] = m.tokens;
  j["loss"] = number(m.loss);
  j["lr"] = m.lr;
  j["grad_norm"] = number(m.grad_norm);
  j["skipped"] = m.skipped;
  if (m.skipped) j["skip_reason"] = m.skip_reason;
  j["step_time_s"] = m.step_time_s;
  j["tokens_per_s"] = m.tokens_per_s;
  j["mfu"] = m.mfu;
  j["mfu_measured_peak"] = number(m.mfu_measured_peak);
  if (m.gpu_busy_s >= 0) {
    j["gpu_busy_prev_s"] = m.gpu_busy_s;
    j["gpu_idle_before_s"] = m.gpu_idle_before_s;
    j["host_queue_s"] = m.host_queue_s;
  }
  j["peak_mem_bytes"] = m.peak_mem_bytes;
  j["rss_peak_bytes"] = m.rss_peak_bytes;
  j["comm_bytes"] = {{"shard", m.comm_shard_bytes}, {"replicate", m.comm_replicate_bytes}, {"world", m.comm_world_bytes}};
  if (m.host_update_s > 0 || m.update_wait_s > 0) {
    j["host_update_s"] = m.host_update_s;
    j["update_wait_s"] = m.update_wait_s;
  }
  j["elapsed_s"] = m.elapsed_s;
  if (!m.tokens_by_source.empty()) {
    nlohmann::ordered_json by = nlohmann::ordered_json::object();
    for (const auto& [path, tokens] : m.tokens_by_source) by[path] = tokens;
    j["tokens_by_source"] = by;
  }
  return json_text(j);
}

std::string to_json_line(const RollbackMetrics& m) {
  nlohmann::ordered_json j;
  j["kind"] = "rollback";
  j["step"] = m.step;
  j["to_step"] = m.to_step;
  j["checkpoint"] = m.checkpoint;
  j["skipped_samples"] = m.skipped_samples;
  j["rollbacks"] = m.rollbacks;
  j["reason"] = m.reason;
  return json_text(j);
}

std::string to_json_line(const EvalMetrics& m) {
  nlohmann::ordered_json j;
  j["kind"] = "eval";
  j["step"] = m.step;
  j["tokens"] = m.tokens;
  j["val_loss"] = number(m.val_loss);
  j["val_tokens"] = m.val_tokens;
  if (!m.by_source.empty()) {
    nlohmann::ordered_json by = nlohmann::ordered_json::object();
    for (const SourceLoss& s : m.by_source) by[s.path] = number(s.loss);
    j["val_loss_by_source"] = by;
  }
  j["eval_time_s"] = m.eval_time_s;
  return json_text(j);
}

namespace {
// The length of `fd`'s text up to and including its last newline: where its whole lines end. A file that does not
// end in a newline holds a line cut off part-way: a process killed inside its write, or a node lost before the file
// system had the whole line (such a tail may be zeros). Searched backwards in blocks; -1 when it cannot be read.
off_t end_of_whole_lines(int fd) {
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (size <= 0) return size;
  char block[4096];
  for (off_t end = size; end > 0;) {
    const off_t begin = end > static_cast<off_t>(sizeof(block)) ? end - static_cast<off_t>(sizeof(block)) : 0;
    const ssize_t n = ::pread(fd, block, static_cast<size_t>(end - begin), begin);
    if (n != end - begin) return -1;
    for (ssize_t i = n - 1; i >= 0; --i)
      if (block[i] == '\n') return begin + i + 1;
    end = begin;
  }
  return 0;
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const std::string& tensorboard_dir) : path_(path) {
  // Read too, for its last line (below); a file this user may only write is appended to unread.
  fd_ = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(fmt::format("{}: cannot open the metrics file for appending: {}", path, std::strerror(errno)));
  // An earlier start's last line cut off part-way would swallow this start's first line (the two joined are not
  // JSON): the fragment goes, so that every line of the file stays valid JSON.
  const off_t size = ::lseek(fd_, 0, SEEK_END), whole = end_of_whole_lines(fd_);
  if (whole >= 0 && whole < size) {
    if (::ftruncate(fd_, whole) == 0)
      log::warn(
          "train: {}: its last line was cut off part-way ({} bytes without an end of line, from a process or node "
          "that died while writing it): removed, so that every line stays valid JSON",
          path_, size - whole);
    else
      log::warn(
          "train: {}: its last line was cut off part-way and cannot be removed ({}); the next line starts on a line "
          "of its own",
          path_, std::strerror(errno));
    pending_newline_ = ::lseek(fd_, 0, SEEK_END) > whole;
  }
  try {
    if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

bool MetricsWriter::removed() const {
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && st.st_nlink == 0) return true;
  return tensorboard_ && tensorboard_->removed();
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const std::string& line) {
  // Every record of both files is written when this returns (one write(2) each, no buffer): a preemption save
  // or a killed job loses none. A line metrics.jsonl dropped (a full disk) is not an event either: the two files
  // hold the same steps, and the event file does not take the room metrics.jsonl needs to write again (on a full run
  // directory it held steps 11-19 that metrics.jsonl lacked, which stopped at step 10 for good).
  if (append(line) && tensorboard_) tensorboard_->write_metrics_line(line);
}

bool MetricsWriter::append(const std::string& line) {
  std::string text = pending_newline_ ? "\n" : "";
  if (dropped_ > 0) text += fmt::format("{{\"kind\":\"metrics_gap\",\"dropped\":{}}}\n", dropped_);
  text += line;
  text += '\n';
  const int err = append_whole(fd_, text);
  if (err == 0) {
    pending_newline_ = false;
    if (dropped_ > 0) log::warn("train: {}: writing metrics again, {} line(s) were lost", path_, dropped_);
    dropped_ = 0;
    return true;
  }
  // Full, or over a size limit: the line is dropped whole (a half-written one is cut off again, so every line
  // of the file stays valid JSON) and training goes on; the weights matter more than their log.
  if (dropped_++ == 0)
    log::error(
        "train: {}: a metrics line could not be written ({}); training goes on, and lines are dropped until one can be",
        path_, std::strerror(err));
  return false;
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

}  // namespace shardtrain::train
