// Progress bar rendering (progress.hpp): "label [#####.....]  42% 1.2/2.9 MB 3.4 MB/s eta 12s k=v".
#include "shardtrain/runtime/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace shardtrain {

std::string format_bytes(uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / static_cast<double>(uint64_t{1} << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / static_cast<double>(uint64_t{1} << 20));
  if (bytes >= (uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

ProgressBar::ProgressBar(ProgressOptions options) : options_(std::move(options)), style_(options_.style) {
  if (style_ == ProgressStyle::Auto) style_ = isatty(fileno(options_.stream)) ? ProgressStyle::Bar : ProgressStyle::Lines;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(uint64_t n) {
  std::lock_guard lock(mutex_);
  done_ += n;
  draw_locked(false);
}

void ProgressBar::set(uint64_t done) {
  std::lock_guard lock(mutex_);
  done_ = done;
  draw_locked(false);
}

void ProgressBar::set(uint64_t done, uint64_t counted, double seconds) {
  std::lock_guard lock(mutex_);
  done_ = done;
  counted_ = counted;
  counted_seconds_ = seconds > 0 ? seconds : 1e-9;
  draw_locked(false);
}

void ProgressBar::set_field(const std::string& name, const std::string& value) {
  std::lock_guard lock(mutex_);
  for (auto& [k, v] : fields_) {
    if (k == name) {
      v = value;
      return;
    }
  }
  fields_.emplace_back(name, value);
}

void ProgressBar::finish() {
  std::lock_guard lock(mutex_);
  if (finished_) return;
  draw_locked(true);
  finished_ = true;
}

uint64_t ProgressBar::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string ProgressBar::render_locked(bool final_draw) const {
  const double elapsed = std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  const double scale = options_.unit_scale;
  const double shown = static_cast<double>(done_) * scale;
  const double rate = counted_seconds_ > 0 ? static_cast<double>(counted_) * scale / counted_seconds_ : shown / elapsed;
  std::string s = options_.label.empty() ? std::string() : options_.label + " ";
  if (options_.total > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(options_.total));
    if (style_ == ProgressStyle::Bar) {
      constexpr int width = 30;
      const int filled = static_cast<int>(frac * width);
      s += "[" + std::string(filled, '#') + std::string(width - filled, '.') + "] ";
    }
    s += fmt::format("{:3.0f}% {:.4g}/{:.4g} {}", frac * 100, shown, static_cast<double>(options_.total) * scale,
                     options_.unit);
    if (!final_draw && rate > 0)
      s += fmt::format(" {:.4g} {}/s eta {}", rate, options_.unit,
                       format_duration(std::max(0.0, static_cast<double>(options_.total) * scale - shown) / rate));
    else s += fmt::format(" {:.4g} {}/s in {}", rate, options_.unit, format_duration(elapsed));
  } else {
    s += fmt::format("{:.4g} {} {:.4g} {}/s {}", shown, options_.unit, rate, options_.unit, format_duration(elapsed));
  }
  for (const auto& [k, v] : fields_) s += fmt::format(" {}={}", k, v);
  return s;
}

void ProgressBar::draw_locked(bool final_draw) {
  if (style_ == ProgressStyle::Off || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto interval = style_ == ProgressStyle::Bar ? options_.bar_interval : options_.line_interval;
  if (!final_draw && now - last_draw_ < interval) return;
  last_draw_ = now;
  const std::string line = render_locked(final_draw);
  // fwrite, not fmt::print, which throws when the write fails: a terminal that hung up (EIO) or a reader that went
  // away (EPIPE, SIGPIPE being ignored) must not end the work the bar reports on.
  const std::string text =
      style_ == ProgressStyle::Bar ? fmt::format("\r\033[2K{}{}", line, final_draw ? "\n" : "") : line + "\n";
  std::fwrite(text.data(), 1, text.size(), options_.stream);
  std::fflush(options_.stream);
}

}  // namespace shardtrain
