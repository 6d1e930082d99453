// Rank-prefixed logging through fmt, to stderr (stdout stays clean for --json output).
// Rank 0 logs at the configured level; other ranks log warnings and errors only, unless
// all_ranks is set. The logger is the one piece of process-wide state: configured once in main
// before any thread starts, read-only afterwards (docs/architecture.md says why).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace shardtrain {

enum class LogLevel { Trace, Debug, Info, Warn, Error, Off };

LogLevel parse_log_level(std::string_view name);  // throws UsageError naming the accepted values
const char* log_level_name(LogLevel level);

struct LogConfig {
  int rank = 0;
  int world_size = 1;
  LogLevel level = LogLevel::Info;
  bool all_ranks = false;  // non-zero ranks also log below Warn
};

namespace log {

void configure(const LogConfig& config);
const LogConfig& config();
bool enabled(LogLevel level);
void write(LogLevel level, std::string_view message);

template <typename... Args>
void at(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (enabled(level)) write(level, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void trace(fmt::format_string<Args...> f, Args&&... args) {
  at(LogLevel::Trace, f, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  at(LogLevel::Debug, f, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  at(LogLevel::Info, f, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  at(LogLevel::Warn, f, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  at(LogLevel::Error, f, std::forward<Args>(args)...);
}

}  // namespace log
}  // namespace shardtrain
