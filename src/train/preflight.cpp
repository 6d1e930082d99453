// Start-up checks shared by `train` and `shardtrain check` (preflight.hpp): one function each, so the two cannot
// drift apart.
#include "shardtrain/train/preflight.hpp"

#include <unistd.h>

#include <climits>
#include <filesystem>

#include <fmt/format.h>

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
