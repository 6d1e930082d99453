// Checkpoints in HDF5: sharded (one file per shard rank of the first replica, with the optimizer
// states) or full (the model gathered unit by unit into one file, Hugging Face names). Every save is
// written to a temporary directory, renamed into place, and marked complete by a DONE file written
// last; loading maps each parameter's element range from the files that hold it, so a checkpoint
// saved at any world size, strategy and wrap policy loads into any other. Layout: docs/checkpoints.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardtrain/fsdp/engine.hpp"
#include "shardtrain/fsdp/plan.hpp"
#include "shardtrain/optim/adamw.hpp"

namespace shardtrain::checkpoint {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr const char* kFormatName = "shardtrain-checkpoint";

enum class StateDictType { Sharded, Full };
StateDictType parse_state_dict_type(std::string_view text);  // SHARDED_STATE_DICT | FULL_STATE_DICT; throws ConfigError
const char* state_dict_type_name(StateDictType t);

// Whether training was sound when a checkpoint was saved: its last step updated the weights (a finite loss, no
// spike). A checkpoint saved in a streak of skipped steps is Diverging; the rotation never removes the newest
// Healthy one (docs/checkpoints.md, "Retention and divergence"). Recorded in DONE.
enum class Health { Healthy, Diverging };

// What the layers above store beside the tensors (opaque to this layer).
struct SaveMeta {
  int64_t step = 0;
  std::string trainer_state = "{}";  // JSON: step, tokens, sampler position, schedule... (the train layer's)
  std::string config_toml;           // the resolved configuration
  std::string tokenizer;             // JSON: tokenizer name and hash
  Health health = Health::Healthy;
};

std::string step_dir_name(int64_t step);              // "step_00000120"
bool is_complete(const std::string& checkpoint_dir);  // DONE present (or there but unreadable: the loader says why)
// The complete checkpoints (step_N with DONE) of a directory, oldest first: (step, path).
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir);
// The newest complete checkpoint directly under `dir` ("" when there is none). Incomplete ones
// (a save killed half-way) are ignored.
std::string find_latest(const std::string& dir);
// What DONE says of a complete checkpoint's health (Healthy when it predates the record; Diverging when DONE is not
// the JSON object a save writes or its "healthy" is not a bool: such a checkpoint does not load either).
Health checkpoint_health(const std::string& checkpoint_dir);
// Removes what killed saves and cut-short removals left in `dir`: step_N.tmp and step_N directories without DONE
// whose every entry is a file a save writes (index.h5, rank_NNNNN.h5, model.h5). Anything else is left alone. Not
// while a save of this directory may be in flight (rank 0 calls it at a run's start and after each save it
// published). Returns what it removed.
std::vector<std::string> remove_incomplete(const std::string& dir);
// Renames a complete checkpoint that does not load to step_N.damaged (step_N.damaged-2, ... if taken): kept for
// inspection, no longer a candidate for --resume auto, and its step may be saved again. Returns the new name.
std::string set_aside_damaged(const std::string& checkpoint_dir);

// Which complete checkpoints of a directory a save leaves: the newest `keep_last` (0 = all), and besides
// them every one whose step is a multiple of `keep_every` (0 = none: milestones for later evaluation), and the
// newest Healthy one, however many Diverging ones came after it.
struct Retention {
  Retention(int keep_last_ = 0, int64_t keep_every_ = 0)
      : keep_last(keep_last_), keep_every(keep_every_) {}  // NOLINT: from keep_last
  int keep_last = 0;
  int64_t keep_every = 0;
};

// Disk space. What one checkpoint takes, all its files together (docs/checkpoints.md, "When a save fails"): `bytes`, an
// upper bound (the tensors' chunks as HDF5 stores them, plus an allowance for HDF5's own per dataset, group and file,
// the index and DONE), `data_bytes`, a lower bound (the tensors' chunks alone), and `inodes`, exact: its data files,
// index.h5, DONE and its directory (the save's temporary directory is renamed into it).
struct CheckpointSize {
  uint64_t bytes = 0;
  uint64_t data_bytes = 0;
  uint64_t inodes = 0;
  int data_files = 1;  // rank files (sharded) or model.h5 (full)
};
// From the elements of each unit's shard (sharded: every one of `shard_files` rank files holds param, exp_avg and
// exp_avg_sq of each; full: model.h5 holds the three of each tensor, `unit_shards` unused).
CheckpointSize checkpoint_size(const model::ModelSpec& spec, StateDictType type, int shard_files,
                               const std::vector<int64_t>& unit_shards);
// The same for this engine's mesh (what a save of it writes), and for a plan of one (`shardtrain check`).
CheckpointSize checkpoint_size(const fsdp::FsdpEngine& engine, StateDictType type);
CheckpointSize checkpoint_size(const model::ModelSpec& spec, const fsdp::FsdpPlan& plan, StateDictType type);

