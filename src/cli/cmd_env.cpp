// `shardtrain env`: placeholder until the mesh layer lands (filled in below in this change).
#include "command.hpp"
namespace shardtrain::cli {
Command add_env_command(CLI::App& parent) {
  Command c;
  c.app = parent.add_subcommand("env", "print ranks, nodes, devices and the device mesh");
  c.launch = Launch::Mpi;
  c.run = [](Runtime* rt) { log::info("{} ranks", rt->topology().world_size); return 0; };
  return c;
}
}  // namespace shardtrain::cli
