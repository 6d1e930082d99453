// Start-up checks that `train` makes on its ranks and `shardtrain check` makes offline, each in one function that
// both call, so that the preflight refuses what the run would refuse, with the same exit code and message
// (docs/cluster.md, "Preflight"). The datasets, the run's length and the checkpoint to resume from are in inputs.hpp.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/checkpoint/source.hpp"
#include "shardtrain/data/dataset.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::train {

// checkpoint.init_from, opened and vetted as the run imports it, before any weight is read: it exists and holds
// weights, and they were trained on the dataset's tokenizer (`dataset` null: not checked); CheckpointError naming the
// file and the field otherwise (exit code 5). That their model is the configured one, tensor for tensor, is the next
// check, made once: by checkpoint::import_weights in a run, by check_source_tensors in `shardtrain check`.
std::unique_ptr<checkpoint::TensorSource> open_init_from(const TrainConfig& c, const data::TokenDataset* dataset);

// `--resume auto` when none of the complete checkpoints of `dir` loads: the refusal (exit code 5), with each one's
// error, newest first.
std::string no_checkpoint_loads_problem(const std::string& dir, const std::vector<std::string>& errors);

// A directory the run makes or writes into, named by its config key: it exists as a directory, or the nearest
// ancestor that exists is a directory where one can be made; probed by making a directory and removing it (access()
// would say yes to root on a read-only or virtual file system). IoError (exit code 8) naming the key, the path and the
// file system's reason. `Create` then makes the directory (train); `LookOnly` leaves everything as it was (check).
enum class DirProbe { Create, LookOnly };
void require_writable_dir(const std::string& key, const std::string& dir, DirProbe probe);

// Inodes where a directory is: what the run makes there at its start (`dir` and each missing folder above it, then
// `files` in it: `what` names them), against the free inodes of its file system (checkpoint::free_space), together with
// the `earlier` needs that lie on the same one. A probe of the directory takes one inode and gives it back, so a file
// system that has a few left passed require_writable_dir, and the run then could not make its lock file, config.toml or
// first checkpoint. IoError (exit code 8) naming the key, the path, the file system's reason and the count.
struct InodeNeed {
  std::string key, dir;
  uint64_t files = 0;
  std::string what;
};
uint64_t inodes_to_make(const InodeNeed& need);  // files + the folders to create
void require_inodes(const InodeNeed& need, const std::vector<InodeNeed>& earlier);

// The run directory a run without logging.run_dir makes at `when`: logging.runs_root/NAME-YYYYmmdd-HHMMSS (NAME:
// logging.name, "run" when empty). `shardtrain check` probes this name as train makes it: a logging.name too long for
// the file system passed check and failed the run (exit 8).
std::string generated_run_dir(const TrainConfig& c, std::time_t when);

}  // namespace shardtrain::train
