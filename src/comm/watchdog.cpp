// The watchdog thread: wakes a few times per timeout, and aborts the job when the collective in flight
// has run past it.
#include "shardtrain/comm/watchdog.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"

namespace shardtrain {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::duration<double> timeout) : timeout_(timeout) {
  if (enabled()) thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::set_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

void CollectiveWatchdog::set_unit(const std::string& unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  unit_ = unit;
}

CollectiveWatchdog::Guard::Guard(CollectiveWatchdog* w, CollectiveKind kind, MeshAxis axis, uint64_t bytes)
    : w_(w != nullptr && w->enabled() ? w : nullptr) {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mutex_);
  w_->in_flight_ = true;
  w_->kind_ = kind;
  w_->axis_ = axis;
  w_->bytes_ = bytes;
  w_->started_ = std::chrono::steady_clock::now();
}

CollectiveWatchdog::Guard::~Guard() {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mutex_);
  w_->in_flight_ = false;
}

void CollectiveWatchdog::run() {
  const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(timeout_ / 4) + std::chrono::milliseconds(1);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, tick);
    if (stop_ || !in_flight_) continue;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    if (waited > timeout_.count()) fire(waited);
  }
}

void CollectiveWatchdog::fire(double waited) {
  // Called with the mutex held: the fields describe the collective that is stuck.
  int rank = -1;
  if (MpiSession::active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  log::error("{}: {} of {} bytes on the {} axis has not finished after {:.1f} s (collective_timeout {:.1f} s) on rank {}{}; "
             "some rank of that axis never arrived (stalled, dead or on another code path): ending the job",
             exit_code_name(ExitCode::Timeout), collective_kind_name(kind_), bytes_, mesh_axis_name(axis_), waited,
             timeout_.count(), rank,
             (step_ >= 0 ? fmt::format(", during step {}", step_) : std::string()) +
                 (unit_.empty() ? std::string() : fmt::format(", unit {}", unit_)));
  MpiSession::abort(ExitCode::Timeout);
}

}  // namespace shardtrain
