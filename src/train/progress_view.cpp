// Rank 0's progress display (progress_view.hpp).
#include "shardtrain/train/progress_view.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {
namespace {
std::string mib(int64_t bytes) { return fmt::format("{:.0f}MiB", static_cast<double>(bytes) / (1 << 20)); }

// Whether a terminal shows this process's stdout. Open MPI's mpirun gives its ranks' stdout a pty of its own
// whatever its own stdout is, so `mpirun ... > train.log` made a terminal's bar of the log: redrawn in place with
// escape codes ten times a second, and no plain line to grep. Under mpirun, the launcher (the parent: mpirun on its
// node, orted elsewhere, whose output is no terminal either) decides; when that cannot be read, the pty does.
bool stdout_reaches_a_terminal() {
  if (!isatty(fileno(stdout))) return false;
  if (std::getenv("OMPI_COMM_WORLD_RANK") == nullptr) return true;
  char target[512];
  const std::string fd = fmt::format("/proc/{}/fd/1", ::getppid());
  const ssize_t n = ::readlink(fd.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return true;
  const std::string_view t(target, static_cast<size_t>(n));
  return t.starts_with("/dev/pts/") || t.starts_with("/dev/tty") || t == "/dev/console";
}
}  // namespace

ProgressView::ProgressView(const LoggingSection& logging, int64_t total_steps, bool active)
    : total_(total_steps), log_every_(logging.log_every) {
  if (!active) return;
  style_ = logging.progress;
  // mpirun passes the ranks' stderr through a pipe but stdout through a pty: a terminal on either gets the bar
  // (on stdout, only when mpirun's own stdout is one).
  std::FILE* stream = stderr;
  if (style_ == ProgressStyle::Auto) {
    // TERM=dumb or none (Emacs' shell, some CI viewers): plain lines, which such a terminal shows as they are.
    if (!term_has_escape_codes(std::getenv("TERM"))) {
      style_ = ProgressStyle::Lines;
    } else if (isatty(fileno(stderr))) {
      style_ = ProgressStyle::Bar;
    } else if (stdout_reaches_a_terminal()) {
      style_ = ProgressStyle::Bar;
      stream = stdout;
    } else {
      style_ = ProgressStyle::Lines;
    }
  }
  if (style_ == ProgressStyle::Bar) {
    ProgressOptions o;
    o.stream = stream;
    o.label = "train";
    o.total = static_cast<uint64_t>(total_steps);
    o.unit = "step";
    o.style = ProgressStyle::Bar;
    bar_ = std::make_unique<ProgressBar>(o);
  }
}

ProgressView::~ProgressView() { finish(); }

std::string ProgressView::line(const StepMetrics& m, int64_t total_steps, double eta_s) {
  return fmt::format("step {}/{} loss {:.4f} lr {:.3e} gnorm {:.3f} {:.0f} tok/s mfu {:.1f}% mem {} step {:.2f}s eta {}{}",
                     m.step, total_steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, 100 * m.mfu, mib(m.peak_mem_bytes),
                     m.step_time_s, format_duration(eta_s),
                     !m.skipped                      ? ""
                     : m.skip_reason == "loss_spike" ? " (skipped: loss spike)"
                                                     : " (skipped: non-finite)");
}

void ProgressView::show_step(ProgressBar& bar, const StepMetrics& m, int64_t steps_run) {
  // What a narrow terminal keeps (progress.hpp's ranks): step/total, then the loss, the time left, tokens/s; the
  // rest goes first.
  bar.set_field("loss", fmt::format("{:.4f}", m.loss), kProgressCountRank + 1);
  bar.set_field("lr", fmt::format("{:.2e}", m.lr));
  bar.set_field("gnorm", fmt::format("{:.2f}", m.grad_norm));
  bar.set_field("tok/s", fmt::format("{:.0f}", m.tokens_per_s), kProgressEtaRank + 1);
  bar.set_field("mfu", fmt::format("{:.1f}%", 100 * m.mfu));
  bar.set_field("mem", mib(m.peak_mem_bytes));
  bar.set(static_cast<uint64_t>(m.step), static_cast<uint64_t>(steps_run), m.elapsed_s);
}

double ProgressView::eta_seconds(const StepMetrics& m, int64_t steps_run, int64_t total_steps) {
  if (steps_run <= 0 || m.step >= total_steps) return 0;
  return m.elapsed_s / static_cast<double>(steps_run) * static_cast<double>(total_steps - m.step);
}

void ProgressView::step(const StepMetrics& m) {
  if (style_ == ProgressStyle::Off) return;
  ++steps_run_;
  if (bar_) {
    show_step(*bar_, m, steps_run_);
    return;
  }
  // The first step of every start too: a resumed run says at once that it runs, and how fast.
  if (m.step % log_every_ == 0 || steps_run_ == 1 || m.step == total_ || m.skipped) {
    log::info("{}", line(m, total_, eta_seconds(m, steps_run_, total_)));
  }
}

void ProgressView::eval(const EvalMetrics& m) {
  if (style_ == ProgressStyle::Off) return;
  std::string by_source;
  for (const SourceLoss& s : m.by_source)
    by_source +=
        fmt::format("{}{} {:.4f}", by_source.empty() ? "; " : ", ", std::filesystem::path(s.path).stem().string(), s.loss);
  const std::string text = fmt::format("eval at step {}: val_loss {:.4f} over {} tokens{} ({:.1f}s)", m.step, m.val_loss,
                                       m.val_tokens, by_source, m.eval_time_s);
  if (bar_) {
    bar_->set_field("val", fmt::format("{:.4f}", m.val_loss), kProgressRateRank + 1);
    return;
  }
  log::info("{}", text);
}

void ProgressView::finish() {
  if (bar_) bar_->finish();
  bar_.reset();
}

}  // namespace shardtrain::train
