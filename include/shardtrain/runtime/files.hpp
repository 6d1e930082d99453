// Small files written whole or not at all (a run's config.toml and result.json, a command's --json).
#pragma once

#include <string>
#include <string_view>

namespace shardtrain {

// `text` into `path`: written to a name of this process's own (another file's "<path>.tmp" is never written over),
// flushed to disk, each call checked, then renamed over `path`. A full disk fails here with its reason and the old
// file keeps its name; through a stream, the last block's error surfaced only at close, after the check, and an empty
// file took the name. Throws IoError naming the file, `what` it holds and the file system's reason.
void write_file_whole(const std::string& path, std::string_view text, std::string_view what);

// The file system's reason for the call that just failed (errno: ENOSPC, EDQUOT, EFBIG...) as ": reason", or "" where
// it left none: for writers whose library keeps the reason to itself (a stream, HDF5's POSIX driver). Set errno to 0
// before the call.
std::string os_reason();

}  // namespace shardtrain
