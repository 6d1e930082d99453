// The list of subcommands, in the order `shardtrain --help` shows them.
#include "command.hpp"

namespace shardtrain::cli {

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
