// What a checkpoint takes on disk (bytes and inodes), what a file system has free, and how many checkpoints fit: the
// figures a save checks before writing, `train` logs at start and `shardtrain check` reports, from one place.
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "paths.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/progress.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

namespace {

// HDF5's own, as measured with h5stat (HDF5 1.10, the save's layout), with room to spare. A chunked dataset's object
// header and its chunk index's first B-tree node take about 2.4 KiB, its name and attributes the rest: 2.6 KiB each
// in a full model.h5 (63 datasets, 167 KB). A chunk beyond the first adds an index entry (about 40 bytes).
constexpr uint64_t kPerDataset = 3 << 10;
constexpr uint64_t kPerChunk = 64;
constexpr uint64_t kPerGroup = 1536;       // a group's header, B-tree and name heap (0.9 KiB seen)
constexpr uint64_t kPerRange = 256;        // a parameter's record in a unit's "params" attribute (about 150 bytes)
constexpr uint64_t kPerFile = 8 << 10;     // superblock, root group, the file's attributes and checksums (3 KiB seen)
constexpr uint64_t kIndex = 16 << 10;      // index.h5: the config, the tokenizer, the attributes (7 KiB seen)
constexpr uint64_t kIndexPerTensor = 128;  // its tensor list
constexpr uint64_t kIndexPerFile = 32;     // its file list
constexpr uint64_t kBlock = 4 << 10;       // DONE, and the last block of each file

// One fp32 dataset of `n` elements as a save writes it (checksummed() in save.cpp: chunks of up to 2^20 elements, each
// stored whole, the last one too, with Fletcher32's 4 bytes): {data, HDF5's own}.
std::pair<uint64_t, uint64_t> dataset_bytes(int64_t n) {
  if (n <= 0) return {0, kPerDataset};
  const auto elements = static_cast<uint64_t>(n);
  const uint64_t chunk = std::min<uint64_t>(elements, uint64_t{1} << 20);
  const uint64_t chunks = (elements + chunk - 1) / chunk;
  return {chunks * (chunk * 4 + 4), kPerDataset + chunks * kPerChunk};
}

}  // namespace

CheckpointSize checkpoint_size(const model::ModelSpec& spec, StateDictType type, int shard_files,
                               const std::vector<int64_t>& unit_shards) {
  CheckpointSize size;
  const auto tensors = static_cast<uint64_t>(spec.params().size());
  uint64_t data = 0, own = 0;
  auto add = [&](int64_t n, uint64_t times) {
    const auto [d, o] = dataset_bytes(n);
    data += d * times;
    own += o * times;
  };
  if (type == StateDictType::Full) {
    size.data_files = 1;
    for (const model::ParamInfo& p : spec.params()) add(p.numel, 3);  // the parameter and both AdamW moments
    own += kPerFile + kBlock + 3 * kPerGroup;                         // optimizer/, exp_avg/, exp_avg_sq/
  } else {
    size.data_files = std::max(1, shard_files);
    const auto files = static_cast<uint64_t>(size.data_files);
    // Each rank file: a group per unit with its param, exp_avg and exp_avg_sq shard, and the records of the parameters
    // its shard holds (at most every one).
    for (const int64_t n : unit_shards) add(n, 3 * files);
    own += files * (kPerFile + kBlock + kPerGroup * (unit_shards.size() + 1) + kPerRange * tensors);
  }
  own += kIndex + kIndexPerTensor * tensors + kIndexPerFile * static_cast<uint64_t>(size.data_files) +
         kBlock;  // index.h5, DONE
  size.data_bytes = data;
  size.bytes = data + own;
  size.inodes = static_cast<uint64_t>(size.data_files) + 3;  // + index.h5, DONE, the directory
  return size;
}

CheckpointSize checkpoint_size(const fsdp::FsdpEngine& engine, StateDictType type) {
  std::vector<int64_t> shards;
  for (const fsdp::ShardView& v : engine.shards()) shards.push_back(engine.layout(v.unit).shard_numel());
  return checkpoint_size(engine.model_spec(), type, engine.mesh().shard_size(), shards);
}

CheckpointSize checkpoint_size(const model::ModelSpec& spec, const fsdp::FsdpPlan& plan, StateDictType type) {
  std::vector<int64_t> shards;
  for (const fsdp::UnitPlan& u : plan.units) shards.push_back(u.layout.shard_numel());
  return checkpoint_size(spec, type, plan.mesh.shard_size, shards);
}

FreeSpace free_space(const std::string& dir) {
  fs::path p = fs::absolute(dir);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  if (p.empty()) p = "/";
  struct statvfs s {};
  if (::statvfs(p.c_str(), &s) != 0)
    throw IoError(fmt::format("{}: cannot read the file system's free space: {}", p.string(), std::strerror(errno)));
  FreeSpace free;
  free.bytes = static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
  free.inodes_limited = s.f_files != 0;
  free.inodes = free.inodes_limited ? static_cast<uint64_t>(s.f_favail) : std::numeric_limits<uint64_t>::max();
  return free;
}

