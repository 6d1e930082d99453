// How a subcommand plugs into the `shardtrain` binary. Each command lives in cmd_<name>.cpp and
// exposes one add_<name>_command() that declares its options and returns how to run it.
// Offline commands (check, tokenizer, prepare-data, dataset, consolidate, plan, generate, parity) never initialize MPI,
// so they run on a login node; MPI commands (train, evaluate, env, bench: `bench step` runs the trainer under
// mpirun, `bench model` and `bench ops` take one rank) get a Runtime built after MPI_Init_thread.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "shardtrain/runtime/runtime.hpp"

namespace shardtrain::train {
struct TrainConfig;
}

namespace shardtrain::cli {

enum class Launch { Offline, Mpi };

// The start before the command's own (main.cpp): its limit, and the run directory whose failures/ gets this rank's
// record when it expires (a GPU that stopped answering names its node, for the Slurm scripts to leave it out).
struct StartSettings {
  double timeout = 0;       // fsdp.startup_timeout, where configured
  bool configured = false;  // else the default's
  std::string run_dir;      // logging.run_dir; "" for none
};

struct Command {
  CLI::App* app = nullptr;
  Launch launch = Launch::Offline;
  // Offline commands are called with nullptr. Returns the process exit code.
  std::function<int(Runtime*)> run;
  // An offline command that reads the global --device itself (parity dump); the others run on the CPU, and say so
  // when --device cuda is given (it was ignored without a word).
  bool offline_device = false;
  // Whether SIGUSR1 and SIGTERM ask the command to stop (train: save and exit 75), caught from the process's first
  // line (PreemptionHooks::catch_signals_from_now); for every other command they keep their default action.
  bool stops_on_signals = false;
  // MPI commands with a configuration: what of it times MPI's and the Runtime's start (main.cpp), read before MPI_Init.
  // Empty: the defaults.
  std::function<StartSettings()> start_settings;
};

// Options shared by every subcommand (they may follow the subcommand name).
struct GlobalOptions {
  std::string log_level = "info";
  bool log_all_ranks = false;
  std::string device = "auto";
};

// The most ranks per node a command takes (--ranks-per-node, --gpus-per-node): a count a machine could hold.
inline constexpr int kMaxRanksPerNode = 4096;
// The most ranks a job of plan, predict or check may have. Each count has its own bounds, but their product can
// still overflow an int; 2^20 is a thousand times the GPUs of today's largest clusters.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
// nodes x ranks per node; UsageError naming both options when the product is above kMaxWorldSize.
int world_size_of(int64_t nodes, int64_t ranks_per_node);

// For an option that names a file to write (--json, --trace, --markdown), found when the command line is read rather
// than after the work (UsageError, naming the option, the path and what it is): not empty, not an existing folder, in
// a folder that exists; not a device, FIFO or socket other than /dev/null and this process's standard output or error
// (written in place); not an existing HDF5 or safetensors file (a dataset, weights, a checkpoint's file); not inside a
// checkpoint directory (a folder holding DONE or index.h5, or named step_N).
CLI::Validator output_file_check();
// For an output that may be a folder (consolidate -o) or is checked by its command (prepare-data, tokenizer train):
// only the last rule above, a checkpoint directory being also a folder named as a save names one (step_N): a run's
// start and rotation remove such a folder with the files a save writes, and a user's export named model.h5 in it went.
CLI::Validator outside_checkpoints_check();

// CLI11 reads an integer with a leading 0 as octal, and 0x, 0o, 0b as other bases: `generate --max-tokens 010` made 8
// tokens and `tokenizer decode 0120` printed the text of id 80, exit 0 (the same ids on stdin were read as decimal).
// Makes every integer option and argument of `app` and its subcommands decimal: leading zeros are dropped, a base
// prefix is a usage error. add_commands applies it to the whole command line.
void decimal_integers(CLI::App& app);

// An unsigned value (a seed): CLI11 reads "-1" into one as 2^64 - 1 without a word, and CLI::NonNegativeNumber's
// message names a 300-digit bound.
CLI::Validator unsigned_check();

// A rate or fraction for an option: a finite number in (0, hi]. CLI::Range lets NaN through (every comparison with
// it is false) and names a 300-digit bound for an open end.
CLI::Validator positive_up_to(double hi, double lo = 0);  // lo > 0: from lo (inclusive)

// A count's bounds for an option: CLI::PositiveNumber's message names a 300-digit upper bound ("Value 0 not in
// range 0.000000 to 1797693..."); this one reads "Value 0 not in range 1 to 1073741824".
inline CLI::Range count_range(int64_t lo = 1, int64_t hi = int64_t{1} << 30) { return CLI::Range(lo, hi); }

// The CPU backend's --threads (bench, parity): 0 (the default count) to 1024, prepare-data's bound
// (data::kMaxThreads). OpenMP's runtime ends the process when the system refuses a thread (libgomp's "Thread creation
// failed", exit 1, or a crash at 65536): the bound, and require_threads_start before the first parallel region, make
// that a usage error.
CLI::Range cpu_threads_range();
// A storage dtype option (--dtype, --param-dtype, --reduce-dtype): fp32 or bf16 (f32, float32, float and bfloat16 read
// too). Another name was "unknown dtype 'fp16' (expected fp32, bf16, fp64, int32, ...)", not naming the option and
// listing types none of them takes.
CLI::Validator float_dtype_check();
// Starts and joins `count` threads (prepare-data's data::run_on_threads), so that a count the system will not start
// (its limit on threads, ulimit -u) is a UsageError naming `option` before OpenMP tries.
void require_threads_start(int count, std::string_view option);

Command add_env_command(CLI::App& parent);
Command add_plan_command(CLI::App& parent);                   // cmd_plan.cpp
Command add_predict_command(CLI::App& parent);                // cmd_predict.cpp
Command add_consolidate_command(CLI::App& parent);            // cmd_checkpoint.cpp
Command add_checkpoint_command(CLI::App& parent);             // cmd_checkpoint.cpp
Command add_generate_command(CLI::App& parent);               // cmd_generate.cpp
Command add_tokenizer_command(CLI::App& parent);              // cmd_tokenizer.cpp
Command add_prepare_data_command(CLI::App& parent);           // cmd_prepare_data.cpp
Command add_dataset_command(CLI::App& parent);                // cmd_dataset.cpp
Command add_bench_command(CLI::App& parent);                  // cmd_bench.cpp
Command add_parity_command(CLI::App& parent);                 // cmd_parity.cpp
Command add_train_command(CLI::App& parent);                  // cmd_train.cpp
Command add_check_command(CLI::App& parent);                  // cmd_check.cpp
Command add_evaluate_command(CLI::App& parent);               // cmd_evaluate.cpp
void add_commands(CLI::App& app, std::vector<Command>& out);  // commands.cpp: the list of all commands

// A number and the unit after it ("80GiB" -> 80, "gib"; the unit lower-cased, "" for none); nullopt when the text
// does not start with a number or the number does not parse (cmd_plan.cpp). For size options.
struct NumberWithUnit {
  double value = 0;
  std::string unit;
};
std::optional<NumberWithUnit> split_number_unit(const std::string& text);

// --gpu-memory of plan and check (cmd_plan.cpp): "80GiB" or "80" (GiB, 2^30 bytes), "80GB" (10^9 bytes), the
// unit in any case; bytes. Throws UsageError naming the option otherwise.
double parse_gpu_memory(const std::string& text);

// Before a Trainer allocates anything: the model's fp32 training state must fit this rank's share of its device's
// memory (the host's with offload_params or on the CPU). Throws ConfigError naming the size key otherwise.
void check_model_fits(const train::TrainConfig& config, const Runtime& rt);
// The same against `device_bytes` per rank on the device, named `device_name` (`shardtrain check --gpu-memory`); with
// fsdp.offload_params nothing (the state is in the nodes' host memory, which is not known offline).
void check_model_fits(const train::TrainConfig& config, int world, int local_size, double device_bytes,
                      const std::string& device_name);

// A path an earlier command recorded (a checkpoint's tokenizer and dataset, a dataset's tokenizer) is relative to
// the folder that command ran in. Kept as it is when absolute or found from here; otherwise the first existing
// `recorded` below `anchor`'s folder or one of its parents (a run's checkpoints lie below the folder it ran in),
// logged; otherwise unchanged, for the reader's own error to name. With `is_it`, a relative file that exists but is
// not the one recorded (another dataset or tokenizer of the same name in this folder: evaluate read it, exit 0) is
// passed over for the next place, and said.
std::string resolve_recorded_path(const std::string& recorded, const std::string& anchor,
                                  const std::function<bool(const std::string&)>& is_it = {});
// resolve_recorded_path's `is_it` for a tokenizer recorded by its hashes (data::same_tokenizer): the file at a path
// loads and is that tokenizer. Any file is it where no hash is recorded.
std::function<bool(const std::string&)> is_recorded_tokenizer(const std::string& hash, const std::string& encoding_hash);

// Writes `j` (indented) to PATH whole or not at all: a temporary file beside it, then a rename
// (commands.cpp). Throws IoError naming the file and `what` it holds.
void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& what);

}  // namespace shardtrain::cli