// What an unprivileged writer may still use where `dir` is, or would be created (its nearest existing ancestor): bytes
// and inodes (statvfs's f_bavail and f_favail). A file system without an inode limit (f_files 0) has `inodes_limited`
// false and `inodes` the largest value.
struct FreeSpace {
  uint64_t bytes = 0;
  uint64_t inodes = 0;
  bool inodes_limited = true;
};
FreeSpace free_space(const std::string& dir);
uint64_t available_bytes(const std::string& dir);
// "1.7 MiB free in DIR, a checkpoint takes 1.8 MiB" or "4 inodes free in DIR, a checkpoint takes 5 (...)": what
// falls short for a save of `size` ("" when both fit).
std::string space_shortfall(const std::string& dir, const FreeSpace& free, const CheckpointSize& size);
// How many checkpoints a directory holds at once during a save, milestones aside: keep_last (the save removes the
// ones its rotation lets go first when it lacks room), 2 with keep_last = 1 (the one kept goes only after the
// next is written), 0 with keep_last = 0 (every one is kept: no bound).
inline int checkpoints_at_save(int keep_last) { return keep_last == 1 ? 2 : keep_last; }

// How many checkpoints `dir` has room for, by bytes and by inodes, counting what the complete checkpoints there hold
// (the rotation removes them in time; milestones aside), against what keep_last holds at a save. The start line of
// `train` and the `space` line of `shardtrain check` (docs/checkpoints.md): the same function, the same words.
struct CheckpointRoom {
  enum class Verdict {
    NotOne,    // not even one checkpoint fits
    WillFail,  // keep_last's checkpoints do not fit, even at their lower bound: a save will fail
    MayFail,   // they fit at the lower bound, not at the estimate
    Enough,    // they fit at the estimate
    KeepsAll,  // keep_last = 0: no bound
  };
  Verdict verdict = Verdict::Enough;
  uint64_t room = 0;  // checkpoints of the estimated size that fit: the fewer of the bytes' and the inodes' figure
  std::string text;   // "a checkpoint takes ..., ... free in DIR: room for N (...)...", for a log or report line
};
CheckpointRoom checkpoint_room(const std::string& dir, const CheckpointSize& size, StateDictType type, Retention retention);

// Collective over the mesh's world. Returns the final directory (dir/step_XXXXXXXX). An existing
// complete checkpoint of the same step is left as it is (nothing is ever overwritten). Then removes the
// complete checkpoints of `dir` that `retention` does not keep.
// Before writing, every writer checks that its file system holds a whole checkpoint, bytes and inodes (checkpoint_size).
// When it does not and `retention` keeps at least 2, the checkpoints this save's rotation would remove anyway go first
// (never the newest); if that is not enough, nothing is written. Any failure, this check or a write on any rank,
// throws IoError on every rank alike, and the temporary directory is removed: the space goes back, and the
// complete checkpoints are as they were.
std::string save_sharded(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                         Retention retention);
// A full save: every parameter whole under its name, and AdamW's moments of it (as the seed's full state dict holds
// the optimizer's state), written by rank 0 unit by unit.
std::string save_full(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
                      Retention retention);

// A sharded save that does not hold up training (checkpoint.async_save). start() agrees on the step and
// makes the temporary directory like save_sharded, then copies this rank's shards and AdamW states into
// host memory (the only part the caller waits for) and writes its rank file from that snapshot on a thread
// of its own. poll() publishes the checkpoint (index, rename, DONE, rotation) once every rank's file is
// written; wait() waits for that. start(), poll() and wait() are collective over the world and must be
// called at the same points on every rank; one save at a time (start() waits for the previous one). A
// write that fails on any rank throws the same IoError from poll()/wait() on every rank, after rank 0 removed
// the .tmp directory; the destructor joins the writer and publishes nothing (its .tmp stays). The thread only writes HDF5 and
// files: no MPI, no device. The engine (and its mesh) must outlive a pending save: poll() and wait() use them.
class AsyncSave {
 public:
  AsyncSave();
  ~AsyncSave();
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;

  void start(fsdp::FsdpEngine& engine, const optim::AdamW& adamw, const std::string& dir, const SaveMeta& meta,
             Retention retention);
  std::string poll();  // the published directory, or "" while some rank is still writing (or nothing is pending)
  std::string wait();  // the published directory ("" when nothing was pending)
  bool pending() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct LoadResult {
  int64_t step = 0;
  StateDictType type = StateDictType::Sharded;
  std::string trainer_state, config_toml, tokenizer;
  bool optimizer_loaded = false;
};

// Loads a checkpoint (sharded or full) into this engine's shards, and into the optimizer's states when
// `adamw` is given and the checkpoint has them. Every rank reads only the element ranges of its own
// shards. Throws CheckpointError naming the file on anything missing, incomplete, corrupt or mismatched
// (a model config that differs from the engine's model).
LoadResult load(fsdp::FsdpEngine& engine, optim::AdamW* adamw, const std::string& checkpoint_dir);
class CheckpointReader;
// The same from a reader the caller already opened (no second pass over the index and file records).
LoadResult load(fsdp::FsdpEngine& engine, optim::AdamW* adamw, CheckpointReader& reader);

}  // namespace shardtrain::checkpoint
