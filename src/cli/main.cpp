// shardtrain: one binary, one subcommand per job. main() owns the MPI session (created first,
// destroyed last) and is the only place that turns an exception into a log line and an exit code.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>
#include <exception>
#include <optional>

#include <CLI/CLI.hpp>

#include "command.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/runtime.hpp"

using namespace shardtrain;

namespace {

// One line per failure, not one per rank: most errors (a bad config, a mesh that does not fit) are
// raised identically on every rank. Rank 0 logs and aborts the job at once; other ranks wait a
// moment first, so their line appears only when rank 0 did not fail the same way.
int fail(const std::exception& e, ExitCode code) {
  if (MpiSession::active()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    log::error("{}: {}", exit_code_name(code), e.what());
    failure_record::write(code, e.what());  // for the job script that decides on a restart (once training has a run directory)
    MpiSession::abort(code);
  }
  log::error("{}: {}", exit_code_name(code), e.what());
  return static_cast<int>(code);
}

}  // namespace

int main(int argc, char** argv) {
  // A file that outgrows the process's size limit (ulimit -f) fails its write with EFBIG, which the writer turns
  // into an error naming the file, instead of the kernel killing the process mid-checkpoint with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"shardtrain: native sharded (FSDP) pretraining of Llama-style models over MPI, NCCL and HDF5",
               "shardtrain"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand name
  app.set_version_flag("--version", std::string(SHARDTRAIN_VERSION));
  cli::GlobalOptions global;
  app.add_option("--log-level", global.log_level, "trace, debug, info, warn, error or off (rank 0; other ranks log warnings)")
      ->capture_default_str();
  app.add_flag("--log-all-ranks", global.log_all_ranks, "every rank logs at --log-level");
  app.add_option("--ranks-per-node", global.ranks_per_node, "simulate nodes of N consecutive ranks (hybrid meshes on one machine)")
      ->envname("SHARDTRAIN_RANKS_PER_NODE")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", global.device, "auto, cpu or cuda")->capture_default_str();

  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);

  // Command-line errors come before MPI exists: print them once (launcher rank 0) and exit 2.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (launcher_rank() == 0) {
      const int rc = app.exit(e);
      return rc == 0 ? 0 : static_cast<int>(ExitCode::Usage);
    }
    return e.get_exit_code() == 0 ? 0 : static_cast<int>(ExitCode::Usage);
  }

  const cli::Command* selected = nullptr;
  for (const auto& c : commands) {
    if (c.app->parsed()) selected = &c;
  }
  if (!selected) return static_cast<int>(ExitCode::Usage);

  RuntimeOptions options;
  try {
    options.log_level = parse_log_level(global.log_level);
    options.device = parse_device_preference(global.device);
    options.ranks_per_node = global.ranks_per_node;
    options.log_all_ranks = global.log_all_ranks;
  } catch (const Error& e) {
    if (launcher_rank() == 0) std::fprintf(stderr, "shardtrain: %s\n", e.what());
    return static_cast<int>(e.code());
  }

  if (selected->launch == cli::Launch::Offline) {
    log::configure(LogConfig{0, 1, options.log_level, false});
    try {
      return selected->run(nullptr);
    } catch (const Error& e) {
      return fail(e, e.code());
    } catch (const std::exception& e) {
      return fail(e, ExitCode::Internal);
    }
  }

  std::optional<MpiSession> session;
  try {
    session.emplace(&argc, &argv);
    Runtime runtime(*session, options);
    return selected->run(&runtime);
  } catch (const Error& e) {
    return fail(e, e.code());
  } catch (const std::exception& e) {
    return fail(e, ExitCode::Internal);
  }
}
