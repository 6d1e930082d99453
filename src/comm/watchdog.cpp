// The watchdog thread: polls its private communicator every few tens of milliseconds (answering the
// peers' questions), and when the collective in flight has run past the timeout asks the other ranks
// of its axis where they are, names the ones that did not arrive, and aborts the job.
//
// The protocol, on a duplicate of MPI_COMM_WORLD (one tag, messages of 8 int64 words):
//   query  {kQuery,  token, axis, seq}                                   firing rank -> each peer of the axis
//   answer {kAnswer, token, entered(axis), in_flight, kind, axis, step}  peer -> firing rank
// The thread never blocks in MPI: one receive stays posted and is tested; sends are non-blocking.
#include "shardtrain/comm/watchdog.hpp"

#include <mpi.h>

#include <algorithm>
#include <list>

#include <fmt/format.h>

#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/pause.hpp"
#include "shardtrain/runtime/session.hpp"

namespace shardtrain {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWords = 8;
constexpr int kTag = 4242;
constexpr int64_t kQuery = 1, kAnswer = 2;
using Message = std::array<int64_t, kWords>;

// "0-2, 5, 7-8"
std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string doing(const PeerReport& r) {
  std::string s = r.step >= 0 ? fmt::format("at step {}, ", r.step) : std::string();
  s += r.in_collective ? fmt::format("in {} on the {} axis", collective_kind_name(r.kind), mesh_axis_name(r.axis))
                       : std::string("not in a collective");
  return s;
}

}  // namespace

