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
std::string rank_file_name(int shard_rank);  // "rank_00003.h5"

std::optional<int64_t> parse_step_dir(const std::string& name);
void fsync_path(const std::string& path);
void write_text_durably(const std::string& path, const std::string& text);
// final_dir + ".tmp", emptied and created.
std::string prepare_temporary(const std::string& final_dir);
// Renames tmp to final_dir, flushes the parent directory, then writes DONE last.
void publish(const std::string& tmp, const std::string& final_dir, const std::string& done_text);
// Removes the complete checkpoints that `retention` does not keep (docs/checkpoints.md), never `keep`.
void rotate(const std::string& dir, Retention retention, const std::string& keep);

}  // namespace shardtrain::checkpoint
