// The `shardtrain bench` subcommands, one file each: model (cmd_bench.cpp), ops (cmd_bench_ops.cpp), step
// (cmd_bench_step.cpp), attention (cmd_bench_attention.cpp) and comm (cmd_bench_comm.cpp). `bench` is one MPI command
// (step and comm need the world; the others run as a single-rank singleton without mpirun), so each subcommand hands
// back how to run it.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "shardtrain/runtime/progress.hpp"  // format_bytes, shared with the rest
#include "shardtrain/runtime/runtime.hpp"

namespace shardtrain::cli {

struct BenchSubcommand {
  CLI::App* app = nullptr;
  std::function<int(Runtime*)> run;
};

BenchSubcommand add_bench_ops_command(CLI::App& bench);        // cmd_bench_ops.cpp
BenchSubcommand add_bench_step_command(CLI::App& bench);       // cmd_bench_step.cpp
BenchSubcommand add_bench_attention_command(CLI::App& bench);  // cmd_bench_attention.cpp
BenchSubcommand add_bench_comm_command(CLI::App& bench);       // cmd_bench_comm.cpp

// Writes `text` to `path` (a JSON document); throws IoError naming the path.
void write_text_file(const std::string& path, const std::string& text);

// "12.3 ms", "45.6 us", "1.23 s"
std::string format_seconds(double s);
// "312.4 TFLOP/s", "72.5 GFLOP/s"
std::string format_flops(double flops_per_s);

}  // namespace shardtrain::cli
