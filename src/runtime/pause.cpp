// The words for a pause the watchdogs do not count (pause.hpp).
#include "shardtrain/runtime/pause.hpp"

#include <fmt/format.h>

#include "shardtrain/runtime/log.hpp"

namespace shardtrain {

std::string stopped_note(double seconds) {
  if (seconds <= 0) return {};
  return fmt::format(", not counting {:.1f} s this process was stopped (Ctrl-Z, SIGSTOP or a paused machine)", seconds);
}

void log_stopped(double seconds, const std::string& where, const std::string& key) {
  log::warn(
      "the process was stopped for {:.1f} s (Ctrl-Z, SIGSTOP or a paused machine) {}: that time is not "
      "counted against {}",
      seconds, where, key);
}

}  // namespace shardtrain
