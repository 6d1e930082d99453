// A terminal progress bar for long offline jobs and the training loop: a redrawn bar with rate, ETA
// and custom fields when the stream is a terminal, plain periodic lines otherwise (logs, Slurm).
// Thread-safe: workers may call advance() while another thread sets fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace shardtrain {

enum class ProgressStyle { Auto, Bar, Lines, Off };  // Auto: Bar on a TTY, Lines otherwise

struct ProgressOptions {
  std::string label;        // "tokenize", "train"
  uint64_t total = 0;       // 0 = unknown (no percentage or ETA)
  std::string unit = "it";  // shown after the rate: "MB" -> "12.3 MB/s"
  double unit_scale = 1.0;  // counts are multiplied by this for display (1e-6: bytes -> MB)
  ProgressStyle style = ProgressStyle::Auto;
  std::chrono::milliseconds bar_interval{100};     // redraw at most this often
  std::chrono::milliseconds line_interval{10000};  // plain lines at most this often
  std::FILE* stream = stderr;
};

class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options);
  ~ProgressBar();  // finish()es if still open
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(uint64_t n);
  void set(uint64_t done);
  // `done` of `total`, of which `counted` were made in the last `seconds`: the rate and ETA count only those (a
  // resumed run's bar starts at its checkpoint's step, a rollback takes `done` back, and the time before the first
  // step, loading a checkpoint say, is no time spent making them).
  void set(uint64_t done, uint64_t counted, double seconds);
  void set_field(const std::string& name, const std::string& value);  // shown as "name=value"
  void finish();                                                      // draws the final state and ends the line

  uint64_t done() const;
  double elapsed_seconds() const;
  bool is_bar() const { return style_ == ProgressStyle::Bar; }

 private:
  void draw_locked(bool final_draw);
  std::string render_locked(bool final_draw) const;

  ProgressOptions options_;
  ProgressStyle style_;
  mutable std::mutex mutex_;
  uint64_t done_ = 0;
  uint64_t counted_ = 0;
  double counted_seconds_ = 0;  // > 0: set(done, counted, seconds) gave the rate, counted_ / counted_seconds_
  std::vector<std::pair<std::string, std::string>> fields_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool finished_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m07s", "12s"
std::string format_bytes(uint64_t bytes);     // "812 B", "1.8 MiB", "41.20 GiB"

}  // namespace shardtrain
