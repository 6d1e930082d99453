// A terminal progress bar for long offline jobs and the training loop: a redrawn bar with rate, ETA
// and custom fields when the stream is a terminal, plain periodic lines otherwise (logs, Slurm).
// The bar fits the terminal's width, read again at each redraw: a line longer than the terminal wraps, and each
// redraw then leaves a stale half-line behind instead of replacing the last (the screen fills up).
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

enum class ProgressStyle { Auto, Bar, Lines, Off };  // Auto: Bar on a terminal that can redraw a line, Lines otherwise

// What `requested` comes to on a stream: Auto is Bar on a terminal (`terminal`) whose TERM can redraw a line, Lines
// otherwise: TERM unset or "dumb" (Emacs' shell, some CI log viewers) shows escape codes as text.
ProgressStyle resolve_progress_style(ProgressStyle requested, bool terminal, const char* term);
// Whether TERM names a terminal that understands escape codes (set, not empty, not "dumb").
bool term_has_escape_codes(const char* term);

// The columns a line on `stream` may use: the terminal's width (TIOCGWINSZ), else a positive COLUMNS, else 80.
int terminal_columns(std::FILE* stream);

// One piece of a progress line. `rank` says which pieces go first when the line is too long for its terminal: the
// highest rank first (the rightmost of equal ranks), 0 last. A bar piece (`bar_fraction` >= 0) is drawn
// "[###.......]" as wide as the room left, 10 to 30 columns inside its brackets, or dropped when 10 do not fit.
struct ProgressPiece {
  std::string text;
  int rank = 0;
  double bar_fraction = -1;
};
// The ranks of ProgressBar's own pieces; fields (set_field) rank kProgressFieldRank unless given another.
inline constexpr int kProgressCountRank = 0;    // "84/200 step"
inline constexpr int kProgressEtaRank = 2;      // "eta 1m10s"
inline constexpr int kProgressPercentRank = 4;  // " 42%"
inline constexpr int kProgressRateRank = 5;     // "3.4 MB/s"
inline constexpr int kProgressBarRank = 7;      // "[####......]"
inline constexpr int kProgressLabelRank = 8;    // "train"
inline constexpr int kProgressFieldRank = 9;

// `pieces` (in the order shown) joined by spaces in at most `width` columns (UTF-8 characters): pieces dropped by
// rank until the rest fit, and a single piece still too wide cut to the width.
std::string fit_progress_line(const std::vector<ProgressPiece>& pieces, size_t width);

struct ProgressOptions {
  std::string label;        // "tokenize", "train"
  uint64_t total = 0;       // 0 = unknown (no percentage or ETA)
  std::string unit = "it";  // shown after the rate: "MB" -> "12.3 MB/s"
  double unit_scale = 1.0;  // counts are multiplied by this for display (1e-6: bytes -> MB)
  ProgressStyle style = ProgressStyle::Auto;
  std::chrono::milliseconds bar_interval{100};     // redraw at most this often
  std::chrono::milliseconds line_interval{10000};  // plain lines at most this often
  std::FILE* stream = stderr;
  int columns = 0;  // the bar's width; 0: the terminal's (terminal_columns), read again at each redraw
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
  // Shown as "name=value", in the order first set; `rank` (ProgressPiece) says when it goes from a line too long for
  // the terminal.
  void set_field(const std::string& name, const std::string& value, int rank = kProgressFieldRank);
  void finish();  // draws the final state and ends the line

  uint64_t done() const;
  double elapsed_seconds() const;
  bool is_bar() const { return style_ == ProgressStyle::Bar; }

 private:
  void draw_locked(bool final_draw);
  std::vector<ProgressPiece> pieces_locked(bool final_draw) const;

  ProgressOptions options_;
  ProgressStyle style_;
  mutable std::mutex mutex_;
  uint64_t done_ = 0;
  uint64_t counted_ = 0;
  double counted_seconds_ = 0;  // > 0: set(done, counted, seconds) gave the rate, counted_ / counted_seconds_
  struct Field {
    std::string name, value;
    int rank = kProgressFieldRank;
  };
  std::vector<Field> fields_;
  bool escape_codes_ = true;  // the bar erases its line with ESC[2K; without (TERM=dumb, forced bar) with spaces
  size_t last_length_ = 0;    // of the line drawn last, which the spaces cover
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool finished_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m07s", "12s"
std::string format_bytes(uint64_t bytes);     // "812 B", "1.8 MiB", "41.20 GiB"

}  // namespace shardtrain
