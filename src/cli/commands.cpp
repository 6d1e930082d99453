// The list of subcommands, in the order `shardtrain --help` shows them, and what several share.
#include "command.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../data/thread_pool.hpp"
#include "shardtrain/data/tokenizer.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/files.hpp"
#include "shardtrain/runtime/json_text.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/train/checkpoint_dir.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::cli {

void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& what) {
  write_file_whole(path, json_text(j, 2) + "\n", what);
}

int world_size_of(int64_t nodes, int64_t ranks_per_node) {
  if (nodes < 1 || ranks_per_node < 1 || nodes * ranks_per_node > kMaxWorldSize)
    throw UsageError(
        fmt::format("--nodes {} x --gpus-per-node {}: expected 1 to {} ranks in all", nodes, ranks_per_node, kMaxWorldSize));
  return static_cast<int>(nodes * ranks_per_node);
}

CLI::Validator positive_up_to(double hi, double lo) {
  return CLI::Validator(
      [hi, lo](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return text + ": expected a number";
        } catch (const std::exception&) {
          return text + ": expected a number";
        }
        if (lo > 0 && (!std::isfinite(v) || v < lo || v > hi))
          return fmt::format("{}: expected a number from {} to {}", text, lo, hi);
        if (!std::isfinite(v) || v <= 0 || v > hi) return fmt::format("{}: expected a number above 0, at most {}", text, hi);
        return {};
      },
      lo > 0 ? fmt::format("[{}, {}]", lo, hi) : fmt::format("(0, {}]", hi));
}

CLI::Validator unsigned_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t at = text.find_first_not_of(" \t");
        return at != std::string::npos && text[at] == '-' ? text + ": expected 0 or more" : std::string();
      },
      "");
}

CLI::Range cpu_threads_range() { return CLI::Range(0, data::kMaxThreads); }

CLI::Validator float_dtype_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        for (const char* name : {"fp32", "f32", "float32", "float", "bf16", "bfloat16"})
          if (text == name) return {};
        return text + ": expected fp32 or bf16";
      },
      "");
}

void require_threads_start(int count, std::string_view option) {
  data::run_on_threads(static_cast<size_t>(std::max(count, 1)), option, [](size_t) {});
}

namespace {

// What a file that is not a plain file is, for a message ("a character device").
const char* special_file_kind(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// "an HDF5 file" or "a safetensors file" from the first bytes of `path`, else "". HDF5's signature sits at 0 or, after a
// user block, at 512, 1024, 2048...; safetensors starts with its header's length (8 bytes, little-endian) and the
// header's '{'.
std::string binary_format_of(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  const auto read_at = [fd](uint64_t at, unsigned char* out, size_t n) {
    return ::pread(fd, out, n, static_cast<off_t>(at)) == static_cast<ssize_t>(n);
  };
  static constexpr unsigned char kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  std::string found;
  unsigned char head[9] = {};
  for (uint64_t at = 0; found.empty() && at + 8 <= size; at = at == 0 ? 512 : 2 * at)
    if (read_at(at, head, 8) && std::equal(head, head + 8, kHdf5)) found = "an HDF5 file";
  if (found.empty() && size > 9 && read_at(0, head, 9)) {
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | head[i];
    if (head[8] == '{' && header >= 2 && header <= size - 8) found = "a safetensors file";
  }
  ::close(fd);
  return found;
}

// The checkpoint directory (a folder holding DONE or index.h5, or named as a save names one, step_N or step_N.tmp-...,
// in a folder a run claimed, with its lock file) that `path` would be written in, at any depth, or "". A run's start and rotation remove such a folder with the
// files a save writes (model.h5 among them): a user's file of that name in it went with it.
std::string checkpoint_holding(const std::string& path) {
  namespace fs = std::filesystem;
  static const std::regex save_name(R"(step_[0-9]+(\.tmp-.*)?)");
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec).lexically_normal();
  if (ec) return {};
  // The path itself too: a step_N not saved yet (a later step's name in a live run's checkpoint directory) was taken,
  // and that run's save of step N then set the export aside as .foreign.
  for (fs::path dir = abs; !dir.empty(); dir = dir.parent_path()) {
    for (const char* marker : {"DONE", "index.h5"})
      if (dir != abs && fs::is_regular_file(dir / marker, ec)) return fmt::format("{} (it holds {})", dir.string(), marker);
    if (std::regex_match(dir.filename().string(), save_name) &&
        fs::exists(dir.parent_path() / train::kCheckpointLockFile, ec))
      return fmt::format(
          "{} (a checkpoint's name in a run's checkpoint directory: its start or rotation removes it with what a "
          "save writes)",
          dir.string());
    if (dir == dir.parent_path()) break;
  }
  return {};
}

std::string in_checkpoint_problem(const std::string& path, const std::string& checkpoint) {
  return fmt::format(
      "{} lies in the checkpoint {}: a checkpoint holds what its save wrote, no other file; "
      "expected a place outside it",
      path, checkpoint);
}

}  // namespace

