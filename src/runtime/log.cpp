// Rank-prefixed log lines: "[r3 14:02:11.402 W] message" (host added for warnings and errors).
#include "shardtrain/runtime/log.hpp"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain {

LogLevel parse_log_level(std::string_view name) {
  if (name == "trace") return LogLevel::Trace;
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  throw UsageError(fmt::format("--log-level: unknown level '{}' (expected trace, debug, info, warn, error or off)", name));
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Trace: return "trace";
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warn";
    case LogLevel::Error: return "error";
    case LogLevel::Off: return "off";
  }
  return "?";
}

namespace log {
namespace {

struct State {
  LogConfig config;
  std::string host;
  std::mutex mutex;  // one line at a time from several threads
};

State& state() {
  static State s;
  return s;
}

char letter(LogLevel l) { return "TDIWEO"[static_cast<int>(l)]; }

}  // namespace

void configure(const LogConfig& config) {
  State& s = state();
  s.config = config;
  std::array<char, 256> host{};
  gethostname(host.data(), host.size() - 1);
  s.host = host.data();
}

const LogConfig& config() { return state().config; }

bool enabled(LogLevel level) {
  const LogConfig& c = state().config;
  if (level == LogLevel::Off || level < c.level) return false;
  return c.rank == 0 || c.all_ranks || level >= LogLevel::Warn;
}

void write(LogLevel level, std::string_view message) {
  State& s = state();
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string line = level >= LogLevel::Warn ? fmt::format("[r{}@{} {:02}:{:02}:{:02}.{:03} {}] {}\n", s.config.rank, s.host,
                                                           tm.tm_hour, tm.tm_min, tm.tm_sec, ms, letter(level), message)
                                             : fmt::format("[r{} {:02}:{:02}:{:02}.{:03} {}] {}\n", s.config.rank,
                                                           tm.tm_hour, tm.tm_min, tm.tm_sec, ms, letter(level), message);
  std::lock_guard<std::mutex> lock(s.mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace log
}  // namespace shardtrain
