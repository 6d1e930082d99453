// The list of subcommands, in the order `shardtrain --help` shows them, and what several share.
#include "command.hpp"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/log.hpp"
#include "shardtrain/runtime/progress.hpp"
#include "shardtrain/train/config.hpp"

namespace shardtrain::cli {

void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) throw IoError(fmt::format("{}: cannot write {}", tmp, what));
  }
  std::filesystem::rename(tmp, path);
}

void check_model_fits(const train::TrainConfig& config, const Runtime& rt) {
  const Topology& t = rt.topology();
  const auto& f = config.fsdp.engine;
  int shard_ranks = t.world_size;
  if (f.strategy == ShardingStrategy::NoShard) shard_ranks = 1;
  if (f.strategy == ShardingStrategy::HybridShard || f.strategy == ShardingStrategy::HybridShardZero2)
    shard_ranks = f.shard_size > 0 ? f.shard_size : t.local_size;
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

std::string resolve_recorded_path(const std::string& recorded, const std::string& anchor) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (recorded.empty() || fs::path(recorded).is_absolute() || fs::exists(recorded, ec)) return recorded;
  for (fs::path dir = fs::absolute(anchor, ec); !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / recorded;
    if (fs::exists(candidate, ec)) {
      log::info("{} (recorded relative to the folder its run started in) is {}", recorded, candidate.string());
      return candidate.string();
    }
    if (dir == dir.parent_path()) break;
  }
  return recorded;
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
}

}  // namespace shardtrain::cli
