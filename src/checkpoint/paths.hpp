// Internal: directory handling shared by saving and loading.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/checkpoint/checkpoint.hpp"

namespace shardtrain::checkpoint {

inline constexpr const char* kDoneFile = "DONE";
inline constexpr const char* kIndexFile = "index.h5";
inline constexpr const char* kFullFile = "model.h5";
// In a full checkpoint's model.h5 saved since 2026-11-29: AdamW's moments, /optimizer/exp_avg/NAME and
// /optimizer/exp_avg_sq/NAME beside each parameter NAME (one saved before holds the parameters alone).
inline constexpr const char* kFullOptimizerGroup = "optimizer";
std::string rank_file_name(int shard_rank);  // "rank_00003.h5"

std::optional<int64_t> parse_step_dir(const std::string& name);
// A save's folder name: step_N, or a save's temporary step_N.tmp (saves before 2026-11-28) or step_N.tmp-<id>.
bool is_save_dir_name(const std::string& name);
void fsync_path(const std::string& path);
void write_text_durably(const std::string& path, const std::string& text);
// final_dir + ".tmp-" + id, created (IoError when it exists): `id` is the save's own, so two writers never share one.
std::string prepare_temporary(const std::string& final_dir, const std::string& id);
// Whether every entry of `path` is a file a save writes (index.h5, rank_NNNNN.h5, model.h5); counts them.
bool holds_only_save_files(const std::string& path, uint64_t* files = nullptr, uint64_t* bytes = nullptr);
// Renames a directory holding files a save does not write to PATH.foreign (.foreign-2, ...), with a warning.
std::string set_aside_foreign(const std::string& path);
// Renames tmp to final_dir (an incomplete final_dir holding only save files is removed first, one holding anything
// else moved aside: set_aside_foreign), flushes the parent directory, then writes DONE last.
void publish(const std::string& tmp, const std::string& final_dir, const std::string& done_text);
// Removes the complete checkpoints that `retention` does not keep (docs/checkpoints.md), never `keep`.
void rotate(const std::string& dir, Retention retention, const std::string& keep);
// Short of bytes or inodes for a save of `size`: removes, oldest first, the complete checkpoints that the rotation
// after the save would remove anyway (keep_last >= 2 keeps the newest keep_last - 1 here, and every milestone),
// until both fit. Returns the checkpoints removed.
std::vector<std::string> make_room(const std::string& dir, Retention retention, const CheckpointSize& size);
// Removes a failed save's temporary directory (and an incomplete final one), quietly.
void discard(const std::string& path);

}  // namespace shardtrain::checkpoint
