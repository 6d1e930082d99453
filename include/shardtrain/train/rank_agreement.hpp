// Every rank of a run must train the same configuration on the same data. Ranks that resolved different ones (a
// config file edited between their reads, overrides that differ per rank, a node with another copy of a dataset)
// would issue different collectives and hang until the watchdog fires, or fail in MPI with a message about a
// call. So the ranks compare them at start, before any collective that depends on them (docs/cluster.md, "Ranks
// that disagree").
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/data/mixture.hpp"

namespace shardtrain::train {

// (key, value) pairs of a resolved configuration's TOML (to_toml): "optim.lr" -> "0.001".
std::vector<std::pair<std::string, std::string>> config_entries(const std::string& resolved_toml);

// Collective over `world`: compares every rank's entries with rank 0's by a checksum, and only when they differ
// looks for the first differing key. Returns "" when all agree; otherwise the same description on every rank:
// the first key that differs, its value on the lowest differing rank and on rank 0, and which ranks differ.
std::string first_disagreement(MPI_Comm world, const std::vector<std::pair<std::string, std::string>>& entries);

// The two checks a Trainer makes at start: the resolved configuration (throws ConfigError) and each data source's
// identity, data::TokenDataset::identity (throws DataError), on every rank alike.
void check_ranks_agree_on_config(MPI_Comm world, const std::string& resolved_toml);
void check_ranks_agree_on_data(MPI_Comm world, const std::vector<data::MixtureComponent>& sources);

// Collective over `world`: "" when no rank has an error, else the lowest failing rank's ("rank N: " before any but
// rank 0's), on every rank. For a failure that only some ranks meet (each read other parts of a file), so that all
// take the same branch after it.
std::string lowest_error(MPI_Comm world, int rank, const std::string& error);

// Collective: runs `body` on every rank. When it throws an Error on some of them, every rank throws the lowest failing
// rank's (its message and exit code) marked on_every_rank: one line from rank 0 instead of one per rank. When the
// other ranks did not fail (a file one node does not see), the message says which ranks failed, where the lowest of
// them runs, and `unlike` (what the ranks should have in common).
void agreed_outcome(MPI_Comm world, const std::function<void()>& body, const std::string& unlike);

// What a rank looks up on its own file system later (the checkpoints in a directory, the newest one) can differ per
// rank: a checkpoint.dir on node-local disks, a listing taken while a save publishes. Ranks that acted on their own
// answers entered different collectives (docs/cluster.md, "Ranks that disagree"), so rank 0 looks and every rank
// acts on its answer.
// Collective: rank 0's `look()` on every rank. An Error it throws there is thrown on every rank (rank 0's message,
// its exit code); on the other ranks `look` is not called.
std::vector<std::string> rank0_answer(MPI_Comm world, const std::function<std::vector<std::string>()>& look);

// Collective: throws CheckpointError on every rank when some rank does not see `checkpoint` as rank 0 does (complete,
// with its DONE marker, or not), naming the lowest such rank, its host and how many differ. `what` heads the message.
void check_ranks_see_checkpoint(MPI_Comm world, const std::string& checkpoint, const std::string& what);

}  // namespace shardtrain::train
