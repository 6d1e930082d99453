// Checkpoint directories: names, completeness, the newest complete one, durable renames, rotation.
#include "paths.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08}", step); }

bool is_complete(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(fs::path(dir) / kDoneFile, ec);
  // A marker there but unreadable (no permission, a folder it may not enter) counts: the loader then says why, where
  // asking threw a file system error (exit 8) out of every listing, and --resume auto fell back to nothing.
  return st.type() == fs::file_type::regular || (ec && st.type() != fs::file_type::not_found);
}

std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return std::nullopt;
  int64_t step = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

bool is_save_dir_name(const std::string& name) {
  const size_t dot = name.find(".tmp");
  const bool tmp = dot != std::string::npos && (dot + 4 == name.size() || name[dot + 4] == '-');
  return parse_step_dir(name.substr(0, tmp ? dot : name.size())).has_value();
}

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = parse_step_dir(e.path().filename().string());
    if (step && e.is_directory(ec) && is_complete(e.path().string())) out.emplace_back(*step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string find_latest(const std::string& dir) {
  const auto all = complete_checkpoints(dir);
  return all.empty() ? std::string() : all.back().second;
}

Health checkpoint_health(const std::string& checkpoint_dir) {
  std::ifstream in(fs::path(checkpoint_dir) / kDoneFile);
  const auto done = nlohmann::json::parse(in, nullptr, false);
  // Healthy only when DONE says so, or predates the field. A damaged marker (not an object, "healthy" not a bool)
  // is not: the rotation then keeps an older sound checkpoint beside it, and loading refuses it (CheckpointReader).
  // Reading "healthy" with value() threw a type_error on a non-bool, an internal error at every resume and rotation.
  if (!done.is_object()) return Health::Diverging;
  const auto healthy = done.find("healthy");
  if (healthy == done.end()) return Health::Healthy;
  return healthy->is_boolean() && healthy->get<bool>() ? Health::Healthy : Health::Diverging;
}

namespace {

// The newest Healthy checkpoint among `all` (oldest first), "" when none is.
std::string newest_healthy(const std::vector<std::pair<int64_t, std::string>>& all) {
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (checkpoint_health(it->second) == Health::Healthy) return it->second;
  return {};
}

// A file a save writes into a checkpoint directory (DONE aside).
bool save_file_name(const std::string& name) {
  if (name == kIndexFile || name == kFullFile) return true;
  if (name.size() < 10 || name.rfind("rank_", 0) != 0 || name.substr(name.size() - 3) != ".h5") return false;
  const std::string digits = name.substr(5, name.size() - 8);
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A regular file (not a link) of a name a save writes.
bool is_save_file(const fs::directory_entry& f) {
  std::error_code ec;
  return !f.is_symlink(ec) && f.is_regular_file(ec) && save_file_name(f.path().filename().string());
}

}  // namespace

bool holds_only_save_files(const std::string& path, uint64_t* files, uint64_t* bytes) {
  std::error_code ec;
  bool ours = true;
  for (const auto& f : fs::directory_iterator(path, ec)) {
    ours = ours && is_save_file(f);
    if (files) ++*files;
    if (bytes) *bytes += f.is_regular_file(ec) ? f.file_size(ec) : 0;
  }
  return ours && !ec;
}

namespace {

// `path` renamed to PATH.foreign (-2, ...), beside it; "" with `why` set where the rename failed.
std::string rename_foreign(const std::string& path, std::string& why) {
  std::string target = path + ".foreign";
  for (int k = 2; fs::exists(target); ++k) target = fmt::format("{}.foreign-{}", path, k);
  std::error_code ec;
  fs::rename(path, target, ec);
  if (!ec) return target;
  why = fmt::format("cannot be moved aside to {}: {}", target, ec.message());
  return {};
}

// Removes a complete checkpoint the retention lets go. DONE goes first, so a removal cut short leaves an incomplete
// directory, never a broken "complete" one. Only what a save writes is removed: anything else in it (a consolidated
// export, a user's notes, another run's checkpoint.dir) stays, the folder renamed step_N.foreign, never deleted.
void remove_checkpoint(const std::string& path) {
  std::error_code ec;
  fs::remove(fs::path(path) / kDoneFile, ec);
  std::vector<fs::path> ours;
  bool others = false;
  for (const auto& f : fs::directory_iterator(path, ec)) {
    if (is_save_file(f)) ours.push_back(f.path());
    else others = true;
  }
  if (!others && !ec) {
    fs::remove_all(path, ec);
    return;
  }
  for (const fs::path& f : ours) fs::remove(f, ec);
  std::string why;
  const std::string target = rename_foreign(path, why);
  if (target.empty())
    log::warn(
        "checkpoint: removed the checkpoint's own files from {}, which holds files a save does not write: they stay "
        "there, but the folder {}",
        path, why);
  else
    log::warn(
        "checkpoint: removed the checkpoint's own files from {}, which holds files a save does not write: they stay, "
        "in the folder moved aside to {}",
        path, target);
}

}  // namespace

std::string set_aside_foreign(const std::string& path) {
  std::string why;
  const std::string target = rename_foreign(path, why);
  if (target.empty()) throw IoError(fmt::format("{} holds files a save does not write, and {}", path, why));
  log::warn("checkpoint: {} holds files a save does not write: moved aside to {} (nothing in it was removed)", path, target);
  return target;
}

std::vector<std::string> remove_incomplete(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  std::vector<fs::path> candidates;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!is_save_dir_name(e.path().filename().string()) || !e.is_directory(ec) || e.is_symlink(ec) ||
        is_complete(e.path().string()))
      continue;
    candidates.push_back(e.path());
  }
  std::sort(candidates.begin(), candidates.end());
  for (const fs::path& path : candidates) {
    uint64_t files = 0, bytes = 0;
    const bool ours = holds_only_save_files(path.string(), &files, &bytes);
    if (!ours) {
      // Once per folder and process: the cleanup runs before every save (it was said at each of 22 saves).
      static std::mutex said_mutex;
      static std::set<std::string> said;
      std::lock_guard lock(said_mutex);
      if (said.insert(path.string()).second)
        log::warn("checkpoint: {} is incomplete (no DONE) but holds more than a save writes: left as it is", path.string());
      ec.clear();
      continue;
    }
    fs::remove_all(path, ec);
    if (ec) {
      log::warn("checkpoint: cannot remove the incomplete {}: {}", path.string(), ec.message());
      ec.clear();
      continue;
    }
    log::info("checkpoint: removed {}, what a save that did not finish left ({} files, {})", path.string(), files,
              format_bytes(bytes));
    removed.push_back(path.string());
  }
  return removed;
}

