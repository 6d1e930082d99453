// The list of subcommands, in the order `shardtrain --help` shows them, and what several share.
#include "command.hpp"

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "shardtrain/runtime/error.hpp"

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

void add_commands(CLI::App& app, std::vector<Command>& out) {
  out.push_back(add_env_command(app));
  out.push_back(add_train_command(app));
  out.push_back(add_check_command(app));
  out.push_back(add_evaluate_command(app));
  out.push_back(add_plan_command(app));
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
