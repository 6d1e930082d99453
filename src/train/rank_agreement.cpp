// Ranks comparing their resolved configuration and data at start (rank_agreement.hpp): one checksum all-reduce
// when they agree; when they do not, rank 0's entries go to every rank, each finds its first differing key, and
// the lowest differing rank's finding is the one every rank reports.
#include "shardtrain/train/rank_agreement.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <map>
#include <sstream>

#include "shardtrain/checkpoint/checkpoint.hpp"
#include "shardtrain/runtime/check.hpp"
#include "shardtrain/runtime/error.hpp"
#include "shardtrain/runtime/session.hpp"

namespace shardtrain::train {
namespace {

using Entries = std::vector<std::pair<std::string, std::string>>;

std::string serialize(const Entries& entries) {
  std::string out;
  for (const auto& [k, v] : entries) {
    out += k;
    out.push_back('\0');
    out += v;
    out.push_back('\n');
  }
  return out;
}

Entries deserialize(const std::string& text) {
  Entries out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t nul = text.find('\0', at), end = text.find('\n', nul);
    out.emplace_back(text.substr(at, nul - at), text.substr(nul + 1, end - nul - 1));
    at = end + 1;
  }
  return out;
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// This rank's first difference from rank 0's entries, "" when there is none.
std::string difference(const Entries& mine, const Entries& root, int rank) {
  std::map<std::string, std::string> theirs(root.begin(), root.end()), ours(mine.begin(), mine.end());
  for (const auto& [k, v] : mine) {
    const auto it = theirs.find(k);
    if (it == theirs.end()) return fmt::format("{} = {} on rank {}, absent on rank 0", k, v, rank);
    if (it->second != v) return fmt::format("{} = {} on rank {}, {} on rank 0", k, v, rank, it->second);
  }
  for (const auto& [k, v] : root)
    if (!ours.count(k)) return fmt::format("{} = {} on rank 0, absent on rank {}", k, v, rank);
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  if (ranks.size() > 16) out += fmt::format(" and {} more", ranks.size() - 16);
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> config_entries(const std::string& resolved_toml) {
  Entries out;
  std::istringstream in(resolved_toml);
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    out.emplace_back(section.empty() ? line.substr(0, eq) : section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

std::string first_disagreement(MPI_Comm world, const std::vector<std::pair<std::string, std::string>>& entries) {
  int rank = 0, size = 1;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  ST_CHECK_MPI(MPI_Comm_size(world, &size));
  const std::string mine = serialize(entries);
  const uint64_t h = fnv1a64(mine);
  uint64_t v[2] = {h, ~h};  // the minimum and (as ~min of ~h) the maximum at once
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MIN, world));
  if (v[0] == ~v[1]) return {};

  const std::string root = broadcast_text(world, 0, rank == 0 ? mine : std::string());
  const std::string found = rank == 0 ? std::string() : difference(entries, deserialize(root), rank);
  int differs = found.empty() ? 0 : 1;
  std::vector<int> flags(static_cast<size_t>(size));
  ST_CHECK_MPI(MPI_Allgather(&differs, 1, MPI_INT, flags.data(), 1, MPI_INT, world));
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r)
    if (flags[static_cast<size_t>(r)]) ranks.push_back(r);
  if (ranks.empty()) return {};  // equal entries, unequal checksums: cannot happen (one serialization)
  return fmt::format("{} (rank{} {} of {} differ{} from rank 0)", broadcast_text(world, ranks.front(), found),
                     ranks.size() == 1 ? "" : "s", rank_list(ranks), size, ranks.size() == 1 ? "s" : "");
}

void check_ranks_agree_on_config(MPI_Comm world, const std::string& resolved_toml) {
  const std::string d = first_disagreement(world, config_entries(resolved_toml));
  if (!d.empty())
    throw on_every_rank(ConfigError(
        fmt::format("the ranks resolved different configurations: {}; every rank must read the same config file and "
                    "overrides (was the file edited while the job started, or do the ranks' command lines differ?)",
                    d)));
}

void check_ranks_agree_on_data(MPI_Comm world, const std::vector<data::MixtureComponent>& sources) {
  Entries entries;
  for (size_t k = 0; k < sources.size(); ++k) {
    const std::string& path = sources[k].dataset->path();
    entries.emplace_back(
        sources.size() == 1 ? fmt::format("data.path ({})", path) : fmt::format("data.mixture source {} ({})", k, path),
        sources[k].dataset->identity());
  }
  const std::string d = first_disagreement(world, entries);
  if (!d.empty())
    throw on_every_rank(DataError(
        fmt::format("the ranks read different datasets: {}; every rank must read the same file (a node with another or a "
                    "partial copy?)",
                    d)));
}

void agreed_outcome(MPI_Comm world, const std::function<void()>& body, const std::string& unlike) {
  int rank = 0, size = 1;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  ST_CHECK_MPI(MPI_Comm_size(world, &size));
  int code = 0;
  std::string error;
  try {
    body();
  } catch (const Error& e) {
    code = static_cast<int>(e.code());
    error = e.what();
  }
  const int failed = code != 0 ? 1 : 0;
  std::vector<int> flags(static_cast<size_t>(size));
  ST_CHECK_MPI(MPI_Allgather(&failed, 1, MPI_INT, flags.data(), 1, MPI_INT, world));
  std::vector<int> ranks;
  for (int r = 0; r < size; ++r)
    if (flags[static_cast<size_t>(r)]) ranks.push_back(r);
  if (ranks.empty()) return;
  const int lowest = ranks.front();
  ST_CHECK_MPI(MPI_Bcast(&code, 1, MPI_INT, lowest, world));
  std::string text = broadcast_text(world, lowest, rank == lowest ? error : std::string());
  if (static_cast<int>(ranks.size()) < size) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string where = broadcast_text(world, lowest, rank == lowest ? std::string(host) : std::string());
    text = fmt::format("{} (on rank{} {} of {}, rank {} on {}; the other ranks{}: {})", text, ranks.size() == 1 ? "" : "s",
                       rank_list(ranks), size, lowest, where, lowest == 0 ? "" : ", rank 0 too, did not fail", unlike);
  }
  throw_typed(static_cast<ExitCode>(code), text, /*every_rank=*/true);
}

std::vector<std::string> rank0_answer(MPI_Comm world, const std::function<std::vector<std::string>()>& look) {
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  int code = 0;         // rank 0's exit code when `look` failed there
  std::string payload;  // the answer's strings, each ended by '\0'; or the error's message
  if (rank == 0) {
    try {
      for (const std::string& s : look()) payload += s + '\0';
    } catch (const Error& e) {
      code = static_cast<int>(e.code());
      payload = e.what();
    }
  }
  ST_CHECK_MPI(MPI_Bcast(&code, 1, MPI_INT, 0, world));
  payload = broadcast_text(world, 0, std::move(payload));
  if (code != 0) throw_typed(static_cast<ExitCode>(code), payload, /*every_rank=*/true);
  std::vector<std::string> out;
  for (size_t at = 0; at < payload.size();) {
    const size_t end = payload.find('\0', at);
    out.push_back(payload.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

void check_ranks_see_checkpoint(MPI_Comm world, const std::string& checkpoint, const std::string& what) {
  int rank = 0;
  ST_CHECK_MPI(MPI_Comm_rank(world, &rank));
  int complete = 0;
  try {
    complete = checkpoint::is_complete(checkpoint) ? 1 : 0;
  } catch (const std::exception&) {  // a folder this rank may not look into: it does not see the checkpoint
  }
  int on_rank0 = complete;
  ST_CHECK_MPI(MPI_Bcast(&on_rank0, 1, MPI_INT, 0, world));
  const int differs = complete != on_rank0 ? 1 : 0;
  int v[2] = {differs ? rank : INT_MAX, differs};  // the lowest differing rank, how many differ
  int lowest = v[0], count = v[1];
  ST_CHECK_MPI(MPI_Allreduce(&v[0], &lowest, 1, MPI_INT, MPI_MIN, world));
  ST_CHECK_MPI(MPI_Allreduce(&v[1], &count, 1, MPI_INT, MPI_SUM, world));
  if (count == 0) return;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string where = broadcast_text(world, lowest, rank == lowest ? std::string(host) : std::string());
  throw on_every_rank(CheckpointError(fmt::format(
      "{}: {} is {} on rank 0, but rank {} (on {}){} sees it {}: every rank must see the same checkpoints (is their "
      "directory on a node-local disk, such as /tmp or a local scratch, rather than a file system every node shares?)",
      what, checkpoint, on_rank0 ? "complete" : "not a complete checkpoint", lowest, where,
      count > 1 ? fmt::format(" and {} other rank(s)", count - 1) : std::string(),
      on_rank0 ? "missing or without its DONE marker" : "complete")));
}

std::string lowest_error(MPI_Comm world, int rank, const std::string& error) {
  int v[2] = {error.empty() ? 0 : -1, error.empty() ? INT_MAX : rank};
  ST_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT, MPI_MIN, world));
  if (v[0] == 0) return {};
  const std::string text = broadcast_text(world, v[1], rank == v[1] ? error : std::string());
  return v[1] == 0 ? text : fmt::format("rank {}: {}", v[1], text);
}

}  // namespace shardtrain::train
