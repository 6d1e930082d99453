// The overlap properties of tests/fsdp/schedule_checker.hpp, on a happens-before graph built from the trace: an op
// follows the ops queued before it on its stream and, for a wait, the record it waits for (a vector clock per op:
// for each stream, the latest op of it that must have run first). The waits the emulated NCCL queues to keep a
// communicator's collectives in issue order (the wait right before each collective) are left out: they order
// collectives among themselves, not compute after a reduction, and a GPU's NCCL orders them without events.
#include "schedule_checker.hpp"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <unordered_map>

namespace shardtrain::testing_fsdp {

namespace {

using cuda_emulator::TraceOp;
using Clock = std::map<const void*, size_t>;  // stream -> trace index of the latest op that happens before

bool is_wait(const TraceOp& op) { return op.what == "cudaStreamWaitEvent" || op.what == "implicit synchronization"; }
bool is_collective(const TraceOp& op) { return op.what.rfind("nccl", 0) == 0; }
bool is_reduction(const TraceOp& op) { return op.what == "ncclReduceScatter" || op.what == "ncclAllReduce"; }
bool is_work(const TraceOp& op) { return !is_wait(op) && op.what != "cudaEventRecord" && op.what != "mark"; }
bool on_compute(const TraceOp& op) { return op.stream == nullptr; }

struct Mark {
  char kind = 0;  // G, F, B, R
  int unit = -1;
  size_t at = 0;  // trace index
};

struct Graph {
  const std::vector<TraceOp>& ops;
  std::vector<Clock> clocks;
  std::vector<Mark> marks;

  explicit Graph(const std::vector<TraceOp>& trace) : ops(trace), clocks(trace.size()) {
    std::unordered_map<uint64_t, size_t> by_seq;
    std::map<const void*, size_t> last_on;  // stream -> index of its latest op so far
    // The communicator's own waits: a wait whose next op on its stream is a collective.
    std::vector<bool> comm_order(ops.size(), false);
    std::map<const void*, size_t> next_pending;  // stream -> a wait not yet followed by an op
    for (size_t i = 0; i < ops.size(); ++i) {
      const TraceOp& op = ops[i];
      if (op.what == "mark") continue;
      if (auto it = next_pending.find(op.stream); it != next_pending.end()) {
        if (is_collective(op)) comm_order[it->second] = true;
        next_pending.erase(it);
      }
      if (op.what == "cudaStreamWaitEvent") next_pending[op.stream] = i;
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const TraceOp& op = ops[i];
      if (op.what == "mark") {
        Mark m;
        m.kind = op.detail.empty() ? 0 : op.detail[0];
        m.unit = std::atoi(op.detail.c_str() + 2);
        m.at = i;
        marks.push_back(m);
        continue;
      }
      by_seq[op.seq] = i;
      Clock c;
      if (auto it = last_on.find(op.stream); it != last_on.end()) c = clocks[it->second];
      if (is_wait(op) && !comm_order[i] && op.waits_for != 0) {
        if (auto t = by_seq.find(op.waits_for); t != by_seq.end()) {
          for (const auto& [s, at] : clocks[t->second]) c[s] = std::max(c[s], at);
        }
      }
      c[op.stream] = i;
      clocks[i] = std::move(c);
      last_on[op.stream] = i;
    }
  }

