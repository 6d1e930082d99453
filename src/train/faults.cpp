// SHARDTRAIN_FAULT (faults.hpp): the plan's parser and the injection of one rank's fault, for the watchdog,
// launcher and divergence tests.
#include "shardtrain/train/faults.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"

namespace shardtrain::train {

const char* rank_fault_name(RankFault::Kind k) {
  switch (k) {
    case RankFault::Kind::Stall: return "stall";
    case RankFault::Kind::Kill: return "kill";
    case RankFault::Kind::Freeze: return "freeze";
    case RankFault::Kind::DeviceError: return "device_error";
    case RankFault::Kind::MachineCheck: return "mce";
  }
  return "?";
}

FaultPlan FaultPlan::parse(const std::string& spec) {
  FaultPlan plan;
  auto bad = [&](const std::string& why) {
    return UsageError(fmt::format(
        "SHARDTRAIN_FAULT='{}': {} (expected faults separated by ';', each nan_grad:STEP[,STEP|,FIRST-LAST...], "
        "bad_data:FIRST-LAST, slow_update:MS, slow_step:MS, stall:RANK@STEP, kill:RANK@STEP, freeze:RANK@STEP, device_error:RANK@STEP or "
        "mce:RANK@STEP, the last five with STEP 'start' for start-up, and optionally @NODE)",
        spec, why));
  };
  // A whole non-negative number, or a usage error naming `what`.
  auto number = [&](const std::string& text, const std::string& what) -> int64_t {
    size_t used = 0;
    int64_t v = -1;
    try {
      v = std::stoll(text, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (text.empty() || used != text.size() || v < 0 || !std::isdigit(static_cast<unsigned char>(text[0])))
      throw bad(fmt::format("not a {}: '{}'", what, text));
    return v;
  };
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find(';', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon),
                      arg = colon == std::string::npos ? std::string() : item.substr(colon + 1);
    if (colon == std::string::npos) throw bad(fmt::format("unknown fault '{}'", item));
    if (name == "stall" || name == "kill" || name == "freeze" || name == "device_error" || name == "mce") {
      const size_t at = arg.find('@');
      if (at == std::string::npos) throw bad(fmt::format("expected {}:RANK@STEP, got '{}'", name, item));
      RankFault f;
      f.kind = name == "stall"    ? RankFault::Kind::Stall
               : name == "kill"   ? RankFault::Kind::Kill
               : name == "freeze" ? RankFault::Kind::Freeze
               : name == "mce"    ? RankFault::Kind::MachineCheck
                                  : RankFault::Kind::DeviceError;
      f.rank = static_cast<int>(number(arg.substr(0, at), "rank"));
      const size_t node_at = arg.find('@', at + 1);
      const std::string when = arg.substr(at + 1, node_at == std::string::npos ? std::string::npos : node_at - at - 1);
      f.step = when == "start" ? 0 : number(when, "step number");  // "start": during start-up, as it opens the datasets
      if (node_at != std::string::npos) {
        f.node = arg.substr(node_at + 1);
        if (f.node.empty()) throw bad(fmt::format("expected a node name after the second '@', got '{}'", item));
      }
      if (f.step < 1 && when != "start") throw bad(fmt::format("steps count from 1 ('start' for start-up): '{}'", item));
      plan.rank_faults.push_back(f);
      continue;
    }
    if (name == "slow_update") {
      plan.slow_update_ms = static_cast<int>(std::min<int64_t>(number(arg, "delay in milliseconds"), 60'000));
      continue;
    }
    if (name == "slow_step") {
      plan.slow_step_ms = static_cast<int>(std::min<int64_t>(number(arg, "delay in milliseconds"), 60'000));
      continue;
    }
    if (name == "bad_data") {
      const size_t dash = arg.find('-');
      const auto first = static_cast<uint64_t>(number(arg.substr(0, dash), "sample number"));
      const auto last =
          dash == std::string::npos ? first : static_cast<uint64_t>(number(arg.substr(dash + 1), "sample number"));
      if (last < first) throw bad(fmt::format("expected bad_data:FIRST-LAST with FIRST <= LAST, got '{}'", item));
      plan.bad_samples.emplace_back(first, last);
      continue;
    }
    if (name != "nan_grad") throw bad(fmt::format("unknown fault '{}'", name));
    size_t start = 0;
    while (start <= arg.size()) {
      size_t comma = arg.find(',', start);
      if (comma == std::string::npos) comma = arg.size();
      const std::string range = arg.substr(start, comma - start);
      start = comma + 1;
      const size_t dash = range.find('-');
      const int64_t first = number(range.substr(0, dash), "step number");
      const int64_t last = dash == std::string::npos ? first : number(range.substr(dash + 1), "step number");
      if (first < 1 || last < first) throw bad("steps count from 1: " + range);
      for (int64_t s = first; s <= last; ++s) plan.nan_grad_steps.push_back(s);
    }
  }
  return plan;
}

bool FaultPlan::nan_grad_at(int64_t step) const {
  return std::find(nan_grad_steps.begin(), nan_grad_steps.end(), step) != nan_grad_steps.end();
}

bool FaultPlan::bad_data_in(uint64_t epoch, uint64_t first, uint64_t count) const {
  if (epoch != 0 || count == 0) return false;
  for (const auto& [a, b] : bad_samples)
    if (first <= b && a < first + count) return true;
  return false;
}

const RankFault* FaultPlan::rank_fault_at(int rank, int64_t step) const {
  for (const RankFault& f : rank_faults) {
    if (f.rank == rank && f.step == step && (f.node.empty() || f.node == failure_record::node_name())) return &f;
  }
  return nullptr;
}

void FaultPlan::check_ranks(int world_size) const {
  for (const RankFault& f : rank_faults) {
    if (f.rank >= world_size)
      throw UsageError(fmt::format("SHARDTRAIN_FAULT: {}:{}@{} names rank {}, but the world has ranks 0-{}",
                                   rank_fault_name(f.kind), f.rank, f.step, f.rank, world_size - 1));
  }
}

namespace {

// "before step N", or "during start-up" for STEP 'start'.
std::string when(const RankFault& f) {
  return f.step == 0 ? std::string("during start-up") : fmt::format("before step {}", f.step);
}

}  // namespace

// What each fault does, as its comment in faults.hpp says.
void inject(const RankFault& f) {
  switch (f.kind) {
    case RankFault::Kind::Stall:
      log::warn("train: SHARDTRAIN_FAULT: rank {} stops answering {}", f.rank, when(f));
      std::this_thread::sleep_for(std::chrono::hours(1));
      break;
    case RankFault::Kind::Kill:
      log::warn("train: SHARDTRAIN_FAULT: rank {} kills itself (SIGKILL) {}", f.rank, when(f));
      std::fflush(nullptr);
      std::raise(SIGKILL);
      break;
    case RankFault::Kind::DeviceError:
      throw Error(ExitCode::Device,
                  fmt::format("SHARDTRAIN_FAULT: an injected device error on rank {} (node {}) {}, as a GPU "
                              "with an uncorrectable ECC error gives",
                              f.rank, failure_record::node_name(), when(f)));
    case RankFault::Kind::MachineCheck: {
      // What the kernel sends a process that touches memory with an uncorrectable error: SIGBUS with
      // si_code BUS_MCEERR_AR. A process may send itself a signal with a kernel si_code.
      log::warn("train: SHARDTRAIN_FAULT: rank {} receives SIGBUS (BUS_MCEERR_AR: a machine check) {}", f.rank, when(f));
      std::fflush(nullptr);
      siginfo_t info{};
      info.si_signo = SIGBUS;
      info.si_code = BUS_MCEERR_AR;
      info.si_pid = getpid();
      info.si_uid = getuid();
      syscall(SYS_rt_tgsigqueueinfo, getpid(), gettid(), SIGBUS, &info);
      std::this_thread::sleep_for(std::chrono::hours(1));  // the signal ends the process first
      break;
    }
    case RankFault::Kind::Freeze:
      log::warn("train: SHARDTRAIN_FAULT: rank {} stops itself (SIGSTOP: every thread, MPI progress included) {}", f.rank,
                when(f));
      std::fflush(nullptr);
      std::raise(SIGSTOP);
      break;
  }
}

}  // namespace shardtrain::train
