// The record a failing rank leaves in its run directory before the job is aborted, so that whatever
// restarts the run (jobs/slurm/lib.sh) knows what ended it and which node, if any, is to blame:
//   RUN_DIR/failures/rank_00001.json, one line of JSON:
//   {"exit_code":10,"kind":"collective timeout","rank":0,"node":"gpu017","step":12,"restartable":true,
//    "suspect_nodes":["gpu018"],"message":"..."}
// Records are written only once enable() has run (the trainer does, when the run directory exists), by
// each rank that logs the job's fatal error; writing never throws. enable() also installs handlers for
// SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT that write a "crash" record (naming the node only for a machine
// check, SIGBUS with BUS_MCEERR_AR/AO) and pass the signal on. docs/cluster.md, "Restarts after a failure".
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/runtime/error.hpp"

namespace shardtrain::failure_record {

// This rank's node as the scheduler names it: SLURMD_NODENAME under Slurm (srun or mpirun inside an
// allocation), else the host name. A job script excludes nodes by these names.
std::string node_name();

// Collective over `world`: gathers every rank's node name (so a rank can name the nodes of others), records
// that failures go to run_dir/failures/, and prepares the crash record and its signal handlers.
void enable(const std::string& run_dir, MPI_Comm world);
void disable();  // tests
// Records of this rank go to run_dir/failures/, naming only this rank's own node: for a failure before the others'
// names are gathered (main.cpp: the start's deadline, from MPI_Init on).
void enable_this_rank(const std::string& run_dir, int rank);
bool enabled();  // records are written (enable or enable_this_rank ran, disable did not since)

void set_step(int64_t step);  // the step in progress, written into records (-1: none yet)

// Whether a failure may go away on a restart (elsewhere): a communication error, a collective timeout, a
// device error other than running out of memory, or a checkpoint save that outlasted checkpoint.save_timeout.
// Out of memory, a full disk, bad input and bugs fail the same way again.
bool restartable(ExitCode code, const std::string& message);

// The nodes this failure points to: for a device error other than out of memory, this rank's node; for a
// collective timeout, the nodes of `suspect_ranks` (those that did not arrive or answer); otherwise none.
std::vector<std::string> suspects(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks);

// A file this process maps for reading (a dataset's tokens), until forget_mapped_file(handle): a SIGBUS inside the
// mapping is the file cut short under the run (truncated, or rewritten in place), and the crash handler says so, on
// stderr and in the record (not restartable, no suspect node), instead of "SIGBUS (bus error)".
int note_mapped_file(const void* begin, size_t bytes, const std::string& path);
void forget_mapped_file(int handle);

// Writes this rank's record (atomically: a temporary file, then rename). No-op before enable().
void write(ExitCode code, const std::string& message, const std::vector<int>& suspect_ranks = {});

}  // namespace shardtrain::failure_record
