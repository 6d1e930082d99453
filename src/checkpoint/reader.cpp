// Reading checkpoints: the index, then each file's record of which parameter ranges it holds.
#include "shardtrain/checkpoint/reader.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paths.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/hdf5.hpp"
#include "shardtrain/runtime/hdf5_checksum.hpp"
#include "shardtrain/runtime/log.hpp"

namespace fs = std::filesystem;

namespace shardtrain::checkpoint {

struct CheckpointReader::Piece {
  int file = 0;
  std::string group;           // sharded: "units/0003"; full: the tensor's name
  int64_t file_offset = 0;     // element of the dataset where `begin` sits
  int64_t begin = 0, end = 0;  // element range of the tensor
};

namespace {

// `what` without a leading "where: ": the HDF5 helpers' messages name their file first, and it is said once.
std::string detail_of(const std::string& where, const std::string& what) {
  return what.rfind(where + ": ", 0) == 0 ? what.substr(where.size() + 2) : what;
}

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw CheckpointDamaged(fmt::format("{}: {}", where, detail_of(where, what)));
}

std::string required_string(const hdf5::Handle& f, const std::string& name, const std::string& where) {
  auto v = hdf5::get_attr_string(f, name);
  if (!v) fail(where, fmt::format("attribute '{}' is missing (not a shardtrain checkpoint index?)", name));
  return *v;
}

int64_t required_int(const hdf5::Handle& f, const std::string& name, const std::string& where) {
  auto v = hdf5::get_attr_int(f, name);
  if (!v) fail(where, fmt::format("attribute '{}' is missing", name));
  return *v;
}

// Opening through the HDF5 helpers reports DataError; a checkpoint's files are checkpoint errors. Every file's
// metadata (attributes, layouts, links) is checked against its checksums here, before anything is read from it.
hdf5::Handle open_checkpoint_file(const std::string& path, MetadataSummary& summary) {
  std::error_code ec;
  if (fs::status(path, ec).type() == fs::file_type::not_found)
    fail(path, "file is missing (an incomplete or damaged checkpoint)");
  hdf5::Handle f;
  try {
    f = hdf5::open_file(path, hdf5::FileMode::ReadOnly);
  } catch (const hdf5::FileRefused& e) {
    // Unreadable or held by a writer is no damage: --resume auto would set an intact checkpoint aside as step_N.damaged
    // and train its steps again. It stops instead, naming the reason.
    throw CheckpointError(fmt::format("{}; the checkpoint was not set aside: it may well be intact", e.what()));
  } catch (const Error& e) {
    fail(path, fmt::format("cannot be opened: {}", detail_of(path, e.what())));
  }
  try {
    const hdf5::MetadataCheck c = hdf5::verify_metadata_checksums(f);
    ++(c.recorded ? summary.files_checked : summary.files_unrecorded);
    summary.entries += c.entries;
  } catch (const Error& e) {
    throw CheckpointDamaged(fmt::format("{}; the checkpoint cannot be trusted: use an older one", e.what()));
  }
  return f;
}

// Why a directory without DONE is not read: a save that did not finish leaves a step_N (or .tmp) folder with some
// of a checkpoint's files; a folder with none of them is no checkpoint at all, or a folder of checkpoints.
std::string incomplete_reason(const std::string& dir) {
  const fs::path p(dir);
  bool has_files = false;
  std::vector<std::string> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kIndexFile || name == kFullFile || (name.rfind("rank_", 0) == 0 && e.path().extension() == ".h5"))
      has_files = true;
    if (parse_step_dir(name) && e.is_directory(ec)) steps.push_back(name);
  }
  const std::string name = p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
  if (has_files || is_save_dir_name(name))
    return "no DONE marker: the save did not finish (still being written, or killed or failed half-way); use an older "
           "checkpoint, or the newest complete one of its folder";
  if (const auto complete = complete_checkpoints(dir); !complete.empty())
    return fmt::format(
        "a folder of checkpoints, not one checkpoint: pass one of its {} complete checkpoint(s), the newest {}",
        complete.size(), complete.back().second);
  if (!steps.empty())
    return fmt::format(
        "a folder of checkpoints, none complete ({} step_N folder(s), none with its DONE marker: no save finished)",
        steps.size());
  return fmt::format(
      "not a checkpoint: no {}, no {} or rank files, no {} marker (expected a step_N folder that `shardtrain train` "
      "saved, or the checkpoint directory above them)",
      kIndexFile, kFullFile, kDoneFile);
}