std::string describe_peer_reports(MeshAxis axis, uint64_t seq, const std::vector<PeerReport>& reports) {
  std::vector<std::string> behind, ahead;
  std::vector<int> silent, arrived;
  for (const PeerReport& r : reports) {
    switch (r.status) {
      case PeerReport::Status::Arrived: arrived.push_back(r.world_rank); break;
      case PeerReport::Status::NoAnswer: silent.push_back(r.world_rank); break;
      case PeerReport::Status::Behind: {
        const std::string gap =
            seq > r.entered ? fmt::format("; {} collective{} behind", seq - r.entered, seq - r.entered == 1 ? "" : "s")
                            : std::string();
        behind.push_back(fmt::format("{} ({}{})", r.world_rank, doing(r), gap));
        break;
      }
      case PeerReport::Status::Ahead:
        ahead.push_back(
            fmt::format("{} ({}; entered #{} on the {} axis)", r.world_rank, doing(r), r.entered, mesh_axis_name(axis)));
        break;
    }
  }
  std::vector<std::string> parts;
  if (!behind.empty()) {
    std::string s = "ranks that did not arrive: ";
    for (size_t i = 0; i < behind.size(); ++i) s += (i ? ", " : "") + behind[i];
    parts.push_back(s);
  }
  if (!silent.empty())
    parts.push_back("ranks that did not answer (dead, stopped, or not making MPI progress): " + rank_ranges(silent));
  if (!ahead.empty()) {
    std::string s = "ranks past this collective (another code path): ";
    for (size_t i = 0; i < ahead.size(); ++i) s += (i ? ", " : "") + ahead[i];
    parts.push_back(s);
  }
  if (parts.empty())
    parts.push_back(fmt::format("every rank of the {} axis arrived: the collective itself is stuck (network or MPI)",
                                mesh_axis_name(axis)));
  if (!arrived.empty()) parts.push_back("arrived: " + rank_ranges(arrived));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

struct CollectiveWatchdog::Mailbox {
  struct Outgoing {
    MPI_Request request = MPI_REQUEST_NULL;
    Message message{};
  };
  MpiComm comm;
  int rank = -1;
  MPI_Request recv = MPI_REQUEST_NULL;
  Message in{};
  std::list<Outgoing> sends;  // stable addresses: MPI reads each message until its send completes

  // Calls are unchecked: the thread must not throw, and a failed send just means no answer.
  void post() {
    if (MPI_Irecv(in.data(), kWords, MPI_INT64_T, MPI_ANY_SOURCE, kTag, comm.get(), &recv) != MPI_SUCCESS)
      recv = MPI_REQUEST_NULL;
  }
  // The next message, if one arrived: its source and content; the receive is posted again.
  bool next(int& source, Message& m) {
    if (recv == MPI_REQUEST_NULL) return false;
    int done = 0;
    MPI_Status status;
    if (MPI_Test(&recv, &done, &status) != MPI_SUCCESS || !done) return false;
    source = status.MPI_SOURCE;
    m = in;
    post();
    return true;
  }
  void send(int to, const Message& m) {
    Outgoing& o = sends.emplace_back();
    o.message = m;
    if (MPI_Isend(o.message.data(), kWords, MPI_INT64_T, to, kTag, comm.get(), &o.request) != MPI_SUCCESS) sends.pop_back();
  }
  void reap() {
    for (auto it = sends.begin(); it != sends.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? sends.erase(it) : std::next(it);
    }
  }
  // Before the communicator is freed (and MPI finalized): nothing of ours may stay pending.
  void close() {
    if (recv != MPI_REQUEST_NULL) {
      MPI_Cancel(&recv);
      MPI_Wait(&recv, MPI_STATUS_IGNORE);
    }
    const auto deadline = Clock::now() + std::chrono::milliseconds(200);
    while (!sends.empty() && Clock::now() < deadline) {
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (sends.empty()) return;
    // An answer to a peer that is gone (the job is ending anyway): MPI may still read the buffers,
    // so they are released to MPI and never freed.
    auto* leaked = new std::list<Outgoing>(std::move(sends));
    for (Outgoing& o : *leaked) MPI_Request_free(&o.request);
  }
};

CollectiveWatchdog::CollectiveWatchdog(std::chrono::duration<double> timeout) : timeout_(timeout) {
  if (!enabled()) return;
  if (MpiSession::active()) {
    mailbox_ = std::make_unique<Mailbox>();
    mailbox_->comm = MpiComm::duplicate(MPI_COMM_WORLD);  // collective: every rank builds its watchdog here
    mailbox_->rank = mailbox_->comm.rank();
    mailbox_->post();
  }
  thread_ = std::thread([this, created = Clock::now()] { run(created); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    surveyed_.notify_all();
    thread_.join();
  }
  mailbox_.reset();  // frees the communicator, its requests closed by the thread
}

void CollectiveWatchdog::set_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
}

void CollectiveWatchdog::set_unit(const std::string& unit) {
  std::lock_guard<std::mutex> lock(mutex_);
  unit_ = unit;
}

CollectiveWatchdog::Guard::Guard(CollectiveWatchdog* w, const CollectiveCall& call)
    : w_(w != nullptr && w->enabled() ? w : nullptr) {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mutex_);
  w_->in_flight_ = true;
  w_->call_ = call;
  uint64_t& entered = w_->entered_[static_cast<size_t>(call.axis)];
  entered = std::max(entered, call.seq);
  w_->started_ = Clock::now();
  w_->stopped_ = 0;
}

CollectiveWatchdog::Guard::~Guard() {
  if (!w_) return;
  std::lock_guard<std::mutex> lock(w_->mutex_);
  w_->in_flight_ = false;
  w_->call_.group = nullptr;  // the communicator need not outlive its guard
}

std::vector<PeerReport> CollectiveWatchdog::survey(MeshAxis axis, uint64_t seq, const std::vector<int>& group,
                                                   std::chrono::duration<double> wait) {
  if (!mailbox_ || !thread_.joinable()) return {};
  Survey s{axis, seq, group, wait, std::nullopt};
  std::unique_lock<std::mutex> lock(mutex_);
  surveyed_.wait(lock, [&] { return survey_request_ == nullptr || stop_; });
  if (stop_) return {};
  survey_request_ = &s;
  wake_.notify_all();
  surveyed_.wait(lock, [&] { return s.result.has_value() || stop_; });
  if (survey_request_ == &s) survey_request_ = nullptr;
  return s.result.value_or(std::vector<PeerReport>{});
}

void CollectiveWatchdog::serve(Survey* survey, int64_t token, std::vector<PeerReport>* reports) {
  if (!mailbox_) return;
  int source = -1;
  Message m{};
  while (mailbox_->next(source, m)) {
    if (m[0] == kQuery && m[2] >= 0 && m[2] < 3) {
      Message a{};
      {
        std::lock_guard<std::mutex> lock(mutex_);
        a = {kAnswer,
             m[1],
             static_cast<int64_t>(entered_[static_cast<size_t>(m[2])]),
             in_flight_ ? 1 : 0,
             static_cast<int64_t>(call_.kind),
             static_cast<int64_t>(call_.axis),
             step_,
             0};
      }
      mailbox_->send(source, a);
    } else if (m[0] == kAnswer && survey && reports && m[1] == token) {
      for (PeerReport& r : *reports) {
        if (r.world_rank != source) continue;
        r.entered = static_cast<uint64_t>(m[2]);
        r.in_collective = m[3] != 0;
        r.kind = static_cast<CollectiveKind>(m[4]);
        r.axis = static_cast<MeshAxis>(m[5]);
        r.step = m[6];
        r.status = r.entered < survey->seq    ? PeerReport::Status::Behind
                   : r.entered == survey->seq ? PeerReport::Status::Arrived
                                              : PeerReport::Status::Ahead;
      }
    }  // anything else: an answer to an earlier survey that came too late
  }
  mailbox_->reap();
}

std::vector<PeerReport> CollectiveWatchdog::run_survey(const Survey& s) {
  std::vector<PeerReport> reports;
  if (!mailbox_) return reports;
  const int64_t token = ++next_token_;
  for (int r : s.group) {
    if (r == mailbox_->rank) continue;
    PeerReport& p = reports.emplace_back();
    p.world_rank = r;
    mailbox_->send(r, Message{kQuery, token, static_cast<int64_t>(s.axis), static_cast<int64_t>(s.seq), 0, 0, 0, 0});
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(s.wait);
  auto answered = [&] {
    return std::all_of(reports.begin(), reports.end(),
                       [](const PeerReport& p) { return p.status != PeerReport::Status::NoAnswer; });
  };
  Survey copy = s;  // serve() compares against its seq
  for (;;) {
    serve(&copy, token, &reports);
    if (answered() || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return reports;
}

void CollectiveWatchdog::run(std::chrono::steady_clock::time_point created) {
  const auto tick =
      std::min(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_ / 4) + std::chrono::milliseconds(1),
               std::chrono::milliseconds(20));
  PauseDetector pauses(tick, created);  // a collective may start, and the process stop, before this thread runs
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, tick);
    if (stop_) break;
    const Clock::duration paused = pauses.wake(Clock::now());
    if (paused > Clock::duration::zero()) discount_pause(paused);
    if (in_flight_ && Clock::now() - started_ > timeout_) {
      lock.unlock();
      fire(std::chrono::duration<double>(Clock::now() - started_).count());
    }
    check_async(lock);
    Survey* request = survey_request_;
    lock.unlock();
    if (request) {
      std::vector<PeerReport> reports = run_survey(*request);
      lock.lock();
      request->result = std::move(reports);
      survey_request_ = nullptr;
      surveyed_.notify_all();
      lock.unlock();
      pauses.reset(Clock::now());  // its seconds of waiting for answers were this thread's own
    }
    serve(nullptr, 0, nullptr);
    lock.lock();
  }
  lock.unlock();
  if (mailbox_) mailbox_->close();
}

void CollectiveWatchdog::discount_pause(Clock::duration paused) {
  // Every thread of a stopped process stops: its collectives waited for nobody meanwhile. A peer that was not stopped
  // saw this rank late, a real stall from where it stands; it fires after its own timeout, naming this rank as not
  // answering (a stop longer than the timeout ends the job there).
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(paused).count();
  if (in_flight_) {
    started_ = std::min(started_ + paused, now);
    stopped_ += seconds;
  }
  for (AsyncCall& a : async_) {
    a.started = std::min(a.started + paused, now);
    a.stopped += seconds;
  }
  const std::string where = in_flight_ ? fmt::format("in {} on the {} axis (collective #{} there)",
                                                     collective_kind_name(call_.kind), mesh_axis_name(call_.axis), call_.seq)
                                       : std::string(async_.empty() ? "between collectives" : "in device collectives");
  log_stopped(seconds, where, "fsdp.collective_timeout");
}

void CollectiveWatchdog::watch_async(const CollectiveCall& call, std::function<bool()> done, std::function<void()> abort) {
  if (!enabled()) return;
  AsyncCall a{call, call.group ? *call.group : std::vector<int>{}, Clock::now(), 0, std::move(done), std::move(abort)};
  a.call.group = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  async_.push_back(std::move(a));
}

size_t CollectiveWatchdog::async_in_flight() {
  std::lock_guard<std::mutex> lock(mutex_);
  return async_.size();
}

int CollectiveWatchdog::add_error_source(std::function<std::string()> poll, std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int id = next_error_source_++;
  error_sources_[id] = ErrorSource{std::move(poll), std::move(abort)};
  return id;
}

void CollectiveWatchdog::remove_error_source(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_sources_.erase(id);
}

void CollectiveWatchdog::check_async(std::unique_lock<std::mutex>& lock) {
  // Polls are cheap and never block (cudaEventQuery, ncclCommGetAsyncError), so they run under the mutex.
  while (!async_.empty() && async_.front().done()) async_.pop_front();
  if (!async_.empty() && Clock::now() - async_.front().started > timeout_) {
    AsyncCall a = std::move(async_.front());
    async_.clear();
    lock.unlock();
    report_and_abort(a.call, a.group, std::chrono::duration<double>(Clock::now() - a.started).count(), a.stopped,
                     " on the device", a.abort);
  }
  for (auto& [id, source] : error_sources_) {
    std::string message = source.poll();
    if (message.empty()) continue;
    std::function<void()> abort = source.abort;
    lock.unlock();
    int rank = -1;
    if (MpiSession::active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    log::error("{}: {} on rank {}: ending the job", exit_code_name(ExitCode::Comm), message, rank);
    failure_record::write(ExitCode::Comm, fmt::format("{} on rank {}", message, rank));
    abort();  // last: the training thread it releases must not issue more on the communicator before the end
    MpiSession::abort(ExitCode::Comm);
  }
}

void CollectiveWatchdog::fire(double waited) {
  // The stuck collective, copied while the guard cannot end (its communicator, and so `group`, alive).
  CollectiveCall call;
  std::vector<int> group;
  double stopped = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    call = call_;
    if (call_.group) group = *call_.group;
    stopped = stopped_;
  }
  report_and_abort(call, group, waited, stopped, "");
}

void CollectiveWatchdog::report_and_abort(const CollectiveCall& call, const std::vector<int>& group, double waited,
                                          double stopped, const char* where, const std::function<void()>& release) {
  int64_t step = -1;
  std::string unit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    step = step_;
    unit = unit_;
  }
  int rank = -1;
  if (MpiSession::active()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string peers = "some rank of that axis never arrived (stalled, dead or on another code path)";
  std::vector<int> suspects;  // the ranks that did not arrive or answer: their nodes go into the failure record
  if (mailbox_ && group.size() > 1) {
    const std::chrono::duration<double> wait = std::min(std::chrono::duration<double>(2.0), timeout_ / 2);
    std::vector<PeerReport> reports = run_survey(Survey{call.axis, call.seq, group, wait, std::nullopt});
    PeerReport self;  // listed among the arrived
    self.world_rank = rank;
    self.status = PeerReport::Status::Arrived;
    self.entered = call.seq;
    reports.push_back(self);
    peers = describe_peer_reports(call.axis, call.seq, reports);
    for (const PeerReport& r : reports)
      if (r.status == PeerReport::Status::Behind || r.status == PeerReport::Status::NoAnswer)
        suspects.push_back(r.world_rank);
  }
  const std::string message = fmt::format(
      "{} of {} bytes on the {} axis (collective #{} there) has not finished{} after {:.1f} s (collective_timeout {:.1f} s) "
      "on rank {}{}; {}",
      collective_kind_name(call.kind), call.bytes, mesh_axis_name(call.axis), call.seq, where, waited, timeout_.count(),
      rank,
      (step >= 0 ? fmt::format(", during step {}", step) : std::string()) +
          (unit.empty() ? std::string() : fmt::format(", unit {}", unit)) + stopped_note(stopped),
      peers);
  log::error("{}: {}: ending the job", exit_code_name(ExitCode::Timeout), message);
  failure_record::write(ExitCode::Timeout, message, suspects);
  if (release) release();
  MpiSession::abort(ExitCode::Timeout);
}

}  // namespace shardtrain