CLI::Validator outside_checkpoints_check() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        const std::string checkpoint = path.empty() ? std::string() : checkpoint_holding(path);
        return checkpoint.empty() ? std::string() : in_checkpoint_problem(path, checkpoint);
      },
      "");
}

CLI::Validator output_file_check() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        if (path.empty()) return "expected a file name";
        if (std::filesystem::is_directory(path)) return path + " is a folder: expected a file name";
        // Written once the work is done (an evaluation of every checkpoint, a prediction): a folder that is not there
        // failed it then, with exit 8 and nothing to show for the work.
        const std::filesystem::path folder = std::filesystem::path(path).parent_path();
        if (std::error_code ec; !folder.empty() && !std::filesystem::is_directory(folder, ec))
          return fmt::format("{}: its folder {} does not exist (the file is written after the work)", path, folder.string());
        // This process's standard output or error (/dev/stdout) and the null device are written in place
        // (write_file_whole), never replaced.
        if (standard_stream_at(path) != 0) return {};
        struct stat s {};
        if (::stat(path.c_str(), &s) == 0) {
          if (S_ISCHR(s.st_mode) && major(s.st_rdev) == 1 && minor(s.st_rdev) == 3) return {};
          // Any other device, a FIFO, a socket: the file written over them replaced them (as root, /dev/null too).
          if (!S_ISREG(s.st_mode))
            return fmt::format(
                "{} is {}, not a file: expected a file to write (of the devices, /dev/null, /dev/stdout "
                "and /dev/stderr are taken, and written in place)",
                path, special_file_kind(s.st_mode));
          // A dataset, weights or a checkpoint's file: never an output's place (it was replaced, and the data lost).
          if (const std::string format = binary_format_of(path, static_cast<uint64_t>(s.st_size)); !format.empty())
            return fmt::format(
                "{} is {} (a dataset, weights or a checkpoint's file), which this output would replace: "
                "expected a new file, or a text file to write over",
                path, format);
        }
        if (const std::string checkpoint = checkpoint_holding(path); !checkpoint.empty())
          return in_checkpoint_problem(path, checkpoint);
        return {};
      },
      "FILE");
}

namespace {

// The ranks the model's state is sharded over.
int model_shard_ranks(const train::TrainConfig& config, int world, int local_size) {
  const auto& f = config.fsdp.engine;
  if (f.strategy == ShardingStrategy::NoShard) return 1;
  if (f.strategy == ShardingStrategy::HybridShard || f.strategy == ShardingStrategy::HybridShardZero2)
    return f.shard_size > 0 ? f.shard_size : local_size;
  return world;
}

}  // namespace

void check_model_fits(const train::TrainConfig& config, int world, int local_size, double device_bytes,
                      const std::string& device_name) {
  if (config.fsdp.engine.offload_params) return;  // the state lives in the nodes' host memory
  config.validate_memory(model_shard_ranks(config, world, local_size), device_bytes, device_name);
}