  // Does op j happen after op i (i on another stream, or earlier on the same one)?
  bool depends(size_t j, size_t i) const {
    const auto it = clocks[j].find(ops[i].stream);
    return it != clocks[j].end() && it->second >= i;
  }
  std::optional<size_t> first_compute_work_after(size_t at) const {
    for (size_t i = at + 1; i < ops.size(); ++i)
      if (on_compute(ops[i]) && is_work(ops[i])) return i;
    return std::nullopt;
  }
};

}  // namespace

ScheduleReport check_schedule(const std::vector<TraceOp>& trace, const ScheduleExpectations& expect) {
  ScheduleReport r;
  const Graph g(trace);
  const std::vector<Mark>& marks = g.marks;

  // Each all-gather issued on a side stream: the unit's next compute waits for it (by an event).
  for (size_t k = 0; k < marks.size(); ++k) {
    if (marks[k].kind != 'G') continue;
    std::optional<size_t> gather;
    for (size_t i = marks[k].at + 1; i < trace.size() && trace[i].what != "mark"; ++i)
      if (trace[i].what == "ncclAllGather") gather = i;
    if (!gather || on_compute(trace[*gather])) continue;
    for (size_t m = k + 1; m < marks.size(); ++m) {
      if ((marks[m].kind != 'F' && marks[m].kind != 'B') || marks[m].unit != marks[k].unit) continue;
      const std::optional<size_t> use = g.first_compute_work_after(marks[m].at);
      if (!use) break;
      if (!g.depends(*use, *gather)) {
        r.violations.push_back(
            fmt::format("unit {} computes (#{}) without waiting for its all-gather (#{})", marks[k].unit, *use, *gather));
      }
      ++r.gathers_waited;
      break;
    }
  }

  // Prefetch: within a run of forward (or backward) starts, unit b's latest all-gather is queued before the first
  // compute op of the unit a before it.
  if (expect.prefetch) {
    for (size_t k = 0; k + 1 < marks.size(); ++k) {
      const Mark& a = marks[k];
      if (a.kind != 'F' && a.kind != 'B') continue;
      size_t n = k + 1;
      while (n < marks.size() && (marks[n].kind == 'G' || marks[n].kind == 'R')) ++n;
      if (n == marks.size() || marks[n].kind != a.kind) continue;
      const Mark& b = marks[n];
      std::optional<size_t> gb;
      for (size_t m = 0; m < n; ++m)
        if (marks[m].kind == 'G' && marks[m].unit == b.unit) gb = marks[m].at;
      if (!gb) continue;  // never gathered (one shard: nothing to gather)
      const std::optional<size_t> fa = g.first_compute_work_after(a.at);
      ++r.prefetch_pairs;
      if (fa && *gb > *fa) {
        r.violations.push_back(fmt::format("{}: unit {}'s all-gather queued at #{}, after unit {}'s first compute op #{}",
                                           a.kind == 'F' ? "forward" : "backward", b.unit, *gb, a.unit, *fa));
      }
    }
  }

  // Reductions: no compute op depends on a unit's reduction before the next unit's forward or backward starts.
  if (expect.async_reductions) {
    for (size_t k = 0; k < marks.size(); ++k) {
      if (marks[k].kind != 'R') continue;
      std::optional<size_t> next_work;
      for (size_t m = k + 1; m < marks.size(); ++m)
        if (marks[m].kind == 'F' || marks[m].kind == 'B') {
          next_work = marks[m].at;
          break;
        }
      for (size_t i = marks[k].at + 1; i < trace.size() && trace[i].what != "mark"; ++i) {
        if (!is_reduction(trace[i])) continue;
        ++r.reductions;
        if (on_compute(trace[i])) {
          r.violations.push_back(
              fmt::format("unit {}'s {} (#{}) runs on the compute stream", marks[k].unit, trace[i].what, i));
          continue;
        }
        if (!next_work) continue;  // the step's last: the optimizer waits for it
        for (size_t j = i + 1; j < *next_work; ++j) {
          if (!on_compute(trace[j]) || !g.depends(j, i)) continue;
          r.violations.push_back(
              fmt::format("compute waits for unit {}'s {} (#{}) at #{}, before the next unit's work (#{})", marks[k].unit,
                          trace[i].what, i, j, *next_work));
          break;
        }
      }
    }
  }

  // Offload: the shards' copies between pinned host memory and the device run on streams of their own.
  if (expect.offload_copies) {
    for (size_t i = 0; i < trace.size(); ++i) {
      const TraceOp& op = trace[i];
      if (op.what.rfind("memcpy", 0) != 0 || (op.detail != "pinned->device" && op.detail != "device->pinned")) continue;
      if (expect.shard_bytes.count(op.bytes) == 0) continue;
      ++r.offload_copies;
      if (on_compute(op))
        r.violations.push_back(fmt::format("a {}-byte {} copy (#{}) runs on the compute stream", op.bytes, op.detail, i));
    }
  }
  return r;
}

}  // namespace shardtrain::testing_fsdp
