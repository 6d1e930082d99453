// Start-up checks shared by `train` and `shardtrain check` (preflight.hpp): one function each, so the two cannot
// drift apart.
#include "shardtrain/train/preflight.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/train/inputs.hpp"

namespace fs = std::filesystem;

namespace shardtrain::train {

std::unique_ptr<checkpoint::TensorSource> open_init_from(const TrainConfig& c, const data::TokenDataset* dataset) {
  auto source = checkpoint::open_tensor_source(c.checkpoint.init_from);
  // Weights trained on another tokenizer's ids are refused, as --resume refuses them.
  if (dataset != nullptr) check_weights_tokenizer(source->path(), source->tokenizer(), *dataset);
  return source;
}

std::string no_checkpoint_loads_problem(const std::string& dir, const std::vector<std::string>& errors) {
  std::string why;
  for (const std::string& e : errors) why += fmt::format("; {}", e);
  return fmt::format("none of the {} complete checkpoints in {} loads (resume = auto){}; nothing was changed or removed",
                     errors.size(), dir, why);
}

void require_writable_dir(const std::string& key, const std::string& dir, DirProbe probe) {
  const fs::path p = fs::absolute(dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    throw IoError(fmt::format("{}: {} exists and is not a directory", key, dir));
  fs::path existing = p;
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    throw IoError(fmt::format("{}: cannot create {}: {} is not a directory", key, dir, existing.string()));
  // The probe goes where the first directory would be made: the file system's answer there is the one making the
  // directory would get.
  const fs::path trial = existing / fmt::format(".shardtrain-probe-{}", ::getpid());
  if (!fs::create_directory(trial, ec) || ec)
    throw IoError(fmt::format("{}: {} {}: {} is not writable ({})", key,
                              existing == p ? "cannot write into" : "cannot create", dir, existing.string(),
                              ec ? ec.message() : "the probe exists already"));
  fs::remove(trial, ec);
  // What making the rest would meet, said before it is made (check looks only, and said "can be written" of a name
  // of 256 bytes, which train then failed to create): a name longer than the file system takes, a path longer than
  // the system's limit.
  const long name_max = ::pathconf(existing.c_str(), _PC_NAME_MAX);
  const fs::path rest = p.lexically_relative(existing);
  for (const fs::path& part : rest)
    if (name_max > 0 && part.native().size() > static_cast<size_t>(name_max))
      throw IoError(
          fmt::format("{}: cannot create {}: File name too long (a name of {} bytes below {}, whose file system "
                      "takes at most {})",
                      key, dir, part.native().size(), existing.string(), name_max));
  if (p.native().size() >= PATH_MAX)
    throw IoError(
        fmt::format("{}: cannot create {}: File name too long (the path has {} bytes; the system takes fewer "
                    "than {})",
                    key, dir, p.native().size(), PATH_MAX));
  if (probe == DirProbe::LookOnly) return;
  fs::create_directories(p, ec);
  if (ec)
    throw IoError(fmt::format("{}: cannot create {}: {} (the nearest existing folder: {})", key, dir, ec.message(),
                              existing.string()));
}

namespace {

// The nearest existing folder of `dir` (itself when it exists), and how many folders making it creates.
std::pair<fs::path, uint64_t> nearest_existing(const std::string& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  uint64_t missing = 0;
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) {
    p = p.parent_path();
    ++missing;
  }
  return {p, missing};
}

dev_t device_of(const fs::path& p) {
  struct stat s {};
  return ::stat(p.c_str(), &s) == 0 ? s.st_dev : dev_t{0};
}

}  // namespace

uint64_t inodes_to_make(const InodeNeed& need) { return need.files + nearest_existing(need.dir).second; }

void require_inodes(const InodeNeed& need, const std::vector<InodeNeed>& earlier) {
  const auto [existing, folders] = nearest_existing(need.dir);
  const checkpoint::FreeSpace free = checkpoint::free_space(existing.string());
  if (!free.inodes_limited) return;
  const uint64_t own = need.files + folders;
  uint64_t shared = 0;
  std::string with;
  for (const InodeNeed& e : earlier) {
    if (device_of(nearest_existing(e.dir).first) != device_of(existing)) continue;
    shared += inodes_to_make(e);
    with += fmt::format(", and {} for {} on the same file system", inodes_to_make(e), e.key);
  }
  if (free.inodes >= own + shared) return;
  throw IoError(fmt::format(
      "{}: cannot create {} in {}: {} (no inode left for them: {} inode(s) free in {}; the run makes {} there: {}{}{})",
      need.key, need.what, need.dir, std::strerror(ENOSPC), free.inodes, existing.string(), own, need.what,
      folders > 0 ? fmt::format(" and {} folder(s)", folders) : std::string(), with));
}

std::string generated_run_dir(const TrainConfig& c, std::time_t when) {
  std::tm tm{};
  localtime_r(&when, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  return (std::filesystem::path(c.logging.runs_root) /
          fmt::format("{}-{}", c.logging.name.empty() ? "run" : c.logging.name, stamp))
      .string();
}

}  // namespace shardtrain::train