uint64_t available_bytes(const std::string& dir) { return free_space(dir).bytes; }

std::string space_shortfall(const std::string& dir, const FreeSpace& free, const CheckpointSize& size) {
  if (free.bytes < size.bytes)
    return fmt::format("{} free in {}, a checkpoint takes {}", format_bytes(free.bytes), dir, format_bytes(size.bytes));
  if (free.inodes < size.inodes)
    return fmt::format("{} inode(s) free in {}, a checkpoint takes {} (its {} file(s) and its directory)", free.inodes, dir,
                       size.inodes, size.inodes - 1);
  return {};
}

CheckpointRoom checkpoint_room(const std::string& dir, const CheckpointSize& size, StateDictType type, Retention retention) {
  const FreeSpace free = free_space(dir);
  // What the complete checkpoints there hold comes back as the rotation removes them (resuming beside them): milestones
  // stay, and with keep_last = 0 every one does.
  uint64_t held_bytes = 0, held_inodes = 0, held = 0;
  if (retention.keep_last > 0) {
    for (const auto& [step, path] : complete_checkpoints(dir)) {
      if (retention.keep_every > 0 && step % retention.keep_every == 0) continue;
      uint64_t files = 0, bytes = 0;
      holds_only_save_files(path, &files, &bytes);
      held_bytes += bytes;
      held_inodes += files + 1;
      ++held;
    }
  }
  const uint64_t bytes = free.bytes + held_bytes;
  const uint64_t inodes = free.inodes_limited ? free.inodes + held_inodes : free.inodes;
  const uint64_t by_bytes = bytes / std::max<uint64_t>(1, size.bytes);
  const uint64_t by_inodes = free.inodes_limited ? inodes / std::max<uint64_t>(1, size.inodes) : by_bytes;
  CheckpointRoom r;
  r.room = std::min(by_bytes, by_inodes);
  const std::string held_text =
      held > 0 ? fmt::format(" (with the {} and {} inode(s) of the {} checkpoint(s) there that the rotation removes)",
                             format_bytes(held_bytes), held_inodes, held)
               : std::string();
  const std::string limit =
      !free.inodes_limited   ? "bytes limit it; the file system has no inode limit"
      : by_inodes < by_bytes ? fmt::format("inodes limit it: {} by bytes, {} by inodes", by_bytes, by_inodes)
      : by_bytes < by_inodes ? fmt::format("bytes limit it: {} by bytes, {} by inodes", by_bytes, by_inodes)
                             : "bytes and inodes alike";
  const std::string files =
      type == StateDictType::Full ? std::string("model.h5") : fmt::format("{} rank file(s)", size.data_files);
  r.text = fmt::format(
      "a checkpoint takes {} and {} inodes ({}: {} of parameters and AdamW states in fp32, index.h5, DONE, its "
      "directory), {} and {} inodes free in {}{}: room for {} ({})",
      format_bytes(size.bytes), size.inodes, state_dict_type_name(type), files, format_bytes(free.bytes),
      free.inodes_limited ? fmt::format("{}", free.inodes) : std::string("unlimited"), dir, held_text, r.room, limit);
  const int keep = retention.keep_last;
  const auto at_save = static_cast<uint64_t>(checkpoints_at_save(keep));
  if (r.room == 0) {
    r.verdict = CheckpointRoom::Verdict::NotOne;
    r.text += fmt::format(": not even one fits ({})", std::strerror(ENOSPC));
  } else if (keep == 0) {
    r.verdict = CheckpointRoom::Verdict::KeepsAll;
    r.text += "; checkpoint.keep_last = 0 keeps every one, so later saves fail once it is full";
  } else if (r.room >= at_save) {
    r.verdict = CheckpointRoom::Verdict::Enough;
    r.text += fmt::format(", keep_last = {} needs {}{}", keep, at_save,
                          retention.keep_every > 0 ? " (plus the keep_every milestones)" : "");
  } else if (bytes < (at_save - 1) * size.data_bytes + size.bytes || inodes < at_save * size.inodes) {
    // Certain: the checkpoints kept at a save take at least their tensors' bytes and exactly their inodes, and a save
    // is refused unless the estimate fits beside them.
    r.verdict = CheckpointRoom::Verdict::WillFail;
    r.text += fmt::format(", but keep_last = {} needs {} at a save: saves will fail", keep, at_save);
  } else {
    r.verdict = CheckpointRoom::Verdict::MayFail;
    r.text += fmt::format(
        ", but keep_last = {} needs {} at a save: saves may fail (they fit only if a checkpoint takes less than its "
        "estimate, which is an upper bound; its tensors alone take {})",
        keep, at_save, format_bytes(size.data_bytes));
  }
  return r;
}

}  // namespace shardtrain::checkpoint
