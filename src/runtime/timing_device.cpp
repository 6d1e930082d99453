// The timing device (timing_device.hpp): clocks per stream, times per event, a host clock, and address ranges
// for device buffers.
#include "shardtrain/runtime/timing_device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::timing {
namespace {

// Handles and device addresses are non-canonical x86-64 / AArch64 addresses: no allocation of the process can
// return one, so they are told apart from real CUDA handles and host pointers by value, and a dereference faults.
constexpr uintptr_t kHandleBase = 0xF100'0000'0000'0000ull;
constexpr uintptr_t kDeviceBase = 0xD000'0000'0000'0000ull;
constexpr uintptr_t kDeviceEnd = 0xE000'0000'0000'0000ull;
constexpr uintptr_t kHostBase = 0xC000'0000'0000'0000ull;  // pinned host buffers (PinnedBuffer), as device ones
constexpr uintptr_t kHostEnd = 0xD000'0000'0000'0000ull;

TimingDevice* g_current = nullptr;

}  // namespace

const char* work_kind_name(WorkKind k) {
  switch (k) {
    case WorkKind::Compute: return "compute";
    case WorkKind::Comm: return "comm";
    case WorkKind::Copy: return "copy";
    case WorkKind::Host: return "host";
  }
  return "?";
}

TimingDevice::TimingDevice(HostCosts costs) : costs_(costs) { streams_[0] = Stream{}; }

void* TimingDevice::create_stream() {
  const uintptr_t h = kHandleBase + 16 * next_handle_++;
  Stream st;
  st.end = host_;
  streams_[h] = st;
  return reinterpret_cast<void*>(h);
}
void TimingDevice::destroy_stream(void* handle) { streams_.erase(reinterpret_cast<uintptr_t>(handle)); }
void* TimingDevice::create_event() {
  const uintptr_t h = kHandleBase + 16 * next_handle_++;
  events_[h] = Event{};
  return reinterpret_cast<void*>(h);
}
void TimingDevice::destroy_event(void* handle) { events_.erase(reinterpret_cast<uintptr_t>(handle)); }

TimingDevice::Stream& TimingDevice::stream(StreamRef s) {
  const auto it = streams_.find(reinterpret_cast<uintptr_t>(s.handle));
  if (it == streams_.end()) throw InternalError(fmt::format("timing device: stream {} was not made on it", s.handle));
  return it->second;
}
const TimingDevice::Stream& TimingDevice::stream(StreamRef s) const { return const_cast<TimingDevice*>(this)->stream(s); }
int TimingDevice::stream_index(StreamRef s) const {
  if (!s.handle) return 0;
  return static_cast<int>((reinterpret_cast<uintptr_t>(s.handle) - kHandleBase) / 16);
}
TimingDevice::Event& TimingDevice::event(void* handle) {
  const auto it = events_.find(reinterpret_cast<uintptr_t>(handle));
  if (it == events_.end()) throw InternalError(fmt::format("timing device: event {} was not made on it", handle));
  return it->second;
}

double TimingDevice::stream_now(StreamRef s) const {
  const Stream& st = stream(s);
  return std::max(st.end, st.wait_floor);
}

void TimingDevice::record_event(void* e, StreamRef s) {
  Stream& st = stream(s);
  Event& ev = event(e);
  // Done once the stream's earlier work and waits are, and not before the host issued it.
  ev.time = std::max({st.end, st.wait_floor, host_});
  const bool waiting = st.wait_floor > st.end;
  ev.cause = waiting ? st.wait_cause : st.last_label;
  ev.cause_kind = waiting ? st.wait_cause_kind : st.last_kind;
  ev.blocker = waiting ? st.wait_blocker : st.blocker;
  ev.recorded = true;
}

void TimingDevice::wait_event(void* e, StreamRef waiter) {
  const Event& ev = event(e);
  if (!ev.recorded) return;
  Stream& st = stream(waiter);
  if (ev.time > st.wait_floor) {
    st.wait_floor = ev.time;
    st.wait_cause = ev.cause;
    st.wait_cause_kind = ev.cause_kind;
    st.wait_blocker = ev.blocker;
  }
}

void TimingDevice::synchronize_event(void* e) {
  const Event& ev = event(e);
  if (ev.recorded) host_ = std::max(host_, ev.time);
  host_ += costs_.sync_s;
}

void TimingDevice::synchronize_stream(StreamRef s) { host_ = std::max(host_, stream_now(s)) + costs_.sync_s; }

void TimingDevice::synchronize_all() {
  for (const auto& [h, st] : streams_) host_ = std::max({host_, st.end, st.wait_floor});
  host_ += costs_.sync_s;
}

void TimingDevice::add_wait(const std::string& cause, WorkKind kind, double seconds) {
  ComputeIdle& i = idle_[cause];
  i.waiting_s += seconds;
  i.kind = kind;
}

