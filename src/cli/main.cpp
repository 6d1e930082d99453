// shardtrain: one binary, one subcommand per job. main() owns the MPI session (created first,
// destroyed last) and is the only place that turns an exception into a log line and an exit code.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>
#include <exception>
#include <filesystem>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "command.hpp"
#include "shardtrain/runtime/deadline.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/failure_record.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/runtime.hpp"
#include "shardtrain/runtime/topology.hpp"
#include "shardtrain/train/config_io.hpp"
#include "shardtrain/train/preemption.hpp"

using namespace shardtrain;

namespace {

// One line per failure, not one per rank: most errors (a bad config, a mesh that does not fit) are
// raised identically on every rank. Rank 0 logs and aborts the job at once; other ranks wait a
// moment first, so their line appears only when rank 0 did not fail the same way. An error known
// to be raised on every rank (on_every_rank) is left to rank 0 however slowly its abort arrives.
int fail(const std::exception& e, ExitCode code) {
  // A failing rank is past preemption: the SIGTERM with which MPI_Abort ends the other ranks must end this one too
  // (train catches it from before MPI_Init; caught, a rank would go on to log the same error a second time).
  for (const int sig : train::PreemptionHooks::kStopSignals) std::signal(sig, SIG_DFL);
  if (MpiSession::active()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
      // Rank 0 raised the same error and its abort ends this process; the wait is a bound, should it never come.
      const Error* shared = dynamic_cast<const Error*>(&e);
      std::this_thread::sleep_for(std::chrono::seconds(shared && shared->raised_on_every_rank() ? 60 : 1));
    }
    log::error("{}: {}", exit_code_name(code), e.what());
    failure_record::write(code,
                          e.what());  // for the job script that decides on a restart (once training has a run directory)
    MpiSession::abort(code);
  }
  log::error("{}: {}", exit_code_name(code), e.what());
  return static_cast<int>(code);
}

// The start before a command's own watch (train's StartupWatch): MPI_Init, the topology, CUDA's start and the GPU
// identities exchanged among a machine's ranks. A rank that never starts (its node, its file system, the launcher's
// daemon) holds every other rank in MPI_Init, and a GPU that stopped answering holds its rank in CUDA's start and
// the machine's other ranks in the exchange, until the job's time limit, saying nothing. Every rank times its own
// stages; one waiting on others gives the rank it waits for a moment to speak first (Deadline::Stretch::grace).
// `run_dir`: logging.run_dir where the run names one, for this rank's failure record.
[[noreturn]] void start_expired(const Deadline::Stretch& s, const std::string& run_dir) {
  const bool mpi = MpiSession::active();
  int rank = launcher_rank();
  if (mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  else log::configure(LogConfig{rank, launcher_size(), LogLevel::Info, false});  // the Runtime had not yet
  const std::string message = fmt::format(
      "start-up: {} has not finished after {:g} s ({}) on rank {} ({}){}: a rank that did not start, or whose GPU "
      "stopped answering (nvidia-smi on its node, Xid lines in its kernel log), holds the job until its time limit; "
      "ending the job",
      s.what, s.limit, s.key, rank, failure_record::node_name(), stopped_note(s.stopped));
  // Without MPI there is no abort to end the others: each rank ends itself, and the launcher's rank 0 speaks first.
  if (!mpi && rank != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  log::error("{}: {}", exit_code_name(ExitCode::Timeout), message);
  // In run_dir/failures/: a rank held up in a stretch of its own (CUDA's start) names its node, which the Slurm
  // scripts leave out of the restart; one waiting on others cannot tell whom it waits for.
  if (!run_dir.empty()) {
    failure_record::enable_this_rank(run_dir, rank);
    failure_record::write(ExitCode::Timeout, message, s.grace == 0 ? std::vector<int>{rank} : std::vector<int>{});
  }
  MpiSession::abort(ExitCode::Timeout);
}

// Seconds a start-up stage that waits on other ranks gives the one it waits for to speak first.
constexpr double kWaitGrace = 5;

// Ranks per simulated node: a count a machine could hold (the flag, or SHARDTRAIN_RANKS_PER_NODE when the flag is
// absent). Throws UsageError naming where the value came from.
using cli::kMaxRanksPerNode;
int parse_ranks_per_node(std::string_view text, std::string_view from) {
  int n = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || p != text.data() + text.size() || n < 1 || n > kMaxRanksPerNode)
    throw UsageError(fmt::format("{}: expected a number of ranks per node from 1 to {}", from, kMaxRanksPerNode));
  return n;
}

// The `nth` word on the command line (0: the first) that is not an option or a global option's value: the
// subcommand asked for, then its own subcommand (`bench ops`), where the words right after it are.
std::string subcommand_word(int argc, char** argv, int nth = 0) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.rfind("-", 0) == 0) {
      if ((a == "--log-level" || a == "--ranks-per-node" || a == "--device") && i + 1 < argc) ++i;
      continue;
    }
    if (nth-- == 0) return std::string(a);
  }
  return {};
}

