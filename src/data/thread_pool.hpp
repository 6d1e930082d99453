// The worker threads of prepare-data and tokenizer train. Starting them can fail (too many for the system's limits:
// --threads 65536 did), and a std::thread destroyed while joinable ends the process with std::terminate, leaving the
// temporary files behind; here a failure to start is a UsageError, and no thread runs its work unless all started.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "shardtrain/data/documents.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/topology.hpp"

namespace shardtrain::data {

// The threads to start for --threads `requested`: 0 is every core this process may use (its CPU affinity), more than
// kMaxThreads are cut to it with a warning (65536 were accepted, and starting them ended the process), and a
// negative count is a UsageError.
inline int resolve_thread_count(int requested) {
  if (requested < 0)
    throw UsageError(fmt::format("--threads {}: expected 0 (every core this process may use) or more", requested));
  if (requested == 0) return std::min(usable_cores(), kMaxThreads);
  if (requested > kMaxThreads)
    log::warn("--threads {}: cut to {} (the most that prepare-data and tokenizer train start)", requested, kMaxThreads);
  return std::min(requested, kMaxThreads);
}

// std::thread(f), with the system's refusal to start it as a UsageError naming `what` ("the reading thread").
template <typename F>
std::thread start_thread(std::string_view what, F&& f) {
  try {
    return std::thread(std::forward<F>(f));
  } catch (const std::system_error& e) {
    throw UsageError(fmt::format("the system cannot start {} ({}): its limit on threads (ulimit -u) is reached", what,
                                 e.code().message()));
  }
}

// Runs body(t) for t in [0, count) on `count` threads and joins them. body must not throw (the callers keep each
// thread's exception and rethrow the first). When the system cannot start them all, none runs body: those started
// are released and joined, and the error is a UsageError naming the count and `option`, the one that asked for them
// (predict's --cpu-threads; the two-argument form: --threads).
template <typename Body>
void run_on_threads(size_t count, std::string_view option, Body&& body) {
  enum class Gate { Wait, Go, Abort };
  std::mutex mutex;
  std::condition_variable opened;
  Gate gate = Gate::Wait;
  std::vector<std::thread> pool;
  const auto release = [&](Gate g) {
    {
      std::lock_guard lock(mutex);
      gate = g;
    }
    opened.notify_all();
    for (auto& th : pool) th.join();
  };
  try {
    pool.reserve(count);
    for (size_t t = 0; t < count; ++t)
      pool.emplace_back([&, t] {
        {
          std::unique_lock lock(mutex);
          opened.wait(lock, [&] { return gate != Gate::Wait; });
          if (gate == Gate::Abort) return;
        }
        body(t);
      });
  } catch (const std::system_error& e) {
    const size_t started = pool.size();
    release(Gate::Abort);
    throw UsageError(fmt::format("{} threads: the system started only {} ({}); give fewer with {}", count, started,
                                 e.code().message(), option));
  } catch (...) {
    release(Gate::Abort);
    throw;
  }
  release(Gate::Go);
}

template <typename Body>
void run_on_threads(size_t count, Body&& body) {
  run_on_threads(count, "--threads", std::forward<Body>(body));
}

}  // namespace shardtrain::data
