// Progress bar rendering (progress.hpp): "label [#####.....]  42% 1.2/2.9 MB 3.4 MB/s eta 12s k=v", fitted to the
// terminal's width.
#include "shardtrain/runtime/progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace shardtrain {
namespace {

constexpr size_t kBarMin = 10, kBarMax = 30;  // the bar's columns inside its brackets

// Columns a UTF-8 string takes, one per character: labels and values are ASCII but for a path's stem now and then.
size_t columns_of(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// The first `width` characters of `s`, not cutting one in two.
std::string first_columns(const std::string& s, size_t width) {
  size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((s[i] & 0xC0) != 0x80 && n++ == width) break;
  }
  return s.substr(0, i);
}

// fwrite, not fmt::print, which throws when the write fails: a terminal that hung up (EIO) or a reader that went away
// (EPIPE, train ignoring SIGPIPE) must not end the work the bar reports on.
void put(std::FILE* stream, const std::string& text) { std::fwrite(text.data(), 1, text.size(), stream); }

std::string bar_text(double fraction, size_t inner) {
  const auto filled = static_cast<size_t>(std::clamp(fraction, 0.0, 1.0) * static_cast<double>(inner));
  std::string s(inner + 2, '.');
  s.front() = '[';
  s.back() = ']';
  std::fill_n(s.begin() + 1, filled, '#');
  return s;
}

}  // namespace

bool term_has_escape_codes(const char* term) { return term != nullptr && *term != '\0' && std::strcmp(term, "dumb") != 0; }

ProgressStyle resolve_progress_style(ProgressStyle requested, bool terminal, const char* term) {
  if (requested != ProgressStyle::Auto) return requested;
  return terminal && term_has_escape_codes(term) ? ProgressStyle::Bar : ProgressStyle::Lines;
}

int terminal_columns(std::FILE* stream) {
  struct winsize ws {};
  if (::ioctl(fileno(stream), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  // COLUMNS when the stream's terminal does not say (a pty that was given no size): only a positive number.
  if (const char* env = std::getenv("COLUMNS")) {
    int n = 0;
    const char* end = env + std::strlen(env);
    if (auto [p, ec] = std::from_chars(env, end, n); ec == std::errc() && p == end && n > 0) return n;
  }
  return 80;
}

std::string fit_progress_line(const std::vector<ProgressPiece>& pieces, size_t width) {
  std::vector<bool> kept(pieces.size(), true);
  auto length = [&] {  // of the kept pieces and the spaces between them, a bar at its narrowest
    size_t n = 0, count = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!kept[i]) continue;
      n += pieces[i].bar_fraction >= 0 ? kBarMin + 2 : columns_of(pieces[i].text);
      ++count;
    }
    return n + (count > 0 ? count - 1 : 0);
  };
  for (size_t left = pieces.size(); length() > width && left > 1; --left) {
    size_t drop = pieces.size();
    for (size_t i = 0; i < pieces.size(); ++i)
      if (kept[i] && (drop == pieces.size() || pieces[i].rank >= pieces[drop].rank)) drop = i;
    kept[drop] = false;
  }
  const size_t room = width > length() ? width - length() : 0;
  std::string line;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!kept[i]) continue;
    if (!line.empty()) line += ' ';
    line +=
        pieces[i].bar_fraction >= 0 ? bar_text(pieces[i].bar_fraction, std::min(kBarMax, kBarMin + room)) : pieces[i].text;
  }
  return columns_of(line) > width ? first_columns(line, width) : line;
}

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
  const char* term = std::getenv("TERM");
  style_ = resolve_progress_style(style_, isatty(fileno(options_.stream)) != 0, term);
  escape_codes_ = term_has_escape_codes(term);
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

void ProgressBar::set_field(const std::string& name, const std::string& value, int rank) {
  std::lock_guard lock(mutex_);
  for (Field& f : fields_) {
    if (f.name == name) {
      f.value = value;
      f.rank = rank;
      return;
    }
  }
  fields_.push_back({name, value, rank});
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

std::vector<ProgressPiece> ProgressBar::pieces_locked(bool final_draw) const {
  const double elapsed = std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  const double scale = options_.unit_scale;
  const double shown = static_cast<double>(done_) * scale;
  const double rate = counted_seconds_ > 0 ? static_cast<double>(counted_) * scale / counted_seconds_ : shown / elapsed;
  const std::string& unit = options_.unit;
  std::vector<ProgressPiece> p;
  if (!options_.label.empty()) p.push_back({options_.label, kProgressLabelRank});
  if (options_.total > 0) {
    const double frac = std::min(1.0, static_cast<double>(done_) / static_cast<double>(options_.total));
    if (style_ == ProgressStyle::Bar) p.push_back({"", kProgressBarRank, frac});
    p.push_back({fmt::format("{:3.0f}%", frac * 100), kProgressPercentRank});
    // Whole counts as they are: "{:.4g}" made step 123456 of 200000 "1.235e+05/2e+05 step".
    p.push_back({scale == 1.0 ? fmt::format("{}/{} {}", done_, options_.total, unit)
                              : fmt::format("{:.4g}/{:.4g} {}", shown, static_cast<double>(options_.total) * scale, unit),
                 kProgressCountRank});
    p.push_back({fmt::format("{:.4g} {}/s", rate, unit), kProgressRateRank});
    if (!final_draw && rate > 0)
      p.push_back({"eta " + format_duration(std::max(0.0, static_cast<double>(options_.total) * scale - shown) / rate),
                   kProgressEtaRank});
    else p.push_back({"in " + format_duration(elapsed), kProgressEtaRank});
  } else {
    p.push_back({fmt::format("{:.4g} {}", shown, unit), kProgressCountRank});
    p.push_back({fmt::format("{:.4g} {}/s", rate, unit), kProgressRateRank});
    p.push_back({format_duration(elapsed), kProgressEtaRank});
  }
  for (const Field& f : fields_) p.push_back({f.name + "=" + f.value, f.rank});
  return p;
}

void ProgressBar::draw_locked(bool final_draw) {
  if (style_ == ProgressStyle::Off || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto interval = style_ == ProgressStyle::Bar ? options_.bar_interval : options_.line_interval;
  if (!final_draw && now - last_draw_ < interval) return;
  last_draw_ = now;
  const std::vector<ProgressPiece> pieces = pieces_locked(final_draw);
  if (style_ != ProgressStyle::Bar) {
    put(options_.stream, fit_progress_line(pieces, std::string::npos) + "\n");  // a log's line: all of it
    std::fflush(options_.stream);
    return;
  }
  // One column short of the width: a line that fills the last column leaves some terminals' cursor on the next line,
  // and the next redraw's \r returns there instead. The width is read at each redraw (an ioctl: cheap), so a resized
  // window gets lines that fit from the next one on.
  const int columns = options_.columns > 0 ? options_.columns : terminal_columns(options_.stream);
  const std::string line = fit_progress_line(pieces, static_cast<size_t>(std::max(1, columns - 1)));
  const size_t length = columns_of(line);
  if (escape_codes_) {
    put(options_.stream, fmt::format("\r\033[2K{}{}", line, final_draw ? "\n" : ""));
  } else {  // a terminal without escape codes (a forced bar on TERM=dumb): spaces cover the longer line before
    const std::string pad(last_length_ > length ? last_length_ - length : 0, ' ');
    put(options_.stream, fmt::format("\r{}{}{}", line, pad, final_draw ? "\n" : ""));
  }
  last_length_ = length;
  std::fflush(options_.stream);
}

}  // namespace shardtrain