// Names of `app`'s subcommands, comma-separated.
std::string subcommand_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// A command-line error in the words of the rest of the tool: an unknown --section.key names the section's keys (as
// the same key in a TOML file does), an option given twice says so; the rest is CLI11's own message.
std::string usage_message(const CLI::ParseError& e, const CLI::App& top) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    for (const std::string& extra : top.remaining(true)) {  // a command's extras fall through to the top
      if (!extra.starts_with("--") || extra.find('.') == std::string::npos) continue;
      const std::string key = extra.substr(2, extra.find('=') - 2);
      try {
        train::TrainConfig scratch;
        train::apply_override(scratch, key, "");
      } catch (const ConfigError& ce) {
        if (std::string_view(ce.what()).find(": unknown ") != std::string_view::npos) return ce.what();
      }
    }
    return what;
  }
  // "--model.hidden_size: At Most 1 required but received 2"
  const std::string_view at_most = ": At Most 1 required but received ";
  if (const auto at = what.find(at_most); at != std::string::npos)
    return fmt::format("{}: given {} times; give it once", what.substr(0, at), what.substr(at + at_most.size()));
  return what;
}

// An exception no command classified, as the exit code it still deserves: a file system call that failed on a path
// (std::filesystem's errors name the call, the reason and the paths) is an I/O error, anything else a bug.
ExitCode unclassified_code(const std::exception& e) {
  if (dynamic_cast<const std::filesystem::filesystem_error*>(&e)) return ExitCode::Io;
  // fmt::print's failed write to a full disk, a device error, a file size limit (it throws std::system_error).
  if (const auto* s = dynamic_cast<const std::system_error*>(&e); s && s->code().category() == std::generic_category())
    for (const int err : {ENOSPC, EIO, EDQUOT, EFBIG, EROFS, EPIPE})
      if (s->code().value() == err) return ExitCode::Io;
  return ExitCode::Internal;
}

// What a command printed on standard output reached it (stdio buffers it: a full disk under `> file` is seen at the
// last flush), else exit code 8: `generate > f` and `train --print-config > f` on a full disk left empty files with
// exit 0. train's outcome stands (its product is its checkpoints; a finished run is not made an I/O error), said.
int with_stdout_checked(int rc, const cli::Command& command) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout)) return rc;
  if (err == EPIPE) return rc;  // train only (others die of SIGPIPE): the reader chose to stop reading
  const std::string why = !flushed && err != 0 ? std::strerror(err) : "a write failed";
  if (command.stops_on_signals) {
    log::error("{}: standard output could not be written ({}); the run's outcome stands", command.app->get_name(), why);
    return rc;
  }
  log::error("I/O error: {}: standard output could not be written ({}): what it printed is incomplete",
             command.app->get_name(), why);
  return rc == 0 ? static_cast<int>(ExitCode::Io) : rc;
}

