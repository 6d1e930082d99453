// The run directory's own files (docs/training.md, "The run directory") and the checks a start makes before it
// writes any of them: a run never replaces a config.toml or result.json it did not write, never removes more of
// failures/ than its own records, and (Trainer) writes nothing into a directory that exists until the start is
// validated, its checkpoint directory claimed and its resume done. `shardtrain check` asks the same questions.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

// The first line of every config.toml a run writes starts with this: how a run knows the file is its own.
inline constexpr std::string_view kConfigTomlMark = "# resolved configuration of this run";
// result.json's mark: this key with this value (cmd_train writes it).
inline constexpr const char* kResultMarkKey = "written_by";
inline constexpr const char* kResultMarkValue = "shardtrain train";
// What the run (and the scripts around it) keep in the run directory, for logging.metrics_file's message.
inline constexpr const char* kReservedRunDirNames =
    "config.toml, result.json, events.out.tfevents.*, failures, checkpoints, restarts.log, eval.json, hf, loss.png, "
    "throughput.png, prepare-*.out, consolidate-*.out, evaluate-*.out";
// Whether `name` is one of those (or a temporary of config.toml or result.json): not for the metrics file.
bool is_reserved_run_dir_name(std::string_view name);

// Whether shardtrain wrote the file at `path` (its mark, see above; a result.json of before the mark by its fields).
// A missing file is nobody's: false.
bool is_own_config_toml(const std::string& path);
bool is_own_result_json(const std::string& path);

// A run directory's checks before anything is made in it (rank 0 of `train`, and `check`): IoError naming
// logging.run_dir when `dir` exists and is not a directory; ConfigError naming logging.run_dir and the file when it
// holds a config.toml or result.json that shardtrain did not write (a run would replace it), naming
// logging.metrics_file when the metrics file's name there is a folder or not a regular file. Returns whether `dir`
// exists.
bool check_run_dir(const TrainConfig& c, const std::string& dir);

// What an earlier start left that describes that start: its failure records (failures/rank_N.json and their
// temporaries; the folder too when nothing else is in it) and its result.json (only when shardtrain wrote it).
// Anything else stays. Never throws: a file that cannot be removed is warned about.
void remove_failure_records(const std::string& dir);
void remove_own_result(const std::string& dir);

// Collective over `world`, first thing in `train` once the configuration resolved: rank 0 checks `dir`
// (check_run_dir) and, when it passes, removes the earlier start's failure records and result.json, so that however
// this start ends the directory tells of it and not of the one before (a refused start leaves no result.json, a
// launcher's exit status being no proof: docs/cluster.md). Every rank throws rank 0's error, with its exit code.
// Returns whether `dir` existed.
bool begin_start_in_run_dir(MPI_Comm world, const TrainConfig& c, const std::string& dir);

}  // namespace shardtrain::train