std::string set_aside_damaged(const std::string& checkpoint_dir) {
  std::string target = checkpoint_dir + ".damaged";
  for (int k = 2; fs::exists(target); ++k) target = fmt::format("{}.damaged-{}", checkpoint_dir, k);
  std::error_code ec;
  fs::rename(checkpoint_dir, target, ec);
  if (ec)
    throw IoError(fmt::format("cannot rename the damaged checkpoint {} to {}: {}", checkpoint_dir, target, ec.message()));
  fsync_path(fs::path(checkpoint_dir).parent_path().string());
  return target;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw IoError(fmt::format("{}: cannot open to flush it to disk", path));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
}

void write_text_durably(const std::string& path, const std::string& text) {
  {
    errno = 0;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out)
      throw IoError(
          fmt::format("{}: cannot write{}", path, errno != 0 ? fmt::format(": {}", std::strerror(errno)) : std::string()));
  }
  fsync_path(path);
}

std::string prepare_temporary(const std::string& final_dir, const std::string& id) {
  const std::string tmp = fmt::format("{}.tmp-{}", final_dir, id);
  std::error_code ec;
  fs::create_directories(fs::path(final_dir).parent_path(), ec);
  if (ec) throw IoError(fmt::format("{}: cannot create the checkpoint directory: {}", tmp, ec.message()));
  // Created, never emptied: the name is this save's own, so no other writer and no user file is ever in it.
  if (!fs::create_directory(tmp, ec) || ec)
    throw IoError(fmt::format("{}: cannot create the checkpoint directory: {}", tmp,
                              ec ? ec.message() : std::string("it exists already")));
  return tmp;
}

void publish(const std::string& tmp, const std::string& final_dir, const std::string& done_text) {
  std::error_code ec;
  if (fs::exists(final_dir)) {  // only ever an incomplete one (no DONE): checked by the caller
    // What a removal cut short left goes; anything holding files of someone else's is moved aside, never deleted.
    if (holds_only_save_files(final_dir)) fs::remove_all(final_dir, ec);
    else set_aside_foreign(final_dir);
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) throw IoError(fmt::format("cannot rename {} to {}: {}", tmp, final_dir, ec.message()));
  fsync_path(fs::path(final_dir).parent_path().string());
  write_text_durably((fs::path(final_dir) / kDoneFile).string(), done_text);
  fsync_path(final_dir);
}

std::vector<std::string> make_room(const std::string& dir, Retention retention, const CheckpointSize& size) {
  std::vector<std::string> removed;
  if (retention.keep_last < 2) return removed;
  const auto all = complete_checkpoints(dir);  // oldest first
  const std::string healthy = newest_healthy(all);
  for (size_t i = 0; i + static_cast<size_t>(retention.keep_last) - 1 < all.size(); ++i) {
    // Bytes or inodes: a file system out of either refuses the save's files alike (ENOSPC).
    const std::string short_of = space_shortfall(dir, free_space(dir), size);
    if (short_of.empty()) break;
    const auto& [step, path] = all[i];
    if ((retention.keep_every > 0 && step % retention.keep_every == 0) || path == healthy) continue;
    log::warn("checkpoint: {}: removing {} before the save instead of after it (keep_last = {})", short_of, path,
              retention.keep_last);
    remove_checkpoint(path);
    removed.push_back(path);
  }
  return removed;
}

void discard(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

void rotate(const std::string& dir, Retention retention, const std::string& keep) {
  if (retention.keep_last <= 0) return;
  // Only the checkpoints up to the one just saved count: a newer one is not this run's (a run refuses to start beside
  // them, docs/checkpoints.md), and must not push this run's own saves out.
  auto all = complete_checkpoints(dir);  // oldest first
  const auto kept = parse_step_dir(fs::path(keep).filename().string());
  if (kept) std::erase_if(all, [&](const auto& c) { return c.first > *kept; });
  const std::string healthy = newest_healthy(all);
  for (size_t i = 0; i + static_cast<size_t>(retention.keep_last) < all.size(); ++i) {
    const auto& [step, path] = all[i];
    if (path == keep || (retention.keep_every > 0 && step % retention.keep_every == 0)) continue;  // a milestone
    if (path == healthy) {  // every newer one was saved while steps were being skipped
      log::warn(
          "checkpoint: keeping {} beyond keep_last = {}: it is the newest checkpoint saved while training was sound (the {} "
          "after it were saved during a streak of skipped steps)",
          path, retention.keep_last, all.size() - 1 - i);
      continue;
    }
    log::info("checkpoint: removing {} (keep_last = {}{})", path, retention.keep_last,
              retention.keep_every > 0 ? fmt::format(", keep_every = {}", retention.keep_every) : std::string());
    remove_checkpoint(path);
  }
}

}  // namespace shardtrain::checkpoint