// std::bad_alloc that no command turned into its own message: out of host memory (exit code 7, not restartable: the
// same sizes run out again), not an internal error.
Error out_of_host_memory(const std::string& command) {
  return Error(ExitCode::Device,
               fmt::format("out of host memory in {} (std::bad_alloc): the model or batch needs more than this process "
                           "can have (its memory, or an address-space limit: ulimit -v)",
                           command));
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: a SIGUSR1 or SIGTERM from here on is kept for train (exit 75), and for every other command
  // delivered again once the command is known (release_early_signals).
  train::PreemptionHooks::catch_signals_from_now();
  // A file that outgrows the process's size limit (ulimit -f) fails its write with EFBIG, which the writer turns
  // into an error naming the file, instead of the kernel killing the process mid-checkpoint with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"shardtrain: native sharded (FSDP) pretraining of Llama-style models over MPI, NCCL and HDF5", "shardtrain"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may follow the subcommand name
  app.set_version_flag("--version", std::string(SHARDTRAIN_VERSION));
  cli::GlobalOptions global;
  app.add_option("--log-level", global.log_level,
                 "trace, debug, info, warn, error or off (rank 0; other ranks log warnings)")
      ->capture_default_str();
  app.add_flag("--log-all-ranks", global.log_all_ranks, "every rank logs at --log-level");
  std::string ranks_per_node_text;
  app.add_option("--ranks-per-node", ranks_per_node_text,
                 fmt::format("simulate nodes of N consecutive ranks (hybrid meshes on one machine), 1 to {} (default: "
                             "SHARDTRAIN_RANKS_PER_NODE, else the real nodes)",
                             kMaxRanksPerNode));
  app.add_option("--device", global.device, "auto, cpu or cuda")->capture_default_str();

  std::vector<cli::Command> commands;
  cli::add_commands(app, commands);

  // Command-line errors come before MPI exists: print them once (launcher rank 0) and exit 2.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // One line in the format of every other error, from launcher rank 0 only.
    if (launcher_rank() == 0) log::configure(LogConfig{0, 1, LogLevel::Info, false});
    // CLI11 reports an unknown subcommand as an unexpected argument (or as none given): name it and the commands.
    const std::string word = subcommand_word(argc, argv);
    const auto named =
        std::find_if(commands.begin(), commands.end(), [&](const cli::Command& c) { return c.app->check_name(word); });
    if (!word.empty() && e.get_exit_code() != 0 && named == commands.end()) {
      std::string names;
      for (const auto& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
      if (launcher_rank() == 0)
        log::error("usage error: unknown command '{}' (expected one of: {}; see shardtrain --help)", word, names);
      return static_cast<int>(ExitCode::Usage);
    }
    // The same one level down (`bench foo`, `checkpoint frob`), where CLI11 only says a subcommand is required.
    if (named != commands.end() && e.get_exit_code() != 0 && !named->app->get_subcommands({}).empty()) {
      const std::string sub = subcommand_word(argc, argv, 1);
      const CLI::App& app_of = *named->app;
      const auto subs = app_of.get_subcommands([&](const CLI::App* a) { return a->check_name(sub); });
      if (subs.empty()) {
        const std::string what =
            sub.empty() ? fmt::format("{}: no command given", word) : fmt::format("unknown {} command '{}'", word, sub);
        if (launcher_rank() == 0)
          log::error("usage error: {} (expected one of: {}; see shardtrain {} --help)", what, subcommand_names(app_of),
                     word);
        return static_cast<int>(ExitCode::Usage);
      }
    }
    if (e.get_exit_code() == 0) return launcher_rank() == 0 ? app.exit(e) : 0;  // --help, --version
    if (launcher_rank() == 0) {
      // The command's own help: `tokenizer decode abc` pointed at `tokenizer --help`, which lists no decode options.
      std::string help = named != commands.end() ? word + " " : std::string();
      if (named != commands.end() && !named->app->get_subcommands({}).empty()) {
        const std::string sub = subcommand_word(argc, argv, 1);
        if (!named->app->get_subcommands([&](const CLI::App* a) { return a->check_name(sub); }).empty()) help += sub + " ";
      }
      log::error("usage error: {} (see shardtrain {}--help)", usage_message(e, app), help);
    }
    return static_cast<int>(ExitCode::Usage);
  }

  const cli::Command* selected = nullptr;
  for (const auto& c : commands) {
    if (c.app->parsed()) selected = &c;
  }
  if (!selected) return static_cast<int>(ExitCode::Usage);
  if (!selected->stops_on_signals) train::PreemptionHooks::release_early_signals();
  // A run whose output goes to a reader that stopped reading (`train ... | head`, `| grep -m1`) was killed by SIGPIPE
  // at its next line, exit 141, nothing saved: its writes now fail (EPIPE, ignored) and it trains on. Other commands
  // keep the default, ending as Unix tools do when their reader goes.
  if (selected->stops_on_signals) std::signal(SIGPIPE, SIG_IGN);

  RuntimeOptions options;
  try {
    options.log_level = parse_log_level(global.log_level);
    options.device = parse_device_preference(global.device);
    if (!ranks_per_node_text.empty()) {
      options.ranks_per_node =
          parse_ranks_per_node(ranks_per_node_text, fmt::format("--ranks-per-node {}", ranks_per_node_text));
    } else if (const char* env = std::getenv("SHARDTRAIN_RANKS_PER_NODE"); env && *env) {
      options.ranks_per_node = parse_ranks_per_node(env, fmt::format("SHARDTRAIN_RANKS_PER_NODE='{}'", env));
    }
    options.log_all_ranks = global.log_all_ranks;
  } catch (const Error& e) {
    if (launcher_rank() == 0) {
      log::configure(LogConfig{0, 1, LogLevel::Info, false});
      log::error("{}: {}", exit_code_name(e.code()), e.what());
    }
    return static_cast<int>(e.code());
  }

  if (selected->launch == cli::Launch::Offline) {
    // Started by a launcher with several processes (`mpirun -np 8 shardtrain consolidate ...`, `srun` over a job's
    // tasks): one process does the work. Otherwise each would write the same output at once, and fail on the others'
    // temporary files after it had succeeded.
    if (launcher_rank() > 0) return 0;
    log::configure(LogConfig{0, 1, options.log_level, false});
    if (const int n = launcher_size(); n > 1)
      log::warn("{} is an offline command: it runs once, here (launcher rank 0); the other {} processes exit at once",
                selected->app->get_name(), n - 1);
    if (options.device == DevicePreference::Cuda && !selected->offline_device)
      log::warn(
          "--device cuda: {} runs on the CPU, offline (--device chooses the device of train, evaluate, bench, env "
          "and parity dump)",
          selected->app->get_name());
    try {
      return with_stdout_checked(selected->run(nullptr), *selected);
    } catch (const Error& e) {
      return fail(e, e.code());
    } catch (const std::bad_alloc&) {
      return fail(out_of_host_memory(selected->app->get_name()), ExitCode::Device);
    } catch (const std::exception& e) {
      return fail(e, unclassified_code(e));
    }
  }

  std::optional<MpiSession> session;
  try {
    // Timed from MPI_Init until the Runtime stands (start_expired), against the command's fsdp.startup_timeout. (A rank
    // whose file system holds the configuration's read holds the others in MPI_Init: they speak.)
    const cli::StartSettings settings = selected->start_settings ? selected->start_settings() : cli::StartSettings{};
    const double limit = settings.configured ? settings.timeout : train::TrainConfig{}.fsdp.startup_timeout;
    const std::string key = settings.configured ? "fsdp.startup_timeout" : "fsdp.startup_timeout's default";
    std::optional<Deadline> start(std::in_place,
                                  [run_dir = settings.run_dir](const Deadline::Stretch& s) { start_expired(s, run_dir); });
    start->begin({"MPI_Init (every rank of the job starts and reaches it)", limit, key, kWaitGrace});
    session.emplace(&argc, &argv);
    Runtime runtime(*session, options, [&](std::string what, bool waits_on_others) {
      start->begin({std::move(what), limit, key, waits_on_others ? kWaitGrace : 0.0});
    });
    start.reset();
    return with_stdout_checked(selected->run(&runtime), *selected);
  } catch (const Error& e) {
    return fail(e, e.code());
  } catch (const std::bad_alloc&) {
    return fail(out_of_host_memory(selected->app->get_name()), ExitCode::Device);
  } catch (const std::exception& e) {
    return fail(e, unclassified_code(e));
  }
}
