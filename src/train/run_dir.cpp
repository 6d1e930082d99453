// The run directory's own files and the checks before a start writes into it (run_dir.hpp).
#include "shardtrain/train/run_dir.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/session.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"

namespace fs = std::filesystem;

namespace shardtrain::train {
namespace {

std::string read_start(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::string text(bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

// failures/rank_00003.json, and failure_record's temporary of it (rank_00003.json.tmp).
bool is_failure_record_name(const std::string& name) {
  static const std::regex record(R"(rank_[0-9]+\.json(\.tmp)?)");
  return std::regex_match(name, record);
}

}  // namespace

bool is_reserved_run_dir_name(std::string_view name) {
  for (const char* exact : {"config.toml", "result.json", "failures", "checkpoints", "restarts.log", "eval.json", "hf",
                            "loss.png", "throughput.png", kRunDirLockFile})
    if (name == exact) return true;
  // Their temporaries (write_file_whole's NAME.tmp-HOST-PID), TensorBoard's event files, the Slurm jobs' logs.
  for (const char* prefix : {"config.toml.", "result.json.", "events.out.tfevents"})
    if (name.starts_with(prefix)) return true;
  for (const char* prefix : {"prepare-", "consolidate-", "evaluate-"})
    if (name.starts_with(prefix) && name.ends_with(".out")) return true;
  return false;
}

bool is_own_config_toml(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  return read_start(path, kConfigTomlMark.size()) == kConfigTomlMark;
}

bool is_own_result_json(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > (1u << 20)) return false;
  const auto j = nlohmann::json::parse(read_start(path, 1u << 20), nullptr, false);
  if (!j.is_object()) return false;
  if (j.contains(kResultMarkKey)) return j[kResultMarkKey] == kResultMarkValue;
  // Written before the mark (2026-11): every one had these fields, of these types.
  const auto status = j.find("status");
  return status != j.end() && (*status == "finished" || *status == "preempted") && j.contains("exit_code") &&
         j["exit_code"].is_number_integer() && j.contains("step") && j["step"].is_number_integer() &&
         j.contains("last_checkpoint") && j["last_checkpoint"].is_string();
}

bool check_run_dir(const TrainConfig& c, const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return false;
  if (!fs::is_directory(dir, ec))
    throw IoError(
        fmt::format("logging.run_dir: {} exists and is not a directory; expected a directory for the run's "
                    "files (made when missing)",
                    dir));
  const fs::path d(dir);
  // Another run writing here (its lock held): `check` says so, and a start is refused before it takes the lock.
  if (const std::string holder = lock_holder((d / kRunDirLockFile).string()); !holder.empty())
    throw ConfigError(run_dir_in_use_problem(dir, holder));
  const std::string config = (d / "config.toml").string(), result = (d / "result.json").string();
  if (fs::exists(fs::symlink_status(config, ec)) && !is_own_config_toml(config))
    throw ConfigError(fmt::format(
        "logging.run_dir: {} was not written by shardtrain (a run's config.toml starts with \"{}\"), and this run would "
        "replace it: give the run a directory of its own (--logging.run_dir), or move the file out",
        config, kConfigTomlMark));
  if (fs::exists(fs::symlink_status(result, ec)) && !is_own_result_json(result))
    throw ConfigError(fmt::format(
        "logging.run_dir: {} was not written by shardtrain (a run's result.json has \"{}\": \"{}\"), and this run would "
        "replace it: give the run a directory of its own (--logging.run_dir), or move the file out",
        result, kResultMarkKey, kResultMarkValue));
  const fs::path metrics = d / c.logging.metrics_file;
  const fs::file_status s = fs::status(metrics, ec);
  if (fs::exists(s) && !fs::is_regular_file(s))
    throw ConfigError(fmt::format("logging.metrics_file: {} is {}; expected the name of a file the run appends to",
                                  metrics.string(), fs::is_directory(s) ? "a folder" : "not a regular file"));
  return true;
}

bool begin_start_in_run_dir(MPI_Comm world, const TrainConfig& c, const std::string& dir) {
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  int outcome[2] = {0, 0};  // exit code, exists
  std::string error;
  if (rank == 0) {
    try {
      outcome[1] = check_run_dir(c, dir) ? 1 : 0;
      if (outcome[1] != 0) {
        remove_failure_records(dir);
        remove_own_result(dir);
      }
    } catch (const Error& e) {
      outcome[0] = static_cast<int>(e.code());
      error = e.what();
    } catch (const std::exception& e) {  // a file system error while looking
      outcome[0] = static_cast<int>(ExitCode::Io);
      error = fmt::format("logging.run_dir: cannot look into {}: {}", dir, e.what());
    }
  }
  ST_CHECK_MPI(MPI_Bcast(outcome, 2, MPI_INT, 0, world));
  if (outcome[0] == 0) return outcome[1] != 0;
  throw_typed(static_cast<ExitCode>(outcome[0]), broadcast_text(world, 0, std::move(error)), /*every_rank=*/true);
}

void remove_failure_records(const std::string& dir) {
  const fs::path failures = fs::path(dir) / "failures";
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(failures, ec))) return;
  for (const auto& e : fs::directory_iterator(failures, ec)) {
    std::error_code rm;
    if (is_failure_record_name(e.path().filename().string()) && e.is_regular_file(rm) && !fs::remove(e.path(), rm) && rm)
      log::warn("train: cannot remove {}, a failure record of an earlier start: {}", e.path().string(), rm.message());
  }
  if (fs::is_empty(failures, ec) && !ec) fs::remove(failures, ec);  // never a folder with anything else in it
}

void remove_own_result(const std::string& dir) {
  const std::string result = (fs::path(dir) / "result.json").string();
  std::error_code ec;
  if (is_own_result_json(result) && !fs::remove(result, ec) && ec)
    log::warn("train: cannot remove {}, the result of an earlier start: {}", result, ec.message());
}

}  // namespace shardtrain::train