void check_model_fits(const train::TrainConfig& config, const Runtime& rt) {
  const Topology& t = rt.topology();
  const auto& f = config.fsdp.engine;
  const int shard_ranks = model_shard_ranks(config, t.world_size, t.local_size);
  const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const Device& d = rt.device();
  if (d.is_cuda() && !f.offload_params) {
    config.validate_memory(shard_ranks, static_cast<double>(d.memory_bytes) / std::max(d.ranks_sharing, 1),
                           fmt::format("{} ({} rank(s) on it)", d.describe(), d.ranks_sharing));
  } else {
    config.validate_memory(shard_ranks, host / std::max(t.local_size, 1),
                           fmt::format("host memory ({} over {} rank(s) on {})", format_bytes(static_cast<uint64_t>(host)),
                                       t.local_size, t.hostname));
  }
}

std::string resolve_recorded_path(const std::string& recorded, const std::string& anchor,
                                  const std::function<bool(const std::string&)>& is_it) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (recorded.empty() || fs::path(recorded).is_absolute()) return recorded;
  const auto fits = [&](const fs::path& p) {
    if (!fs::exists(p, ec)) return false;
    if (!is_it || is_it(p.string())) return true;
    // Once per job, not once per rank (the ranks' resolved paths are compared where it matters: evaluate).
    log::at(log::config().rank == 0 ? LogLevel::Warn : LogLevel::Info,
            "{}: not the {} that was recorded (its content differs); looking further", p.string(), recorded);
    return false;
  };
  if (fits(recorded)) return recorded;
  for (fs::path dir = fs::absolute(anchor, ec); !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / recorded;
    if (fits(candidate)) {
      log::info("{} (recorded relative to the folder its run started in) is {}", recorded, candidate.string());
      return candidate.string();
    }
    if (dir == dir.parent_path()) break;
  }
  return recorded;
}

std::function<bool(const std::string&)> is_recorded_tokenizer(const std::string& hash, const std::string& encoding_hash) {
  return [hash, encoding_hash](const std::string& path) {
    if (hash.empty()) return true;
    try {
      const data::Tokenizer t = data::Tokenizer::load(path);
      return data::same_tokenizer(t.hash(), t.encoding_hash(), hash, encoding_hash);
    } catch (const Error&) {
      return false;
    }
  };
}

void add_commands(CLI::App& app, std::vector<Command>& out) {
  out.push_back(add_env_command(app));
  out.push_back(add_train_command(app));
  out.push_back(add_check_command(app));
  out.push_back(add_evaluate_command(app));
  out.push_back(add_plan_command(app));
  out.push_back(add_predict_command(app));
  out.push_back(add_consolidate_command(app));
  out.push_back(add_checkpoint_command(app));
  out.push_back(add_generate_command(app));
  out.push_back(add_prepare_data_command(app));
  out.push_back(add_dataset_command(app));
  out.push_back(add_tokenizer_command(app));
  out.push_back(add_bench_command(app));
  out.push_back(add_parity_command(app));
  decimal_integers(app);
}

namespace {

// Leading zeros dropped ("010" is 10), a base prefix (0x, 0o, 0b) refused.
CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t at = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
        if (text.size() < at + 2 || text[at] != '0') return {};
        if (std::string_view("xXoObB").find(text[at + 1]) != std::string_view::npos)
          return fmt::format("{}: expected a decimal integer", text);
        const size_t digit = text.find_first_not_of('0', at);
        text.erase(at, (digit == std::string::npos ? text.size() - 1 : digit) - at);
        return {};
      },
      "", "decimal");
}

}  // namespace

void decimal_integers(CLI::App& app) {
  for (CLI::Option* option : app.get_options())
    if (const std::string type = option->get_type_name(); type.starts_with("INT") || type.starts_with("UINT"))
      option->transform(decimal_integer());  // the value's own type first, then its validators' descriptions
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) decimal_integers(*sub);
}

}  // namespace shardtrain::cli