// DONE is what makes a checkpoint complete, and what the rotation reads its health from: it must be the JSON object a
// save writes ({"step", "type", "files", "time", "healthy"}), of this directory's step and of its index. A marker
// copied from another checkpoint, or garbage, makes the checkpoint damaged (--resume auto falls back past it).
void check_done_marker(const std::string& dir, int64_t index_step, StateDictType type,
                       const std::vector<std::string>& files) {
  const std::string path = (fs::path(dir) / kDoneFile).string();
  const std::string expected = fmt::format(
      "expected the JSON object a save writes, {{\"step\": {}, \"type\": \"{}\", \"files\": [...], \"time\", "
      "\"healthy\": true or false}}",
      index_step, state_dict_type_name(type));
  const auto damaged = [&](const std::string& what) {
    throw CheckpointDamaged(
        fmt::format("{}: {} ({}); the completion marker is damaged, so the checkpoint cannot be trusted: use an older one",
                    path, what, expected));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const hdf5::Unopened u = hdf5::why_unopened(path);
    if (u.may_be_intact) throw CheckpointError(fmt::format("{}: {}; the checkpoint was not set aside", path, u.why));
    damaged(u.why.empty() ? std::string("cannot be read") : u.why);
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto done = nlohmann::json::parse(text, nullptr, false);
  if (done.is_discarded())
    damaged(text.empty() ? std::string("is empty") : fmt::format("is not JSON ({} bytes)", text.size()));
  if (!done.is_object()) damaged(fmt::format("is a JSON {}, not an object", done.type_name()));
  const auto step = done.find("step");
  if (step == done.end() || !step->is_number_integer())
    damaged(step == done.end() ? "has no \"step\"" : fmt::format("has \"step\": {}, not an integer", step->dump()));
  const auto dir_step = parse_step_dir(fs::path(dir).filename().empty() ? fs::path(dir).parent_path().filename().string()
                                                                        : fs::path(dir).filename().string());
  if (dir_step && step->get<int64_t>() != *dir_step)
    damaged(fmt::format("says step {}, in the directory of step {}", step->get<int64_t>(), *dir_step));
  if (step->get<int64_t>() != index_step)
    damaged(fmt::format("says step {}, its {} step {}", step->get<int64_t>(), kIndexFile, index_step));
  const auto saved_type = done.find("type");
  if (saved_type != done.end() && *saved_type != state_dict_type_name(type))
    damaged(fmt::format("has \"type\": {}, its {} {}", saved_type->dump(), kIndexFile, state_dict_type_name(type)));
  const auto saved_files = done.find("files");
  if (saved_files != done.end() && *saved_files != nlohmann::json(files))
    damaged(fmt::format("has \"files\": {}, its {} {}", saved_files->dump(), kIndexFile, nlohmann::json(files).dump()));
  const auto healthy = done.find("healthy");  // absent in checkpoints saved before it existed: healthy
  if (healthy != done.end() && !healthy->is_boolean())
    damaged(fmt::format("has \"healthy\": {}, not true or false", healthy->dump()));
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : path_(dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && st.type() != fs::file_type::not_found)
    throw CheckpointError(fmt::format("{}: cannot be read: {}; the checkpoint was not set aside", dir, ec.message()));
  if (st.type() != fs::file_type::directory) {
    if (fs::exists(dir, ec)) {
      // A file of a checkpoint (its model.h5, index.h5 or a rank file): the folder it is in is what to pass.
      const fs::path folder = fs::path(dir).parent_path();
      const bool in_checkpoint = !folder.empty() && fs::exists(folder / kIndexFile, ec);
      fail(dir, in_checkpoint ? fmt::format("is a file of the checkpoint {}: pass that folder", folder.string())
                              : std::string("is a file, not a checkpoint: expected a step_N folder that `shardtrain train` "
                                            "saved (index.h5, rank files, DONE), or the checkpoint directory above them"));
    }
    fail(dir, "no such checkpoint directory");
  }
  if (!is_complete(dir)) fail(dir, incomplete_reason(dir));
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  hdf5::Handle index = open_checkpoint_file(index_path, metadata_);
  if (required_string(index, "format", index_path) != kFormatName) fail(index_path, "not a shardtrain checkpoint index");
  const int64_t version = required_int(index, "format_version", index_path);
  // Intact (its checksums matched) but of another format: not damage, which --resume auto would set aside as
  // step_N.damaged and fall back past, retraining its steps; a build that cannot read it stops instead.
  if (version != kFormatVersion) {
    throw CheckpointError(
        fmt::format("{}: format version {}, and this build reads version {}: the checkpoint was saved "
                    "by {} shardtrain; use a build that reads it (nothing was set aside)",
                    index_path, version, kFormatVersion, version > kFormatVersion ? "a newer" : "an older"));
  }
  type_ = parse_state_dict_type(required_string(index, "type", index_path));
  step_ = required_int(index, "step", index_path);
  optimizer_steps_ = hdf5::get_attr_int(index, "optimizer_steps").value_or(0);
  trainer_state_ = hdf5::get_attr_string(index, "trainer_state").value_or("{}");
  config_toml_ = hdf5::get_attr_string(index, "config").value_or("");
  tokenizer_ = hdf5::get_attr_string(index, "tokenizer").value_or("");
  mesh_ = fmt::format("{} on {} ranks ({} x {})", hdf5::get_attr_string(index, "strategy").value_or("?"),
                      hdf5::get_attr_int(index, "world_size").value_or(0),
                      hdf5::get_attr_int(index, "replicate_size").value_or(0),
                      hdf5::get_attr_int(index, "shard_size").value_or(0));
  model_config_ = model_config_from_json(required_string(index, "model_config", index_path), index_path);
  try {
    for (const auto& t : nlohmann::json::parse(required_string(index, "tensors", index_path))) {
      TensorInfo info{t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(), 1};
      for (int64_t d : info.shape) info.numel *= d;
      by_name_[info.name] = tensors_.size();
      tensors_.push_back(std::move(info));
    }
    file_names_ = nlohmann::json::parse(required_string(index, "files", index_path)).get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail(index_path, fmt::format("malformed tensor or file list: {}", e.what()));
  }
  check_done_marker(dir, step_, type_, file_names_);
  const std::optional<std::string> save_id = hdf5::get_attr_string(index, "save_id");  // since 2026-11-28
  files_.resize(file_names_.size());

  for (size_t fi = 0; fi < file_names_.size(); ++fi) {
    hdf5::Handle& f = file(static_cast<int>(fi));
    const std::string where = (fs::path(dir) / file_names_[fi]).string();
    if (save_id && hdf5::get_attr_string(f, "save_id") != save_id)
      fail(where, fmt::format("was written by another save ({}) than its {} ({}): files mixed from two checkpoints of "
                              "step {}; the checkpoint cannot be trusted: use an older one",
                              hdf5::get_attr_string(f, "save_id").value_or("none recorded"), kIndexFile, *save_id, step_));
    if (type_ == StateDictType::Full) {
      full_optimizer_ = hdf5::exists(f, kFullOptimizerGroup);
      for (const TensorInfo& t : tensors_) {
        if (!hdf5::exists(f, t.name)) fail(where, fmt::format("tensor '{}' is missing", t.name));
        if (full_optimizer_)
          for (const char* kind : {"exp_avg", "exp_avg_sq"})
            if (!hdf5::exists(f, fmt::format("{}/{}/{}", kFullOptimizerGroup, kind, t.name)))
              fail(where, fmt::format("AdamW's {} of '{}' is missing (its other moments are there)", kind, t.name));
        pieces_[t.name].push_back({static_cast<int>(fi), t.name, 0, 0, t.numel});
      }
      continue;
    }
    if (hdf5::get_attr_int(f, "step").value_or(-1) != step_) {
      fail(where, fmt::format("belongs to step {}, the index to step {} (files mixed from two checkpoints)",
                              hdf5::get_attr_int(f, "step").value_or(-1), step_));
    }
    for (int64_t u = 0;; ++u) {
      const std::string group = fmt::format("units/{:04}", u);
      if (!hdf5::exists(f, group)) break;
      const auto params = hdf5::get_attr_string(f, "params", group);
      if (!params) fail(where, fmt::format("{} has no parameter record", group));
      try {
        for (const auto& p : nlohmann::json::parse(*params)) {
          const std::string name = p.at("name").get<std::string>();
          if (!by_name_.count(name)) fail(where, fmt::format("holds '{}', which the index does not list", name));
          pieces_[name].push_back({static_cast<int>(fi), group, p.at("file_offset").get<int64_t>(),
                                   p.at("begin").get<int64_t>(), p.at("end").get<int64_t>()});
        }
      } catch (const nlohmann::json::exception& e) {
        fail(where, fmt::format("{} has a malformed parameter record: {}", group, e.what()));
      }
    }
  }
  // Every element of every tensor must be held by exactly one piece.
  for (const TensorInfo& t : tensors_) {
    auto& ps = pieces_[t.name];
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const Piece& p : ps) {
      if (p.begin != at) break;
      at = p.end;
    }
    if (at != t.numel) {
      fail(dir,
           fmt::format("'{}' elements [{}, {}) are in no file (a rank file is missing or truncated)", t.name, at, t.numel));
    }
  }
  if (metadata_.files_unrecorded > 0 && log::config().rank == 0)
    log::warn(
        "checkpoint {}: {} of its files have no metadata checksums (saved by a build before they existed): their attributes "
        "and layouts are not checked; a checkpoint saved now has them",
        dir, metadata_.files_unrecorded);
}