void TimingDevice::enqueue(StreamRef s, WorkKind kind, double seconds, double issue_s, std::string_view label,
                           int resource) {
  host_ += issue_s;
  Stream& st = stream(s);
  double start = std::max({st.end, st.wait_floor, host_});
  if (resource >= 0) {  // the first gap of the resource from `start` on that holds the work
    std::map<double, double>& busy = busy_[resource];
    auto it = busy.upper_bound(start);
    if (it != busy.begin() && std::prev(it)->second > start) start = std::prev(it)->second;
    for (; it != busy.end() && it->first < start + seconds; ++it) start = std::max(start, it->second);
    busy[start] = start + seconds;
  }
  std::string full = context_.empty() ? std::string(label) : fmt::format("{} {}", context_, label);
  if (!s.handle && start > st.end) {
    // The compute stream stood idle: for the host (issuing late) or for an event (a collective, a copy, or work
    // that followed one back to back: the collective's until it ended).
    const double host_part = std::max(0.0, std::min(host_, start) - st.end);
    const double from = std::max(st.end, host_), wait_part = start - from;
    if (host_part > 0) idle_["host"].host_s += host_part;
    if (wait_part > 0) {
      const Blocker& b = st.wait_blocker;
      const double blocked = b.label.empty() ? 0.0 : std::clamp(b.end - from, 0.0, wait_part);
      if (blocked > 0) add_wait(b.label, b.kind, blocked);
      if (wait_part > blocked)
        add_wait(st.wait_cause.empty() ? "?" : st.wait_cause, st.wait_cause_kind, wait_part - blocked);
    }
  }
  tasks_.push_back(Task{stream_index(s), kind, host_, start, start + seconds, full, std::string(label)});
  if (kind == WorkKind::Comm || kind == WorkKind::Copy) {
    st.blocker = {full, start + seconds, kind};
  } else if (start > st.end) {
    st.blocker = {};  // it waited for something else, or for the host
  }
  st.end = start + seconds;
  st.wait_floor = 0;
  st.wait_cause.clear();
  st.wait_blocker = {};
  st.last_label = std::move(full);
  st.last_kind = kind;
}

void TimingDevice::host_work(double seconds, std::string_view label, WorkKind kind) {
  const double start = host_;
  host_ += seconds;
  tasks_.push_back(Task{-1, kind, start, start, host_,
                        context_.empty() ? std::string(label) : fmt::format("{} {}", context_, label), std::string(label)});
}

void TimingDevice::copy(void* dst, const void* src, size_t bytes, StreamRef s) {
  if (bytes == 0) return;
  const bool to_device = is_device_address(dst), from_device = is_device_address(src);
  // A pinned host buffer made here holds no memory either: nothing is written to it or read from it.
  const bool real_host = !is_host_address(dst) && !is_host_address(src);
  if (!to_device && !from_device) {
    if (real_host) std::memcpy(dst, src, bytes);  // host to host: real bytes, nothing on a stream
    return;
  }
  // What the device "holds": zeros (losses, norms, flags read back)
  if (!to_device && !is_host_address(dst)) std::memset(dst, 0, bytes);
  const double seconds = to_device && from_device ? memory_bound_seconds(2.0 * static_cast<double>(bytes))
                         : to_device              ? static_cast<double>(bytes) / costs_.h2d_bytes_per_s
                                                  : static_cast<double>(bytes) / costs_.d2h_bytes_per_s;
  const char* what = to_device && from_device ? "copy d2d" : to_device ? "copy h2d" : "copy d2h";
  enqueue(s, WorkKind::Copy, seconds, costs_.launch_s, fmt::format("{} {} B", what, bytes));
}

namespace {

// The next address of [base, end) after `used` bytes, `used` moved past `bytes`: aligned, with a gap, so that no two
// buffers touch; addresses are never reused.
void* next_address(uintptr_t base, uintptr_t end, uintptr_t& used, size_t bytes, const char* range) {
  const uintptr_t p = base + used;
  used += (bytes + 511) / 256 * 256;
  if (base + used >= end) throw InternalError(fmt::format("timing device: {} address range exhausted", range));
  return reinterpret_cast<void*>(p);
}

}  // namespace

void* TimingDevice::allocate(size_t bytes) { return next_address(kDeviceBase, kDeviceEnd, next_address_, bytes, "device"); }
void* TimingDevice::allocate_host(size_t bytes) {
  return next_address(kHostBase, kHostEnd, next_host_address_, bytes, "host");
}
void TimingDevice::release(void*, size_t) {}  // addresses are never reused: a stale pointer cannot alias a new one

bool TimingDevice::is_device_address(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v >= kDeviceBase && v < kDeviceEnd;
}

bool TimingDevice::is_host_address(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v >= kHostBase && v < kHostEnd;
}

bool TimingDevice::is_handle(const void* p) { return reinterpret_cast<uintptr_t>(p) >= kHandleBase; }

void TimingDevice::clear_record() {
  tasks_.clear();
  idle_.clear();
}

TimingDevice* current() { return g_current; }

TimingScope::TimingScope(TimingDevice& device) {
  if (g_current) throw InternalError("a timing device is already installed");
  g_current = &device;
}
TimingScope::~TimingScope() { g_current = nullptr; }

}  // namespace shardtrain::timing
