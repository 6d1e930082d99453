#include "shardtrain/train/startup.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"

namespace shardtrain::train {
namespace {

// Every rank times its own stages: the one that is stuck (it entered its stage first) usually fires first, and its
// line names what it was doing; the abort ends the others before they add theirs. `run_dir`: logging.run_dir where the
// run names one: the stages before the trainer enables the records (the ranks' agreement, the datasets, the checkpoint
// directory's claim) leave this rank's record there too, for the job scripts' restart decision (they left none).
[[noreturn]] void startup_expired(const Deadline::Stretch& s, const std::string& run_dir) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string message = fmt::format(
      "start-up: {} has not finished after {:g} s ({}) on rank {} ({}){}: a rank held up before it (a file system that "
      "stopped answering) or one that cannot reach the others (for NCCL: NCCL_SOCKET_IFNAME, NCCL_DEBUG=INFO) would "
      "hold the job until its time limit; ending the job",
      s.what, s.limit, s.key, rank, failure_record::node_name(), stopped_note(s.stopped));
  log::error("{}: {}", exit_code_name(ExitCode::Timeout), message);
  if (!failure_record::enabled() && !run_dir.empty()) failure_record::enable_this_rank(run_dir, rank);
  failure_record::write(ExitCode::Timeout, message);
  MpiSession::abort(ExitCode::Timeout);
}

}  // namespace

StartupWatch::StartupWatch(const TrainConfig& config, std::string failure_dir)
    : startup_timeout_(config.fsdp.startup_timeout),
      save_timeout_(config.checkpoint.save_timeout),
      deadline_([run_dir = std::move(failure_dir)](const Deadline::Stretch& s) { startup_expired(s, run_dir); }) {}

void StartupWatch::stage(std::string what) { deadline_.begin({std::move(what), startup_timeout_, "fsdp.startup_timeout"}); }

void StartupWatch::checkpoint_stage(std::string what) {
  deadline_.begin({std::move(what), save_timeout_, "checkpoint.save_timeout"});
}

void StartupWatch::done() { deadline_.end(); }

}  // namespace shardtrain::train