CheckpointReader::~CheckpointReader() = default;

hdf5::Handle& CheckpointReader::file(int index) {
  auto& slot = files_.at(static_cast<size_t>(index));
  if (!slot)
    slot = std::make_unique<hdf5::Handle>(open_checkpoint_file((fs::path(path_) / file_names_[index]).string(), metadata_));
  return *slot;
}

std::vector<std::string> CheckpointReader::files() const { return file_names_; }

const TensorInfo& CheckpointReader::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) fail(path_, fmt::format("no tensor named '{}'", name));
  return tensors_[it->second];
}

void CheckpointReader::read(const std::string& name, const std::string& kind, int64_t begin, std::span<float> out) {
  const TensorInfo& t = tensor(name);
  const int64_t end = begin + static_cast<int64_t>(out.size());
  if (begin < 0 || end > t.numel)
    fail(path_, fmt::format("'{}' has {} elements, [{}, {}) was asked", name, t.numel, begin, end));
  if (kind != "param" && !has_optimizer())
    fail(path_, fmt::format("a full state dict saved before 2026-11-29 holds no '{}'", kind));
  for (const Piece& p : pieces_.at(name)) {
    const int64_t b = std::max(begin, p.begin), e = std::min(end, p.end);
    if (b >= e) continue;
    // A rank file's unit group; in model.h5, the parameter by its name and its moments under optimizer/.
    std::string dataset = p.group + "/" + kind;
    if (type_ == StateDictType::Full)
      dataset = kind == "param" ? p.group : fmt::format("{}/{}/{}", kFullOptimizerGroup, kind, p.group);
    try {
      hdf5::read_f32_range(file(p.file), dataset, static_cast<size_t>(p.file_offset + (b - p.begin)),
                           out.subspan(static_cast<size_t>(b - begin), static_cast<size_t>(e - b)));
    } catch (const CheckpointError&) {
      throw;
    } catch (const Error& e) {
      fail((fs::path(path_) / file_names_[p.file]).string(), e.what());
    }
  }
}

int64_t CheckpointReader::verify_checksums() {
  int64_t verified = 0;
  const std::vector<std::string> kinds =
      has_optimizer() ? std::vector<std::string>{"param", "exp_avg", "exp_avg_sq"} : std::vector<std::string>{"param"};
  for (const TensorInfo& t : tensors_) {
    std::vector<float> buf(static_cast<size_t>(t.numel));
    for (const std::string& k : kinds) {
      read(t.name, k, 0, buf);
      verified += t.numel;
    }
  }
  return verified;
}

}  // namespace shardtrain::checkpoint
