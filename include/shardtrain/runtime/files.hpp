// Small files written whole or not at all (a run's config.toml and result.json, a command's --json).
#pragma once

#include <string>
#include <string_view>

namespace shardtrain {

// `text` into `path`: written to a name of this process's own (another file's "<path>.tmp" is never written over),
// flushed to disk, each call checked, then renamed over `path`. A full disk fails here with its reason and the old
// file keeps its name; through a stream, the last block's error surfaced only at close, after the check, and an empty
// file took the name. Throws IoError naming the file, `what` it holds and the file system's reason.
// A path that is this process's standard output or error (/dev/stdout, /proc/self/fd/2, the terminal they print to),
// or that exists and is not a regular file (/dev/null, a pipe), is written in place: the rename replaced the device or
// the link itself (as root, the system's /dev/null became a regular file of JSON). Which such paths an option may name
// is its validator's to say (cli's output_file_check: /dev/null and the standard streams, no other device).
void write_file_whole(const std::string& path, std::string_view text, std::string_view what);

// 1 or 2 when `path` (links followed) is the file this process's standard output or error writes to (a terminal, a
// pipe, a file they were redirected to), else 0.
int standard_stream_at(const std::string& path);

// The file system's reason for the call that just failed (errno: ENOSPC, EDQUOT, EFBIG...) as ": reason", or "" where
// it left none: for writers whose library keeps the reason to itself (a stream, HDF5's POSIX driver). Set errno to 0
// before the call.
std::string os_reason();

}  // namespace shardtrain
